"""Builds the wgmma ring (lora_wg) and the shrink kernel ahead with nvcc for sm_90a, one cubin: every
configuration bench/gpu/splitk.py --sweep wg and bench/gpu/wg_smoke.py use, the dispatch tables'
lora_wg entries, each re-picked (tma.wg_adapt) for the Llama-3-8B decode shapes, and the shipped
lora_tma entries. Serial (one nvcc); reports spills. STAGEML_TMA_CUBIN=OUT/lora_wg.cubin.

    /usr/bin/python3 bench/gpu/build_wg.py OUTDIR
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
from stageml_torch import stream as st  # noqa: E402
from stageml_torch import tma  # noqa: E402

SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]
# bench/gpu/splitk.py's WGX_EXTRA and CL_SWEEP (WR, RG, UNR, CL, LDW per MT), kept in step by hand
WGX_EXTRA = [("wg", 128, 2, 64, 8, 0), ("wg", 128, 2, 64, 6, 0), ("wg", 64, 1, 64, 10, 0), ("wg", 128, 2, 32, 10, 0), ("wg", 64, 1, 32, 12, 0)]
CL_SWEEP = {
    1: [(1, 8, 2, 8, 0), (1, 8, 4, 8, 0), (1, 4, 4, 8, 0), (1, 4, 2, 4, 0)],
    2: [(1, 8, 2, 8, 0), (1, 8, 4, 8, 0), (1, 4, 4, 8, 0), (1, 4, 2, 4, 0)],
    4: [(1, 8, 2, 8, 0), (1, 8, 4, 8, 0), (1, 4, 2, 8, 0), (2, 4, 2, 8, 0)],
    8: [(1, 8, 2, 8, 0), (1, 8, 1, 8, 0), (1, 4, 2, 8, 0), (2, 4, 1, 8, 0), (1, 8, 2, 4, 0)],
}


def configs():
    wg = set()
    for m in (1, 16, 32, 64, 128):
        wg.update((c, 16) for c in tma.wg_sweep(m, False, 16))
        wg.update((c, 64) for c in tma.wg_sweep(m, True, 64))
    wg.update((c, 16) for c in WGX_EXTRA)
    wg.update([(("wg", 64, 2, 64, 10, 0), 8), (("wg", 64, 2, 64, 8, 0), 32), (("wg", 64, 2, 64, 8, 0), 64), (("wg", 64, 2, 128, 7, 4), 64)])
    for table, rm in ((st.DEFAULT, 16), (st.DEFAULT_BANK, 64)):
        wg.update((c, rm) for c in table.values() if tma.is_wg(c))
    for c, r in list(wg):
        for n, k in SHAPES:
            a = tma.wg_adapt(c, n, k)
            if a is not None and tma.wg_fits_registers(a):
                wg.add((a, r))
    old = set()
    for c in list(st.DEFAULT.values()) + [("tma", 64, 1, 2, 8, 12, 0, 1)]:  # and the 1-8 row entry shipped before lora_wg
        if tma.is_tma(c):
            for n, k in SHAPES:
                a = tma.adapt(c, n, k)
                if a is not None:
                    old.add((a, 16))
    return sorted(wg, key=lambda p: tma.wg_instantiation(*p)), sorted(old, key=lambda p: tma.instantiation(*p))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    wg, old = configs()
    cu = os.path.join(out, "lora_wg.cu")
    with open(cu, "w") as fh:
        fh.write(open(tma._SRC).read() + "\n" + tma.wg_explicit_instantiations(wg) + tma.explicit_instantiations(old))
    cub = os.path.join(out, "lora_wg.cubin")
    r = subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-std=c++17", "-Xptxas", "-v", "-o", cub, cu],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    bad = 0 if r.returncode == 0 else 1
    if bad:
        print(r.stdout[-4000:])
    for line in r.stdout.splitlines():
        if ("spill" in line and " 0 bytes spill stores" not in line) or "C75" in line or "stack frame" in line and not line.strip().startswith("0 bytes"):
            print("WARN:", line)
            bad += 1
    print("%d wg + %d tma instantiations: %s" % (len(set(tma.wg_instantiation(*p) for p in wg)), len(old), cub))
    if "--stream" in sys.argv:
        # the streaming kernels the bank bench and the decode step compare against (LDW 0): the
        # shipped table's and splitk.py's cluster sweep (CL_SWEEP) at 1-64 rows
        cfgs = {c for c in st.DEFAULT_BANK.values() if not (tma.is_tma(c) or tma.is_wg(c) or tma.is_sx(c))} | {(1, 1, 8, 1, 2, 0)}
        for mt, rows in CL_SWEEP.items():
            cfgs.update(("cl", wr, rg, mt, unr, cl, ldw) for wr, rg, unr, cl, ldw in rows)
        scu = os.path.join(out, "lora_stream_0.cu")
        with open(scu, "w") as fh:
            fh.write("#define LDW_VARIANT 0\n" + open(st._SRC).read() + "\n" + st.explicit_instantiations(sorted(cfgs, key=str)))
        r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-std=c++17", "-o", os.path.join(out, "lora_stream_0.cubin"), scu],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print("%d stream instantiations: rc %d %s" % (len(cfgs), r.returncode, r.stdout[-2000:]))
        bad += r.returncode != 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
