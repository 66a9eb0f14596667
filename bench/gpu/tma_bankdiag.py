"""Where the TMA ring's bank path goes wrong (bench/results/gpu-kernels.md): repeated launches of one
bank configuration on fresh inputs; per wrong row, the shrink t recovered from y (least squares on
the row's B_j) against float64, and the K chunks whose partial shrinks explain the difference
(coefficient -1: a chunk missing, +1: added twice). Also the base part alone (B = 0).

    python3 bench/gpu/tma_bankdiag.py [--cfg tma,64,1,2,32,8,64,1] [--rows 32] [--reps 12]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
from stageml_torch import stream as st  # noqa: E402
from stageml_torch import tma  # noqa: E402

N = K = 4096


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cfg", default="tma,64,1,2,32,8,64,1")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--pdl", type=int, default=1)
    ap.add_argument("--smem-min", type=int, default=0, help="at least this much dynamic shared memory per block (1 block per SM from 116 KB)")
    a = ap.parse_args()
    if a.smem_min:
        orig = tma.smem_bytes
        tma.smem_bytes = lambda *args, **kw: max(orig(*args, **kw), a.smem_min)
    cfg = tuple([a.cfg.split(",")[0]] + [int(v) for v in a.cfg.split(",")[1:]])
    tma.PDL[0] = bool(a.pdl)
    m, s_, r = a.rows, 64, 16
    torch.manual_seed(3)
    fa, pieces, kch, n_prod, n_cons, threads, smem = tma.geometry(cfg, m, N, K, r, 1, True)
    print("smem-min %d" % a.smem_min, flush=True)
    print("cfg %s rows %d: pieces %d kch %d n_prod %d n_cons %d threads %d smem %d pdl %d" % (cfg, m, pieces, kch, n_prod, n_cons, threads, smem, a.pdl), flush=True)
    w = torch.randn((N, K), device="cuda", dtype=torch.bfloat16) / 64
    ab = torch.randn((s_, r, K), device="cuda", dtype=torch.bfloat16) / 64
    bb = torch.randn((s_, N, r), device="cuda", dtype=torch.bfloat16) / 4
    ranks = torch.full((s_,), r, device="cuda", dtype=torch.int32)
    scales = torch.full((s_,), 2.0, device="cuda")
    bad_runs = 0
    for rep in range(a.reps):
        x = torch.randn((m, K), device="cuda", dtype=torch.bfloat16)
        slots = torch.tensor([(j + 7 * rep) % s_ for j in range(m)], device="cuda", dtype=torch.int32)
        y = torch.full((m, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        zero_b = rep % 4 == 3
        b_use = torch.zeros_like(bb) if zero_b else bb
        st.lora_bank_linear(x, w, ab, b_use, slots, ranks, scales, cfg=cfg, out=y)
        torch.cuda.synchronize()
        xd = x.double()
        base = xd @ w.double().t()
        sl = slots.tolist()
        t_ref = torch.stack([ab[j].double() @ xd[i] for i, j in enumerate(sl)])
        ref = base.clone()
        if not zero_b:
            for i, j in enumerate(sl):
                ref[i] += 2.0 * bb[j].double() @ t_ref[i]
        yd = y.double()
        err = float((yd - ref).norm() / ref.norm()) if torch.isfinite(yd).all() else float("inf")
        row_err = ((yd - ref).norm(dim=1) / ref.norm(dim=1)).tolist()
        wrong = [i for i, e in enumerate(row_err) if e > 1e-2]
        print("rep %d%s: rel %.2e, rows wrong %d %s" % (rep, " (B = 0: base only)" if zero_b else "", err, len(wrong), wrong[:12]), flush=True)
        if wrong:
            bad_runs += 1
        for i in wrong[:4]:
            if zero_b:
                continue
            j = sl[i]
            bj = bb[j].double()
            t_hat = torch.linalg.lstsq(bj, ((yd[i] - base[i]) / 2.0).unsqueeze(1)).solution.squeeze(1)
            kper = K // kch
            chunks = torch.stack([ab[j][:, c * kper:(c + 1) * kper].double() @ xd[i, c * kper:(c + 1) * kper] for c in range(kch)], 1)  # [r, kch]
            coef = torch.linalg.lstsq(chunks, (t_hat - t_ref[i]).unsqueeze(1)).solution.squeeze(1)
            resid = float((chunks @ coef - (t_hat - t_ref[i])).norm() / max(1e-30, float((t_hat - t_ref[i]).norm())))
            print("   row %d (adapter %d): t rel err %.2e; chunk coefficients %s (residual %.2f)" % (
                i, j, float((t_hat - t_ref[i]).norm() / t_ref[i].norm()), [round(float(c), 2) for c in coef], resid), flush=True)
    print("bad runs %d of %d" % (bad_runs, a.reps), flush=True)


if __name__ == "__main__":
    main()
