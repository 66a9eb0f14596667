"""The bank's LoRA half (sx: cuBLAS base GEMM + lora_shrink + an expand) with each expand kernel, one
device call: 64-adapter banks (r16 / ranks 8-16-64 cycled, row i on adapter (i + 7·set) mod 64) at
16-256 rows on 4096², and at 64 rows on the Llama-3-8B projection shapes (N × K = 1024 × 4096,
14336 × 4096, 4096 × 14336); the expands alone at 64 rows (bytes of B_j rows read / time).

    python3 bench/gpu/bankx.py --out bankx.json [--rows 16,32,64,128,256]

Variants: cuBLAS base alone; ("sx", 32, 128, 1, EV) for EV 1 (lora_expand2, what ships at 17-64
rows), 2 (lora_expand3: whole columns per warp load) and 3 (lora_expand3 into an f32 buffer on the
side stream beside the base GEMM, lora_add after the join); EV 2 without the side stream. Times
and checks as bench/gpu/splitk.py (CUDA-graph replay over 4 operand sets past the L2, median of 20;
NaN-poisoned outputs checked against float64 before and after timing, bound 1e-2)."""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import splitk as sk  # noqa: E402
from stageml_torch import stream as st  # noqa: E402
from stageml_torch import tma  # noqa: E402

SETS = 4
MIXES = {"r16": [16] * 64, "8-16-64": [[8, 16, 64][i % 3] for i in range(64)], "r8": [8] * 64}
VARIANTS = [("sx", 32, 128, 1, 1), ("sx", 32, 128, 1, 2), ("sx", 32, 128, 1, 3), ("sx", 32, 128, 0, 2)]
# with the factors also stored transposed ([64, R, N], b_bank_t): lora_expand4
VARIANTS_T = [("sx", 32, 128, 1, 2), ("sx", 32, 128, 1, 3), ("sx", 32, 128, 0, 2)]


def banks(rank_list, n, k):
    rmax = max(rank_list)
    ranks = torch.tensor(rank_list, device="cuda", dtype=torch.int32)
    scales = torch.tensor([2.0 if j % 2 == 0 else 1.0 for j in range(64)], device="cuda", dtype=torch.float32)
    out = []
    for _ in range(SETS):
        a = torch.randn((64, rmax, k), device="cuda", dtype=torch.bfloat16) / 64
        b = torch.randn((64, n, rmax), device="cuda", dtype=torch.bfloat16) / 4
        for j, r in enumerate(rank_list):
            a[j, r:] = 0
            b[j, :, r:] = 0
        out.append((a, b))
    return out, ranks, scales, rmax


def case(res, mix, m, n, k):
    rank_list = MIXES[mix]
    bk, ranks, scales, rmax = banks(rank_list, n, k)
    ws = [torch.randn((n, k), device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(SETS)]
    xs = [torch.randn((m, k), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    slots = [torch.tensor([(j + 7 * i) % 64 for j in range(m)], device="cuda", dtype=torch.int32) for i in range(SETS)]
    outs = [torch.empty((m, n), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    refs = []
    for i in range(SETS):
        a, b = bk[i]
        sl = slots[i].long()
        ag = a.index_select(0, sl).double()
        bg = b.index_select(0, sl).double()
        t = torch.bmm(ag, xs[i].double().unsqueeze(-1))
        d = torch.bmm(bg, t).squeeze(-1) * scales.double().index_select(0, sl).unsqueeze(-1)
        refs.append(xs[i].double() @ ws[i].double().t() + d)
    row = {"case": "bank64_" + mix, "rows": m, "N": n, "K": k}
    sk.measure(row, "cublas_base", lambda i: torch.matmul(xs[i], ws[i].t(), out=outs[i]), [xs[i].double() @ ws[i].double().t() for i in range(SETS)], outs)
    base = row["variants"]["cublas_base"]["us"]
    for cfg in VARIANTS:
        run = lambda i, c=cfg: sk.must(st.lora_bank_linear(xs[i], ws[i], bk[i][0], bk[i][1], slots[i], ranks, scales, cfg=c, out=outs[i]))  # noqa: E731
        sk.measure(row, "sx %s" % (cfg,), run, refs, outs, extra={"config": list(cfg)})
    bts = [b.transpose(1, 2).contiguous() for _, b in bk]
    for cfg in VARIANTS_T:
        run = lambda i, c=cfg: sk.must(st.lora_bank_linear(xs[i], ws[i], bk[i][0], bk[i][1], slots[i], ranks, scales, cfg=c, out=outs[i], b_bank_t=bts[i]))  # noqa: E731
        sk.measure(row, "sx %s B^T" % (cfg,), run, refs, outs, extra={"config": list(cfg), "b_transposed": True})
    if st.config_for(m, bank=True) is not None:
        shipped = list(st.config_for(m, bank=True))
        run = lambda i: sk.must(st.lora_bank_linear(xs[i], ws[i], bk[i][0], bk[i][1], slots[i], ranks, scales, out=outs[i]))  # noqa: E731
        sk.measure(row, "shipped dispatch, b_bank", run, refs, outs, extra={"config": shipped})
        run = lambda i: sk.must(st.lora_bank_linear(xs[i], ws[i], bk[i][0], bk[i][1], slots[i], ranks, scales, out=outs[i], b_bank_t=bts[i]))  # noqa: E731
        sk.measure(row, "shipped dispatch, b_bank + b_bank_t", run, refs, outs, extra={"config": shipped})
    if m == 64 and n == k == 4096:
        pieces(row, xs, ws, bk, bts, slots, ranks, scales, rmax, outs, m, n, k)
    del bts
    for v in row["variants"].values():
        if "us" in v:
            v["x_base"] = v["us"] / base
    row["cublas_base_us"] = base
    res["rows"].append(row)
    print("%s %d rows N %d K %d: %s" % (row["case"], m, n, k, {kk: (round(v["us"], 2), round(v["x_base"], 3)) if "us" in v else v.get("error", "?")[:60]
                                                               for kk, v in row["variants"].items()}), flush=True)
    with open(ARGS.out, "w") as f:
        json.dump(res, f, indent=1)


def pieces(row, xs, ws, bk, bts, slots, ranks, scales, rmax, outs, m, n, k):
    """The two expands alone (y as cuBLAS left it, t from one shrink), µs and GB/s of B_j rows."""
    groups = -(-rmax // 16)
    kc = tma.sx_slices(32, m, groups, k)
    stream = torch.cuda.current_stream().cuda_stream
    t = tma._tbuf(xs[0].device, stream, rmax)
    fs = tma._shrink_fn(32)
    p = lambda v: tma.ctypes.c_uint64(v.data_ptr() if v is not None else 0)  # noqa: E731
    rk = ranks.tolist()
    bytes_b = sum(2 * n * rk[j] for j in slots[0].tolist())
    tma._launch_raw(fs, (m, groups, kc), 32 * 32, 0, stream, [p(xs[0]), p(bk[0][0]), p(t), p(slots[0]), p(ranks)] + [tma.ctypes.c_int32(v) for v in (m, k, rmax)], "shrink")
    tail = [tma.ctypes.c_int32(v) for v in (m, n, rmax, kc)]
    f2 = tma._expand_fn(128, 1)
    f3 = tma._expand_fn(128, 2)
    y = outs[0]
    torch.matmul(xs[0], ws[0].t(), out=y)
    sets = [lambda i: tma._launch_raw(f2, (-(-n // 128), m, 1), 128, 0, torch.cuda.current_stream().cuda_stream,
                                      [p(t), p(bk[i][1]), p(y), p(slots[i]), p(ranks), p(scales)] + tail, "e2"),
            lambda i: tma._launch_raw(f3, tma.expand3_grid(n, m, rmax), tma.EXPAND3_NT, 0, torch.cuda.current_stream().cuda_stream,
                                      [p(t), p(bk[i][1]), p(y), p(None), p(slots[i]), p(ranks), p(scales)] + tail, "e3")]
    f4 = tma._expand4_fn(rmax, 0)
    sets.append(lambda i: tma._launch_raw(f4, (-(-n // 256), m, 1), 256, 0, torch.cuda.current_stream().cuda_stream,
                                          [p(t), p(bts[i]), p(y), p(None), p(slots[i]), p(ranks), p(scales)] + tail, "e4"))
    for name, fn in zip(("lora_expand2 alone", "lora_expand3 alone", "lora_expand4 alone (B^T)"), sets):
        us = sk.graph_us([lambda i=i: fn(i) for i in range(SETS)])
        row["variants"][name] = {"us": us, "B_GBps": bytes_b / (us * 1e-6) / 1e9, "B_MB": bytes_b / 1e6}
    us = sk.graph_us([lambda i=i: tma._launch_raw(fs, (m, groups, kc), 32 * 32, 0, torch.cuda.current_stream().cuda_stream,
                                                   [p(xs[i]), p(bk[i][0]), p(t), p(slots[i]), p(ranks)] + [tma.ctypes.c_int32(v) for v in (m, k, rmax)], "shrink")
                      for i in range(SETS)])
    row["variants"]["lora_shrink<32> alone"] = {"us": us, "A_GBps": bytes_b * k / n / (us * 1e-6) / 1e9}


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="16,32,64,128,256")
    ap.add_argument("--mixes", default=",".join(MIXES), help="which banks (r16, 8-16-64, r8)")
    ap.add_argument("--no-8b", action="store_true", help="skip the Llama-3-8B projection shapes")
    ARGS = ap.parse_args()
    res = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                    "copy_TBps": sk.copy_tbs(), "variants": [list(v) for v in VARIANTS],
                    "shrink_warps": tma.SX_SHRINK_WARPS, "bank_table": {str(kk): list(v) for kk, v in st.DEFAULT_BANK.items()}}, "rows": []}
    print("copy %.2f TB/s" % res["meta"]["copy_TBps"], flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        mixes = [v for v in ARGS.mixes.split(",") if v]
        for mix in mixes:
            for m in [int(v) for v in ARGS.rows.split(",")] if mix != "r8" else [32, 64]:
                case(res, mix, m, 4096, 4096)
        for mix in [] if ARGS.no_8b else [v for v in ("8-16-64", "r16") if v in mixes]:
            for n, k in ((1024, 4096), (14336, 4096), (4096, 14336)):
                case(res, mix, 64, n, k)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
