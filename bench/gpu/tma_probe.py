"""One or two launches of the TMA-ring kernel for the profilers (ncu, compute-sanitizer):

    python3 bench/gpu/tma_probe.py single ROWS            # the shipped dispatch, one adapter r16, 4096²
    python3 bench/gpu/tma_probe.py bank-packed            # the bank configuration that was wrong with two blocks
                                                          # per SM, with tma.ONE_PER_SM lifted (diagnosis only)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
from stageml_torch import stream as st  # noqa: E402
from stageml_torch import tma  # noqa: E402

N = K = 4096


def main():
    mode = sys.argv[1]
    torch.manual_seed(0)
    w = torch.randn((N, K), device="cuda", dtype=torch.bfloat16) / 64
    if mode == "single":
        m = int(sys.argv[2])
        x = torch.randn((m, K), device="cuda", dtype=torch.bfloat16)
        a = torch.randn((16, K), device="cuda", dtype=torch.bfloat16) / 64
        b = torch.randn((N, 16), device="cuda", dtype=torch.bfloat16) / 4
        for _ in range(2):
            y = st.lora_linear(x, w, a, b, 2.0)
        torch.cuda.synchronize()
        ref = x.double() @ w.double().t() + 2.0 * (x.double() @ a.double().t()) @ b.double().t()
        print("single %d cfg %s rel %.2e" % (m, st._pick(m, N, K, 16, False, None), float((y.double() - ref).norm() / ref.norm())))
    else:
        tma.ONE_PER_SM = 0
        m, s_, r = 32, 64, 16
        cfg = ("tma", 64, 1, 2, 32, 8, 64, 1)
        x = torch.randn((m, K), device="cuda", dtype=torch.bfloat16)
        ab = torch.randn((s_, r, K), device="cuda", dtype=torch.bfloat16) / 64
        bb = torch.zeros((s_, N, r), device="cuda", dtype=torch.bfloat16)
        ranks = torch.full((s_,), r, device="cuda", dtype=torch.int32)
        scales = torch.full((s_,), 2.0, device="cuda")
        slots = torch.arange(m, device="cuda", dtype=torch.int32)
        y = st.lora_bank_linear(x, w, ab, bb, slots, ranks, scales, cfg=cfg)
        torch.cuda.synchronize()
        ref = x.double() @ w.double().t()
        err = (y.double() - ref).norm(dim=0) / ref.norm(dim=0)
        bad = (err > 1e-2).nonzero().flatten().tolist()
        print("bank-packed cfg %s smem %d: rel %.2e, wrong output columns %d, first %s, column blocks of 32: %s" % (
            cfg, tma.smem_bytes(cfg, m, r), float((y.double() - ref).norm() / ref.norm()), len(bad), bad[:8], sorted(set(c // 32 for c in bad))[:40]))


if __name__ == "__main__":
    main()
