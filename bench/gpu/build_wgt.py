"""Builds lora_wgt (native/stageml_torch/lora_tma.cu) ahead with nvcc for sm_90a, one cubin: every
configuration bench/gpu/wgt.py measures (tma.wgt_sweep at ranks 16 and 64), the dispatch tables'
lora_wgt entries (DEFAULT, DEFAULT_HIGH_RANK), and each re-picked (tma.wgt_adapt) for the Llama-3-8B decode shapes. Fails on
any spill or stack frame (nvcc -Xptxas -v). STAGEML_TMA_CUBIN=OUTDIR/lora_wgt.cubin.

    /usr/bin/python3 bench/gpu/build_wgt.py OUTDIR
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
from stageml_torch import stream as st  # noqa: E402
from stageml_torch import tma  # noqa: E402

SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]


def configs():
    cfgs = set()
    for m in (8, 16, 32, 64):
        for r in (16, 64):
            cfgs.update(tma.wgt_sweep(m, r))
    cfgs.update(c for table in (st.DEFAULT, st.DEFAULT_HIGH_RANK) for c in table.values() if tma.is_wgt(c))
    for c in list(cfgs):
        for n, k in SHAPES:
            a = tma.wgt_adapt(c, n, k)
            if a is not None:
                cfgs.add(a)
    return sorted(cfgs)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    cfgs = configs()
    cu = os.path.join(out, "lora_wgt.cu")
    with open(cu, "w") as fh:
        fh.write(open(tma._SRC).read() + "\n" + tma.wgt_explicit_instantiations(cfgs))
    cub = os.path.join(out, "lora_wgt.cubin")
    r = subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-std=c++17", "-Xptxas", "-v", "-o", cub, cu],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    bad = 0 if r.returncode == 0 else 1
    if bad:
        print(r.stdout[-4000:])
    name = None
    for line in r.stdout.splitlines():
        if "Compiling entry function" in line:
            name = line.split("'")[1]
        if ("spill" in line and " 0 bytes spill stores" not in line) or ("stack frame" in line and not line.strip().startswith("0 bytes")):
            print("WARN:", name, line.strip())
            bad += 1
    print("%d lora_wgt instantiations: %s (%s)" % (len(cfgs), cub, "ok" if not bad else "%d problems" % bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
