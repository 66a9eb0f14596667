"""First look at the TMA-ring kernel on a GPU (before the sweep): a few configurations at a few row
counts and shapes, one call each, against float64, NaN-poisoned outputs; prints one line per case.

    python3 bench/gpu/tma_smoke.py
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
from stageml_torch import stream as st  # noqa: E402
from stageml_torch import tma  # noqa: E402


def one(cfg, m, n, k, bank, rank=16):
    x = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) / 64
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    if bank:
        s_ = 8
        ranks = torch.tensor([(8, 16, 64)[j % 3] for j in range(s_)], device="cuda", dtype=torch.int32)
        rmax = 64
        a = torch.randn((s_, rmax, k), device="cuda", dtype=torch.bfloat16) / 64
        b = torch.randn((s_, n, rmax), device="cuda", dtype=torch.bfloat16) / 4
        for j, r in enumerate(ranks.tolist()):
            a[j, r:] = 0
            b[j, :, r:] = 0
        scales = torch.tensor([2.0 if j % 2 == 0 else 1.0 for j in range(s_)], device="cuda")
        slots = torch.tensor([(3 * i + 1) % s_ for i in range(m)], device="cuda", dtype=torch.int32)
        if m > 2:
            slots[1] = -1
        got = st.lora_bank_linear(x, w, a, b, slots, ranks, scales, cfg=cfg, out=y)
        ref = x.double() @ w.double().t()
        for i, j in enumerate(slots.tolist()):
            if j >= 0:
                ref[i] += scales[j].item() * (x[i].double() @ a[j].double().t()) @ b[j].double().t()
    else:
        a = torch.randn((rank, k), device="cuda", dtype=torch.bfloat16) / 64
        b = torch.randn((n, rank), device="cuda", dtype=torch.bfloat16) / 4
        got = st.lora_linear(x, w, a, b, 2.0, cfg=cfg, out=y)
        ref = x.double() @ w.double().t() + 2.0 * (x.double() @ a.double().t()) @ b.double().t()
    torch.cuda.synchronize()
    if got is None:
        return "declined"
    err = float((y.double() - ref).norm() / ref.norm()) if torch.isfinite(y).all() else float("inf")
    t0 = time.time()
    for _ in range(3):
        (st.lora_bank_linear(x, w, a, b, slots, ranks, scales, cfg=cfg, out=y) if bank else st.lora_linear(x, w, a, b, 2.0, cfg=cfg, out=y))
    torch.cuda.synchronize()
    return "rel %.2e (3 calls %.0f us)" % (err, (time.time() - t0) * 1e6)


def chain(cfg, m, bank, calls=8):
    """Back-to-back launches where each call's x is the previous call's y (N = K = 4096): with
    programmatic dependent launch a call may start before the previous ends, so this checks the
    dependency wait. Each step against float64 on the kernel's own previous output."""
    n = k = 4096
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) / 64
    a = torch.randn((16, k), device="cuda", dtype=torch.bfloat16) / 64
    b = torch.randn((n, 16), device="cuda", dtype=torch.bfloat16) / 16
    ab, bb = a.unsqueeze(0).contiguous(), b.unsqueeze(0).contiguous()
    ranks = torch.tensor([16], device="cuda", dtype=torch.int32)
    scales = torch.tensor([1.0], device="cuda")
    slots = torch.zeros((m,), device="cuda", dtype=torch.int32)
    ys = [torch.randn((m, k), device="cuda", dtype=torch.bfloat16)] + [torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(calls)]
    for i in range(calls):
        if bank:
            st.lora_bank_linear(ys[i], w, ab, bb, slots, ranks, scales, cfg=cfg, out=ys[i + 1])
        else:
            st.lora_linear(ys[i], w, a, b, 1.0, cfg=cfg, out=ys[i + 1])
    torch.cuda.synchronize()
    worst = 0.0
    for i in range(calls):
        xd = ys[i].double()
        ref = xd @ w.double().t() + (xd @ a.double().t()) @ b.double().t()
        got = ys[i + 1].double()
        e = float((got - ref).norm() / ref.norm()) if torch.isfinite(got).all() else float("inf")
        worst = max(worst, e)
    return "chain of %d: worst rel %.2e" % (calls, worst)


def shipped():
    """The dispatch as the executor calls it (no configuration named): rows 1-32 on the bench's and
    the 8B decode's shapes, each checked; prints the compile/first-call time (NVRTC without cubins)."""
    for m, n, k in [(1, 4096, 4096), (7, 4096, 4096), (16, 4096, 4096), (32, 4096, 4096), (3, 14336, 4096), (12, 1024, 4096), (30, 4096, 14336)]:
        t0 = time.time()
        try:
            r = one(None, m, n, k, False)
        except Exception as ex:  # noqa: BLE001
            r = "%s: %s" % (type(ex).__name__, str(ex)[:200])
        print("shipped m=%d n=%d k=%d cfg %s: %s (%.1f s with the build)" % (m, n, k, st._pick(m, n, k, 16, False, None), r, time.time() - t0), flush=True)


def main():
    torch.manual_seed(1)
    if "--shipped" in sys.argv:
        print("tma available:", tma.available(), "cubin:", os.environ.get("STAGEML_TMA_CUBIN"), flush=True)
        return shipped()
    print("tma available:", tma.available(), "cubin:", os.environ.get("STAGEML_TMA_CUBIN"), flush=True)
    cases = [(("tma", 64, 1, 2, 8, 12, 0, 1), 1, 4096, 4096, False), (("tma", 64, 1, 2, 8, 12, 0, 1), 5, 4096, 4096, False),
             (("tma", 128, 1, 4, 64, 8, 0, 1), 64, 4096, 4096, False), (("tma", 64, 1, 2, 32, 12, 0, 1), 17, 4096, 4096, False),
             (("tma", 128, 1, 4, 64, 8, 0, 1), 61, 4096, 4096, False), (("tma", 256, 1, 8, 16, 4, 0, 2), 16, 4096, 4096, False),
             (tma.adapt(("tma", 64, 1, 2, 8, 12, 0, 1), 14336, 4096), 3, 14336, 4096, False),
             (tma.adapt(("tma", 64, 1, 2, 16, 12, 0, 1), 1024, 4096), 9, 1024, 4096, False),
             (tma.adapt(("tma", 64, 1, 2, 8, 12, 0, 1), 4096, 14336), 8, 4096, 14336, False),
             (("tma", 64, 2, 2, 32, 3, 64, 1), 32, 4096, 4096, True)]
    for cfg, m, n, k, bank in cases:
        try:
            r = one(cfg, m, n, k, bank)
        except Exception as ex:  # noqa: BLE001
            r = "%s: %s" % (type(ex).__name__, str(ex)[:200])
        print("smoke %s m=%d n=%d k=%d bank=%s: %s" % (cfg, m, n, k, bank, r), flush=True)
    for cfg, m, bank in [(("tma", 64, 1, 2, 8, 12, 0, 1), 1, False), (("tma", 128, 1, 4, 64, 8, 0, 1), 64, False), (("tma", 64, 2, 2, 32, 3, 64, 1), 32, True)]:
        for pdl in (True, False):
            tma.PDL[0] = pdl
            try:
                r = chain(cfg, m, bank)
            except Exception as ex:  # noqa: BLE001
                r = "%s: %s" % (type(ex).__name__, str(ex)[:200])
            print("smoke chain %s m=%d bank=%s pdl=%s: %s" % (cfg, m, bank, pdl, r), flush=True)
    tma.PDL[0] = True


if __name__ == "__main__":
    main()
