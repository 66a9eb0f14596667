"""Builds the TMA-ring kernel (native/stageml_torch/lora_tma.cu) ahead with nvcc for sm_90a: every
configuration bench/gpu/splitk.py --sweep tma measures, the dispatch tables' entries, and each of
those re-picked (tma.adapt) for the Llama-3-8B decode shapes, split over PARTS cubins compiled in
parallel. STAGEML_TMA_CUBIN=part0.cubin:part1.cubin:... makes stream.py load them instead of NVRTC.

    /usr/bin/python3 bench/gpu/build_tma.py OUTDIR [PARTS]
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
from stageml_torch import stream as st  # noqa: E402
from stageml_torch import tma  # noqa: E402

SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]


def configs():
    """(configuration, FA[, PRE]) tuples: one adapter carries FA = its rank padded to 16 (r16 swept;
    the single table's entries also for r32 and r64), banks FA = 0; PRE 1 for the pre-tiled W."""
    pairs = set()
    for m in (1, 16, 32, 64, 128, 256):
        pairs.update((c, 16) for c in tma.sweep(m, False))
        pairs.update((c, 0) for c in tma.sweep(m, True))
    pairs.update((c, fa) for c in st.DEFAULT.values() if tma.is_tma(c) for fa in (16, 32, 64))
    pairs.update((c, 0) for c in st.DEFAULT_BANK.values() if tma.is_tma(c))
    for c, fa in list(pairs):
        for n, k in SHAPES:
            a = tma.adapt(c, n, k)
            if a is not None:
                pairs.add((a, fa))
    pairs.update((c, 16, 1) for m in (1, 16, 32, 64) for c in tma.sweep(m, False))  # pre-tiled W (--pretile)
    return sorted((p for p in pairs if tma.fits_registers(*p[:2])), key=lambda p: tma.instantiation(*p))


def main():
    out = sys.argv[1]
    parts = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    os.makedirs(out, exist_ok=True)
    src = open(tma._SRC).read()
    cfgs = configs()
    procs, paths = [], []
    for p in range(parts):
        mine = cfgs[p::parts]
        cu = os.path.join(out, "lora_tma_%d.cu" % p)
        with open(cu, "w") as fh:
            fh.write(src + "\n" + tma.explicit_instantiations(mine))
        cub = os.path.join(out, "lora_tma_%d.cubin" % p)
        paths.append(cub)
        procs.append(subprocess.Popen(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-std=c++17", "-Xptxas", "-v", "-o", cub, cu],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    bad = 0
    for pr in procs:
        log = pr.communicate()[0]
        if pr.returncode != 0:
            print(log)
            bad += 1
        for line in log.splitlines():
            if "spill" in line and " 0 bytes spill stores" not in line:
                print("SPILL:", line)
                bad += 1
    print("%d configurations in %d cubins: %s" % (len(cfgs), parts, ":".join(paths)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
