"""First look at the wgmma ring (lora_wg in native/stageml_torch/lora_tma.cu) on a GPU: configurations
at awkward row counts, shapes and ranks (one adapter and 64-adapter banks with ranks 8/16/64 and
rows without an adapter), one call each against float64 with NaN-poisoned outputs, and chains of 8
launches where each call's x is the previous call's y (PDL on and off). One line per case.

    python3 bench/gpu/wg_smoke.py [--nvrtc | --shipped | --side | --xl]
    (--nvrtc: a few cases, for a run without cubins; --shipped: the dispatch as the executor calls it,
    no configuration named, at the bench's and the Llama-3-8B decode's shapes, with the build time)
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
from stageml_torch import stream as st  # noqa: E402
from stageml_torch import tma  # noqa: E402
from tma_smoke import chain  # noqa: E402


def bank_case(cfg, m, n, k, s_=64, ranks_cycle=(8, 16, 64), with_t=False):
    ranks = torch.tensor([ranks_cycle[j % len(ranks_cycle)] for j in range(s_)], device="cuda", dtype=torch.int32)
    rmax = max(ranks_cycle)
    x = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) / 64
    a = torch.randn((s_, rmax, k), device="cuda", dtype=torch.bfloat16) / 64
    b = torch.randn((s_, n, rmax), device="cuda", dtype=torch.bfloat16) / 4
    for j, r in enumerate(ranks.tolist()):
        a[j, r:] = 0
        b[j, :, r:] = 0
    scales = torch.tensor([2.0 if j % 2 == 0 else 1.0 for j in range(s_)], device="cuda")
    slots = torch.tensor([(5 * i + 3) % s_ for i in range(m)], device="cuda", dtype=torch.int32)
    if m > 2:
        slots[1] = -1
        slots[m - 1] = slots[0]
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = st.lora_bank_linear(x, w, a, b, slots, ranks, scales, cfg=cfg, out=y, b_bank_t=b.transpose(1, 2).contiguous() if with_t else None)
    torch.cuda.synchronize()
    if got is None:
        return "declined"
    ref = x.double() @ w.double().t()
    lora = torch.zeros_like(ref)
    for i, j in enumerate(slots.tolist()):
        if j >= 0:
            lora[i] = scales[j].item() * (x[i].double() @ a[j].double().t()) @ b[j].double().t()
    ref += lora
    err = float((y.double() - ref).norm() / ref.norm()) if torch.isfinite(y).all() else float("inf")
    # the LoRA part alone must be right too (it is ~1/4 of y here): y - base against the float64 term
    lerr = float(((y.double() - x.double() @ w.double().t()) - lora).norm() / lora.norm()) if torch.isfinite(y).all() else float("inf")
    return "rel %.2e (lora part %.2e)" % (err, lerr)


def single_case(cfg, m, n, k, rank):
    x = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) / 64
    a = torch.randn((rank, k), device="cuda", dtype=torch.bfloat16) / 64
    b = torch.randn((n, rank), device="cuda", dtype=torch.bfloat16) / 4
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = st.lora_linear(x, w, a, b, 2.0, cfg=cfg, out=y)
    torch.cuda.synchronize()
    if got is None:
        return "declined"
    base = x.double() @ w.double().t()
    lora = 2.0 * (x.double() @ a.double().t()) @ b.double().t()
    ref = base + lora
    err = float((y.double() - ref).norm() / ref.norm()) if torch.isfinite(y).all() else float("inf")
    lerr = float(((y.double() - base) - lora).norm() / lora.norm()) if torch.isfinite(y).all() else float("inf")
    return "rel %.2e (lora part %.2e)" % (err, lerr)


def run(label, fn, *args):
    t0 = time.time()
    try:
        r = fn(*args)
    except Exception as ex:  # noqa: BLE001
        r = "%s: %s" % (type(ex).__name__, str(ex)[:300])
    print("%s %s: %s (%.1f s)" % (label, args, r, time.time() - t0), flush=True)


def shipped():
    for m, n, k in [(1, 4096, 4096), (7, 1024, 4096), (16, 4096, 4096), (32, 14336, 4096), (64, 4096, 4096), (100, 4096, 4096), (128, 4096, 14336)]:
        print("shipped one adapter m=%d n=%d k=%d cfg %s" % (m, n, k, st._pick(m, n, k, 16, False, None)), flush=True)
        run("shipped single", single_case, None, m, n, k, 16)
    # compute-bound rows (cuBLAS + the LoRA term written first, "cx"), ranks 8/16/64
    for m, n, k, rank in [(129, 4096, 4096, 16), (300, 14336, 4096, 8), (1000, 1024, 4096, 64), (2048, 4096, 14336, 16), (4096, 4096, 4096, 64)]:
        print("shipped one adapter m=%d n=%d k=%d r=%d cfg %s" % (m, n, k, rank, st._pick(m, n, k, rank, False, None)), flush=True)
        run("shipped single", single_case, None, m, n, k, rank)
    for m, n, k in [(1, 4096, 4096), (16, 4096, 4096), (17, 1024, 4096), (32, 14336, 4096), (64, 4096, 14336), (64, 4096, 4096)]:
        print("shipped bank m=%d n=%d k=%d cfg %s" % (m, n, k, st._pick(m, n, k, 64, True, None)), flush=True)
        run("shipped bank", bank_case, None, m, n, k)
        # the factors also stored [S, R, N] (b_bank_t: lora_expand4, and sx at 9-16 rows for ranks above 16)
        run("shipped bank b_bank_t", bank_case, None, m, n, k, 64, (8, 16, 64), True)
    # narrow banks (ranks <= 16: the expand beside the GEMM without b_bank_t too)
    for m, n, k in [(12, 4096, 4096), (32, 1024, 4096), (64, 14336, 4096)]:
        run("shipped bank r16", bank_case, None, m, n, k, 64, (16,))
        run("shipped bank r8 b_bank_t", bank_case, None, m, n, k, 64, (8,), True)


def main():
    torch.manual_seed(3)
    print("tma available:", tma.available(), "cubin:", os.environ.get("STAGEML_TMA_CUBIN"), flush=True)
    if "--shipped" in sys.argv:
        return shipped()
    if "--xl" in sys.argv:  # lora_wg with x through cp.async (XL = 1) only
        for cfg, m, n, k, rank in [(("wg", 64, 2, 8, 12, 0, 1), 1, 4096, 4096, 16), (("wg", 64, 2, 16, 10, 0, 1), 13, 4096, 4096, 16),
                                   (("wg", 64, 2, 32, 10, 0, 1), 32, 4096, 4096, 16), (("wg", 64, 2, 64, 8, 0, 1), 64, 4096, 4096, 16),
                                   (("wg", 64, 2, 64, 8, 0, 1), 37, 4096, 4096, 64), (tma.wg_adapt(("wg", 64, 2, 64, 8, 0, 1), 1024, 4096), 60, 1024, 4096, 16),
                                   (tma.wg_adapt(("wg", 64, 2, 32, 10, 0, 1), 14336, 4096), 30, 14336, 4096, 16),
                                   (("wg", 64, 2, 64, 8, 0, 1), 64, 4096, 14336, 8), (("wg", 64, 2, 128, 6, 0, 1), 100, 4096, 4096, 16)]:
            run("single", single_case, cfg, m, n, k, rank)
        for cfg, m, n, k in [(("wg", 64, 2, 64, 8, 4, 1), 64, 4096, 4096), (("wg", 64, 2, 16, 8, 4, 1), 9, 4096, 4096)]:
            run("bank", bank_case, cfg, m, n, k)
        for cfg, m, bank in [(("wg", 64, 2, 64, 8, 0, 1), 64, False), (("wg", 64, 2, 8, 12, 0, 1), 3, False), (("wg", 64, 2, 64, 8, 4, 1), 64, True)]:
            for pdl in (True, False):
                tma.PDL[0] = pdl
                run("chain pdl=%s" % pdl, chain, cfg, m, bank)
        tma.PDL[0] = True
        return
    if "--side" in sys.argv:  # the SIDE = 1 form of the shrink/expand path only
        for cfg, m, n, k, rank in [(("sx", 8, 128, 1), 64, 4096, 4096, 16), (("sx", 32, 128, 1), 100, 4096, 14336, 64)]:
            run("single", single_case, cfg, m, n, k, rank)
        for cfg, m, n, k in [(("sx", 8, 128, 1), 64, 4096, 4096), (("sx", 32, 128, 1), 37, 14336, 4096), (("sx", 8, 128, 1), 256, 1024, 4096)]:
            run("bank", bank_case, cfg, m, n, k)
        for cfg, m, bank in [(("sx", 8, 128, 1), 64, True), (("sx", 32, 128, 1), 64, False)]:
            for pdl in (True, False):
                tma.PDL[0] = pdl
                run("chain pdl=%s" % pdl, chain, cfg, m, bank)
        tma.PDL[0] = True
        return
    if "--nvrtc" in sys.argv:
        import traceback  # noqa: PLC0415

        for what, fn in (("wg", lambda: tma.wg_function(("wg", 64, 2, 64, 10, 0), 16)), ("shrink", lambda: tma._shrink_fn(32)), ("expand", lambda: tma._expand_fn(256))):
            t0 = time.time()
            try:
                print("nvrtc %s: handle %s (%.1f s)" % (what, fn(), time.time() - t0), flush=True)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        run("single", single_case, ("wg", 64, 2, 64, 10, 0), 64, 4096, 4096, 16)
        run("bank", bank_case, ("wg", 64, 2, 64, 10, 4), 64, 4096, 4096)
        run("bank", bank_case, ("sx", 32, 256), 64, 4096, 4096)
        return
    for cfg, m, n, k, rank in [(("wg", 64, 2, 8, 12, 0), 1, 4096, 4096, 16), (("wg", 64, 2, 16, 12, 0), 13, 4096, 4096, 16),
                               (("wg", 64, 2, 32, 12, 0), 32, 4096, 4096, 16), (("wg", 64, 2, 64, 10, 0), 64, 4096, 4096, 16),
                               (("wg", 64, 2, 64, 10, 0), 37, 4096, 4096, 16), (("wg", 128, 4, 64, 8, 0), 64, 4096, 4096, 16),
                               (("wg", 64, 2, 128, 8, 0), 100, 4096, 4096, 16), (("wg", 64, 2, 64, 10, 0), 64, 4096, 4096, 8),
                               (("wg", 64, 2, 64, 8, 0), 50, 4096, 4096, 32), (("wg", 64, 2, 64, 8, 0), 64, 4096, 4096, 64),
                               (tma.wg_adapt(("wg", 64, 2, 64, 10, 0), 1024, 4096), 60, 1024, 4096, 16),
                               (tma.wg_adapt(("wg", 64, 2, 64, 10, 0), 14336, 4096), 64, 14336, 4096, 16),
                               (tma.wg_adapt(("wg", 64, 2, 64, 10, 0), 4096, 14336), 64, 4096, 14336, 16)]:
        run("single", single_case, cfg, m, n, k, rank)
    for cfg, m, n, k in [(("wg", 64, 2, 16, 10, 4), 16, 4096, 4096), (("wg", 64, 2, 32, 10, 4), 29, 4096, 4096),
                         (("wg", 64, 2, 64, 10, 4), 64, 4096, 4096), (("wg", 64, 2, 64, 10, 2), 64, 4096, 4096),
                         (("wg", 128, 4, 64, 6, 4), 64, 4096, 4096), (("wg", 64, 2, 128, 7, 4), 128, 4096, 4096),
                         (("wg", 64, 2, 128, 7, 4), 77, 4096, 4096), (("wg", 64, 2, 8, 10, 4), 3, 4096, 4096),
                         (tma.wg_adapt(("wg", 64, 2, 64, 10, 4), 1024, 4096), 64, 1024, 4096),
                         (tma.wg_adapt(("wg", 64, 2, 64, 10, 4), 14336, 4096), 64, 14336, 4096),
                         (tma.wg_adapt(("wg", 64, 2, 64, 10, 4), 4096, 14336), 64, 4096, 14336)]:
        run("bank", bank_case, cfg, m, n, k)
    for cfg, m, n, k, rank in [(("sx", 32, 256), 64, 4096, 4096, 16), (("sx", 8, 256), 33, 4096, 4096, 16), (("sx", 32, 128), 64, 1024, 4096, 64),
                               (("sx", 32, 256), 64, 4096, 14336, 8), (("sx", 32, 256), 5, 14336, 4096, 16)]:
        run("single", single_case, cfg, m, n, k, rank)
    for cfg, m, n, k in [(("sx", 32, 256), 64, 4096, 4096), (("sx", 32, 256), 256, 4096, 4096), (("sx", 8, 256), 37, 4096, 4096), (("sx", 8, 128), 64, 4096, 4096), (("sx", 8, 128), 16, 4096, 14336),
                         (("sx", 32, 128), 64, 1024, 4096), (("sx", 32, 256), 64, 14336, 4096), (("sx", 32, 256), 64, 4096, 14336), (("sx", 32, 256), 1, 4096, 4096)]:
        run("bank", bank_case, cfg, m, n, k)
    for cfg, m, bank in [(("sx", 32, 256), 64, False), (("sx", 32, 256), 64, True), (("sx", 32, 256), 200, True), (("wg", 64, 2, 64, 10, 0), 64, False), (("wg", 64, 2, 32, 12, 0), 20, False), (("wg", 64, 2, 64, 10, 4), 64, True),
                         (("wg", 64, 2, 128, 7, 4), 128, True)]:
        for pdl in (True, False):
            tma.PDL[0] = pdl
            run("chain pdl=%s" % pdl, chain, cfg, m, bank)
    tma.PDL[0] = True


if __name__ == "__main__":
    main()
