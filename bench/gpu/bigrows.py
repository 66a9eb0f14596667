"""Fused base + LoRA at compute-bound row counts (512-4096 rows, 4096², bf16, one adapter, r16 / r64)
against cuBLAS's base GEMM alone: native/stageml_torch/big.py's overlapped compositions (cuBLAS +
lora_lowrank on a side stream, chunked), its serial forms, the pieces alone, the torch-ops fallback
and the earlier cuBLAS compositions. One device call:

    python3 bench/gpu/bigrows.py --out big.json [--rows 512,1024,2048,4096] [--ranks 16,64] [--quick]

Correctness: ‖y − ref‖/‖ref‖ against an f32 reference (no tf32) on every operand set, outputs
NaN-poisoned first, bound 1e-2, checked again after the timed replays (poisoned before them).
Times: µs per call, CUDA-graph replay of back-to-back calls over 4 operand sets (past the 60 MB L2),
median of the replays; `eager` rows time the same calls without a graph (stream priorities)."""
import argparse
import json
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
from stageml_torch import big  # noqa: E402
from stageml_torch import stream as st  # noqa: E402

N = K = 4096
LIGHT = [False]
SCALE = 2.0
SETS = 4
T0 = time.time()
torch.backends.cuda.matmul.allow_tf32 = False


def rnd(g, *shape, scale=1.0):
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(torch.bfloat16)


def timed(fn, reps, graph=True):
    for i in range(SETS):
        fn(i)
    torch.cuda.synchronize()
    if graph:
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            for i in range(SETS):
                fn(i)
        gr.replay()
        torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        if graph:
            gr.replay()
        else:
            for i in range(SETS):
                fn(i)
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000.0 / SETS)
    ts.sort()
    return ts[len(ts) // 2], ts, (gr if graph else None)


def rel_errs(outs, refs):
    e = []
    for o, r in zip(outs, refs):
        d = o.float() - r
        v = float(d.norm() / r.norm())
        e.append(v if v == v else float("inf"))
    return max(e)


class Case:
    def __init__(self, m, rank, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.m, self.rank = m, rank
        self.xs = [rnd(g, m, K) for _ in range(SETS)]
        self.ws = [rnd(g, N, K, scale=K ** -0.5) for _ in range(SETS)]
        self.As = [rnd(g, rank, K, scale=K ** -0.5) for _ in range(SETS)]
        self.Bs = [rnd(g, N, rank, scale=rank ** -0.5) for _ in range(SETS)]
        self.outs = [torch.empty((m, N), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
        self.refs = []
        for i in range(SETS):
            x, w, a, b = (t.float() for t in (self.xs[i], self.ws[i], self.As[i], self.Bs[i]))
            self.refs.append(x @ w.t() + SCALE * (x @ a.t()) @ b.t())
        torch.cuda.synchronize()


def measure(case, rows, name, fn, reps, check=True, graph=True, extra=None):
    row = {"rows": case.m, "rank": case.rank, "variant": name, "graph": graph}
    if extra:
        row.update(extra)
    try:
        for o in case.outs:
            o.fill_(float("nan"))
        for i in range(SETS):
            fn(i)
        torch.cuda.synchronize()
        err = rel_errs(case.outs, case.refs) if check else None
        if check and not err <= 1e-2:
            row.update({"error": "wrong: rel err %.3g" % err, "rel_err": err})
            rows.append(row)
            print("%5d r%-3s %-44s WRONG %.3g" % (case.m, case.rank, name, err), flush=True)
            return row
        for o in case.outs:
            o.fill_(float("nan"))
        med, ts, gr = timed(fn, reps, graph)
        torch.cuda.synchronize()
        err2 = rel_errs(case.outs, case.refs) if check else None
        row.update({"us": med, "us_all": ts, "rel_err": err, "rel_err_after": err2})
        if check and not err2 <= 1e-2:
            row["error"] = "wrong after timing: rel err %.3g" % err2
        del gr
    except Exception as ex:  # noqa: BLE001 - record and go on
        row["error"] = "%s: %s" % (type(ex).__name__, str(ex)[:400])
        traceback.print_exc()
    rows.append(row)
    print("%5d r%-3s %-44s %s" % (case.m, case.rank, name, ("%.1f us  err %s/%s" % (row["us"], _e(row.get("rel_err")), _e(row.get("rel_err_after")))) if "us" in row else row.get("error")), flush=True)
    return row


def _e(v):
    return "-" if v is None else "%.1e" % v


def run_case(case, rows, reps, quick):
    c = case
    base = measure(c, rows, "cublas_base", lambda i: torch.matmul(c.xs[i], c.ws[i].t(), out=c.outs[i]), reps, check=False)
    measure(c, rows, "cublas_base_addmm_beta1", lambda i: c.outs[i].addmm_(c.xs[i], c.ws[i].t()), reps, check=False)
    for ch in (2, 4, 8):
        parts = big.chunks(c.m, ch)
        measure(c, rows, "cublas_base_%d_chunks" % ch,
                lambda i, p=parts: [torch.matmul(c.xs[i][lo:hi], c.ws[i].t(), out=c.outs[i][lo:hi]) for lo, hi in p], reps, check=False)

    def torch_ops(i):
        y0 = F.linear(c.xs[i], c.ws[i])
        u = F.linear(F.linear(c.xs[i], c.As[i]), c.Bs[i])
        torch.add(y0, u, alpha=SCALE, out=c.outs[i])

    measure(c, rows, "torch_ops (fallback)", torch_ops, reps)

    def addmm_comp(i):
        t = torch.matmul(c.xs[i], c.As[i].t()).mul_(SCALE)
        torch.matmul(t, c.Bs[i].t(), out=c.outs[i])
        c.outs[i].addmm_(c.xs[i], c.ws[i].t())

    measure(c, rows, "cublas_t_then_addmm_beta1", addmm_comp, reps)
    # the term alone (MODE 0 into y: bytes = x read + y written), at several grids
    cur = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    if c.rank <= 16:
        kerns = ((4, 1, 2, 0), (8, 1, 4, 1), (16, 1, 4, 1), (8, 2, 2, 1), (16, 2, 2, 1), (8, 1, 4, 0)) if not quick else ((4, 1, 2, 0), (8, 1, 4, 1), (16, 1, 4, 1))
    else:
        kerns = ((4, 1, 2, 0), (8, 1, 4, 0), (8, 2, 2, 0))
    alone = {}
    for kern in kerns:
        for grid in ((0, 8, 16, 32) if not quick else (0, 16)):
            r_ = measure(c, rows, "lowrank_pre_alone %s g%d" % (kern, grid),
                         lambda i, kern=kern, grid=grid: big.lowrank(c.xs[i], c.As[i], c.Bs[i], c.outs[i], SCALE, c.rank, kern, 0, grid, cur()), reps, check=False,
                         extra={"bytes": 2 * c.m * (K + N), "kern": list(kern), "grid": grid})
            if "us" in r_:
                alone[(kern, grid)] = r_["us"]
    for kern in kerns[:2]:
        measure(c, rows, "lowrank_add_alone %s g0" % (kern,), lambda i, kern=kern: big.lowrank(c.xs[i], c.As[i], c.Bs[i], c.outs[i], SCALE, c.rank, kern, 1, 0, cur()), reps,
                check=False, extra={"bytes": 2 * c.m * (K + 2 * N), "kern": list(kern)})
    full = sorted(((v, k) for (k, g), v in alone.items() if g == 0))
    side = sorted(((v, k) for (k, g), v in alone.items() if g == 16)) or full
    k1 = full[0][1] if full else kerns[0]
    k2 = side[0][1] if side else k1
    cfgs = []
    for kern in kerns:
        cfgs.append(("big", 0, 1, 0) + kern)
    cfgs.append(("big", 1, 1, 0) + k1)
    for ch in (2, 4):
        for g in (8, 16, 32, 64):
            for order in (0, 2):
                cfgs.append(("big", order, ch, g) + k1)
                if not quick and ch == 2 and k2 != k1:
                    cfgs.append(("big", order, ch, g) + k2)
    for ch in (2,):
        for g in (16, 32):
            cfgs.append(("big", 1, ch, g) + k1)
    res = {}
    cfgs = [cf for cf in cfgs if big.suits(cf, c.m, N, K, c.rank)]
    for cfg in cfgs:
        r = measure(c, rows, "big %r" % (cfg,), lambda i, cfg=cfg: big.launch(cfg, c.xs[i], c.ws[i], c.As[i], c.Bs[i], c.outs[i], SCALE), reps, extra={"config": list(cfg)})
        if "us" in r and "error" not in r:
            res[cfg] = r["us"]
    best = sorted(res.items(), key=lambda kv: kv[1])[:3]
    for cfg, _ in best[:2]:
        measure(c, rows, "big %r eager" % (cfg,), lambda i, cfg=cfg: big.launch(cfg, c.xs[i], c.ws[i], c.As[i], c.Bs[i], c.outs[i], SCALE), reps, graph=False, extra={"config": list(cfg)})
    # the dispatch as the executor runs it
    measure(c, rows, "stream.lora_linear (dispatch)", lambda i: must(st.lora_linear(c.xs[i], c.ws[i], c.As[i], c.Bs[i], SCALE, out=c.outs[i])), reps)
    # SM carve-out (cuBLASLt SM count target; torch applies it on the cuBLASLt path only), where this torch has it
    if hasattr(torch._C, "_set_sm_carveout_experimental") and not quick and c.m == 4096:
        prev = torch.backends.cuda.preferred_blas_library()
        try:
            torch.backends.cuda.preferred_blas_library("cublaslt")
            for co in (0, 4, 8, 16):
                torch._C._set_sm_carveout_experimental(co if co else None)
                measure(c, rows, "lt carveout %d cublas_base" % co, lambda i: torch.matmul(c.xs[i], c.ws[i].t(), out=c.outs[i]), reps, check=False)
                measure(c, rows, "lt carveout %d addmm_beta1" % co, lambda i: c.outs[i].addmm_(c.xs[i], c.ws[i].t()), reps, check=False)
                for cfg in (("big", 2, 2, co or 8) + k1, ("big", 2, 2, 2 * co or 16) + k1, ("big", 0, 2, co or 8) + k1, ("big", 0, 2, 2 * co or 16) + k1, ("big", 0, 1, 0) + k1):
                    measure(c, rows, "lt carveout %d big %r" % (co, cfg), lambda i, cfg=cfg: big.launch(cfg, c.xs[i], c.ws[i], c.As[i], c.Bs[i], c.outs[i], SCALE), reps,
                            extra={"config": list(cfg), "carveout": co, "blas": "cublaslt"})
        finally:
            torch._C._set_sm_carveout_experimental(None)
            torch.backends.cuda.preferred_blas_library(prev)
    return base


def bank_run(m, rows, reps, rank_list, nsets=2):
    """64-adapter bank (one adapter per row, (row + 7·set) mod 64): the shipped dispatch, sx with the side
    shrink, the pieces alone, and big.bank_launch's column-chunked overlap."""
    from stageml_torch import tma as T  # noqa: PLC0415

    rmax = max(rank_list)
    g = torch.Generator(device="cuda").manual_seed(77 + m)
    ranks = torch.tensor(rank_list, device="cuda", dtype=torch.int32)
    scales = torch.tensor([2.0 if j % 2 == 0 else 1.0 for j in range(64)], device="cuda", dtype=torch.float32)
    ab, bb = [], []
    for _ in range(nsets):
        a = (torch.randn((64, rmax, K), device="cuda", generator=g) / 64).to(torch.bfloat16)
        b = (torch.randn((64, N, rmax), device="cuda", generator=g) / 4).to(torch.bfloat16)
        for j, r in enumerate(rank_list):
            a[j, r:] = 0
            b[j, :, r:] = 0
        ab.append(a)
        bb.append(b)
    c = type("C", (), {})()
    c.m, c.rank = m, "8-16-64" if len(set(rank_list)) > 1 else rank_list[0]
    c.xs = [rnd(g, m, K) for _ in range(SETS)]
    c.ws = [rnd(g, N, K, scale=K ** -0.5) for _ in range(SETS)]
    c.slots = [torch.tensor([(j + 7 * i) % 64 for j in range(m)], device="cuda", dtype=torch.int32) for i in range(SETS)]
    c.outs = [torch.empty((m, N), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    c.refs = []
    for i in range(SETS):
        x = c.xs[i].float()
        a = ab[i % nsets].float()[c.slots[i].long()]  # [m, rmax, K]
        b = bb[i % nsets].float()[c.slots[i].long()]  # [m, N, rmax]
        t = torch.einsum("mk,mrk->mr", x, a) * scales[c.slots[i].long()][:, None]
        c.refs.append(x @ c.ws[i].float().t() + torch.einsum("mr,mnr->mn", t, b))
    A = lambda i: ab[i % nsets]  # noqa: E731
    B = lambda i: bb[i % nsets]  # noqa: E731
    tag = "bank64 r%s " % c.rank
    measure(c, rows, tag + "cublas_base", lambda i: torch.matmul(c.xs[i], c.ws[i].t(), out=c.outs[i]), reps, check=False)
    measure(c, rows, tag + "dispatch", lambda i: must(st.lora_bank_linear(c.xs[i], c.ws[i], A(i), B(i), c.slots[i], ranks, scales, out=c.outs[i])), reps)
    for cfg in (("sx", 32, 128, 1), ("sx", 8, 128, 1), ("sx", 32, 128, 1, 1), ("sx", 8, 128, 1, 1)):
        measure(c, rows, tag + "%r" % (cfg,), lambda i, cfg=cfg: must(st.lora_bank_linear(c.xs[i], c.ws[i], A(i), B(i), c.slots[i], ranks, scales, cfg=cfg, out=c.outs[i])), reps)
    cur = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    # the pieces alone: shrink, expand (all columns)
    kw = 32
    groups = -(-rmax // 16)
    kc = T.sx_slices(kw, m, groups, K)
    fs = T._shrink_fn(kw)
    fe = big.expand_cols_fn(128)
    tb = T._tbuf(c.xs[0].device, cur(), rmax)
    p = lambda v: big.ctypes.c_uint64(v.data_ptr())  # noqa: E731
    i32 = big.ctypes.c_int32
    measure(c, rows, tag + "piece lora_shrink<32>", lambda i: big._raw(fs, (m, groups, kc), 32 * kw, cur(), [p(c.xs[i]), p(A(i)), p(tb), p(c.slots[i]), p(ranks), i32(m), i32(K), i32(rmax)], "s"),
            reps, check=False)
    measure(c, rows, tag + "piece lora_expand_cols<128> all", lambda i: big._raw(fe, (N // 128, m, 1), 128, cur(),
            [p(tb), p(B(i)), p(c.outs[i]), p(c.slots[i]), p(ranks), p(scales), i32(m), i32(N), i32(rmax), i32(kc), i32(0), i32(N)], "e"), reps, check=False)
    for ch in ((1,) if LIGHT[0] else (1, 2, 4, 8)):
        for kw_ in (32, 8):
            cfg = ("bx", kw_, 128, ch)
            measure(c, rows, tag + "big.bank_launch %r" % (cfg,), lambda i, cfg=cfg: big.bank_launch(cfg, c.xs[i], c.ws[i], A(i), B(i), c.outs[i], c.slots[i], ranks, scales, rmax), reps)
    for ch in (() if LIGHT[0] else (2, 4)):
        parts = big.col_chunks(N, ch)
        measure(c, rows, tag + "cublas_base_%d_col_chunks" % ch, lambda i, p_=parts: [torch.matmul(c.xs[i], c.ws[i][lo:hi].t(), out=c.outs[i][:, lo:hi]) for lo, hi in p_],
                reps, check=False)


def run_final(c, rows, reps):
    """The shipped dispatch against cuBLAS's base GEMM and the unfused ops, nothing else."""
    measure(c, rows, "cublas_base", lambda i: torch.matmul(c.xs[i], c.ws[i].t(), out=c.outs[i]), reps, check=False)

    def torch_ops(i):
        y0 = F.linear(c.xs[i], c.ws[i])
        u = F.linear(F.linear(c.xs[i], c.As[i]), c.Bs[i])
        torch.add(y0, u, alpha=SCALE, out=c.outs[i])

    measure(c, rows, "torch_ops (fallback)", torch_ops, reps)
    measure(c, rows, "stream.lora_linear (dispatch)", lambda i: must(st.lora_linear(c.xs[i], c.ws[i], c.As[i], c.Bs[i], SCALE, out=c.outs[i])), reps,
            extra={"config": list(st.config_for(c.m) or [])})
    if c.m <= 256:
        for cfg in (("sx", 32, 128), ("sx", 32, 128, 0, 1), ("cx",)):
            measure(c, rows, "%r" % (cfg,), lambda i, cfg=cfg: must(st.lora_linear(c.xs[i], c.ws[i], c.As[i], c.Bs[i], SCALE, cfg=cfg, out=c.outs[i])), reps,
                    extra={"config": list(cfg)})


def must(y):
    if y is None:
        raise RuntimeError("dispatch returned None (falls back)")
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="4096,2048,1024,512,256")
    ap.add_argument("--ranks", default="16,64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--final", action="store_true", help="only cuBLAS base, the unfused ops and the shipped dispatch")
    ap.add_argument("--bank-rows", default="32,64,128,256")
    ap.add_argument("--budget", type=float, default=300)
    args = ap.parse_args()
    LIGHT[0] = args.final
    dev = torch.cuda.get_device_properties(0)
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": torch.cuda.get_device_name(), "sms": dev.multi_processor_count,
           "torch": torch.__version__, "cuda": torch.version.cuda, "shape": "x [M, 4096] · W [4096, 4096]ᵀ + 2·(x·Aᵀ)·Bᵀ, bf16, one adapter",
           "has_carveout": hasattr(torch._C, "_set_sm_carveout_experimental"), "rows": []}
    src = torch.empty(2 * 1024 ** 3 // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):
        dst.copy_(src)
    b.record()
    torch.cuda.synchronize()
    out["copy_tbs"] = 2 * src.numel() * 2 * 5 / (a.elapsed_time(b) / 1000) / 1e12
    del src, dst
    print("copy %.2f TB/s, carveout api %s" % (out["copy_tbs"], out["has_carveout"]), flush=True)
    for m in [int(v) for v in args.bank_rows.split(",") if v]:
        for rl in ([16] * 64, [(8, 16, 64)[j % 3] for j in range(64)]):
            try:
                bank_run(m, out["rows"], args.reps, rl)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
            torch.cuda.empty_cache()
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)
    for rank in [int(v) for v in args.ranks.split(",")]:
        for m in [int(v) for v in args.rows.split(",")]:
            if time.time() - T0 > args.budget:
                print("budget reached", flush=True)
                break
            case = Case(m, rank, 1000 + m + rank)
            if args.final:
                run_final(case, out["rows"], args.reps)
            else:
                run_case(case, out["rows"], args.reps, args.quick or rank != 16)
            del case
            torch.cuda.empty_cache()
            with open(args.out, "w") as fh:
                json.dump(out, fh, indent=1)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    # summary: per (rows, rank) base and the best few
    print("\nrows rank  base_us  best (x base)")
    keys = sorted(set((r["rows"], str(r["rank"])) for r in out["rows"]))
    for m, rank in keys:
        rs = [r for r in out["rows"] if r["rows"] == m and str(r["rank"]) == rank and "us" in r and "error" not in r]
        for bank in (False, True):
            sub = [r for r in rs if r["variant"].startswith("bank64") == bank]
            base = next((r["us"] for r in sub if r["variant"].endswith("cublas_base")), None)
            if not base:
                continue
            full = sorted((r for r in sub if r.get("rel_err") is not None), key=lambda r: r["us"])[:4]
            print("%5d r%-7s %s %7.1f  %s" % (m, rank, "bank" if bank else "one ", base, "; ".join("%s %.3f" % (r["variant"], r["us"] / base) for r in full)))
    print("done in %.0f s" % (time.time() - T0))


if __name__ == "__main__":
    main()
