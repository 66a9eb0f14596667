"""Can the bank's LoRA half run *beside* the base GEMM at decode sizes? One device call: cuBLAS's
base GEMM on fewer SMs (cuBLASLt's SM count target, `torch._C._set_sm_carveout_experimental`;
torch honours it on the cuBLASLt path only) and the side stream's lora_shrink + lora_expand4
(sx EV 3 with b_bank_t, what ships at 17-64 bank rows) on the SMs left over, launched before or
after the GEMM; with a CUDA green context for the side stream where this torch has them.

    python3 bench/gpu/carve.py --out carve.json [--rows 32,64] [--carveouts 0,8,16,24,32,48]

Shapes: 4096², and the Llama-3-8B projections (N × K = 1024 × 4096, 14336 × 4096, 4096 × 14336) at
64 rows; banks of 64 adapters, ranks 8/16/64 cycled and r16 (row i on adapter (i + 7·set) mod 64).
Times and checks as bench/gpu/splitk.py (CUDA-graph replay over 4 operand sets past the L2, median
of 20; NaN-poisoned outputs checked against float64 before and after timing, bound 1e-2).
"""
import argparse
import ctypes
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bankx  # noqa: E402
import splitk as sk  # noqa: E402
from stageml_torch import stream as st  # noqa: E402
from stageml_torch import tma  # noqa: E402

SETS = bankx.SETS


class Lt:
    """cuBLASLt with `carve` SMs left out, for the calls inside the `with` (None: the default path)."""

    def __init__(self, carve):
        self.carve = carve

    def __enter__(self):
        if self.carve is None:
            return self
        self.prev = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        torch._C._set_sm_carveout_experimental(self.carve if self.carve else None)
        return self

    def __exit__(self, *exc):
        if self.carve is not None:
            torch._C._set_sm_carveout_experimental(None)
            torch.backends.cuda.preferred_blas_library(self.prev)


def p(v):
    return ctypes.c_uint64(v.data_ptr() if v is not None else 0)


def ev3(x2, w, a, bt, y, slots, ranks, scales, rmax, carve=None, gemm_first=False, side=None, lora=True, gemm=True):
    """sx EV 3 with b_bank_t as tma.sx_launch runs it, with the GEMM's SM carve-out, the launch order
    and the side stream as knobs (lora / gemm False: that half alone, for its time)."""
    m, k = x2.shape
    n = w.shape[0]
    cfg = ("sx", 32, 128, 1, 3)
    fs, _ = tma.sx_function(cfg)
    fe = tma._expand4_fn(rmax, 1)
    main = torch.cuda.current_stream(x2.device)
    side = side if side is not None else tma._side_stream(x2.device)
    t = tma._tbuf(x2.device, side.cuda_stream, rmax)
    groups = -(-rmax // 16)
    kc = tma.sx_slices(32, m, groups, k)
    vals = [p(x2), p(a), p(t), p(slots), p(ranks)] + [ctypes.c_int32(v) for v in (m, k, rmax)]
    tail = [ctypes.c_int32(v) for v in (m, n, rmax, kc)]
    d = torch.empty((m, n), device=x2.device, dtype=torch.float32)
    side.wait_stream(main)

    def side_work():
        tma._launch_raw(fs, (m, groups, kc), 32 * 32, 0, side.cuda_stream, vals, "lora_shrink<32>")
        tma._launch_raw(fe, (-(-n // 256), m, 1), 256, 0, side.cuda_stream, [p(t), p(bt), p(None), p(d), p(slots), p(ranks), p(scales)] + tail, "lora_expand4<MODE 1>")

    def gemm_work():
        with Lt(carve):
            torch.matmul(x2, w.t(), out=y)

    if gemm_first:
        if gemm:
            gemm_work()
        if lora:
            side_work()
    else:
        if lora:
            side_work()
        if gemm:
            gemm_work()
    main.wait_stream(side)
    if lora and gemm:
        tma._launch_raw(tma._add_fn(), (-(-(m * n // 8) // 256), 1, 1), 256, 0, main.cuda_stream, [p(y), p(d), p(slots), ctypes.c_int32(m), ctypes.c_int32(n)], "lora_add")
    return y


def green_stream(num_sms):
    """A stream whose work runs on `num_sms` SMs only (a CUDA green context), or (None, why)."""
    try:
        from torch.cuda import green_contexts as gcm  # noqa: PLC0415
    except Exception as ex:  # noqa: BLE001
        return None, "no torch.cuda.green_contexts: %s" % ex
    try:
        try:
            g = gcm.GreenContext.create(num_sms=num_sms, device_id=0)
        except TypeError:
            g = gcm.GreenContext.create(num_sms, 0)
        if hasattr(g, "Stream"):
            s = g.Stream()
        else:
            g.set_context()
            s = torch.cuda.Stream()
            g.pop_context()
        return (g, s), None
    except Exception as ex:  # noqa: BLE001
        return None, "%s: %s" % (type(ex).__name__, str(ex)[:300])


def case(res, mix, m, n, k, carveouts, green):
    rank_list = bankx.MIXES[mix]
    bk, ranks, scales, rmax = bankx.banks(rank_list, n, k)
    ws = [torch.randn((n, k), device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(SETS)]
    xs = [torch.randn((m, k), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    slots = [torch.tensor([(j + 7 * i) % 64 for j in range(m)], device="cuda", dtype=torch.int32) for i in range(SETS)]
    outs = [torch.empty((m, n), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    bts = [b.transpose(1, 2).contiguous() for _, b in bk]
    refs, base_refs = [], []
    for i in range(SETS):
        a, b = bk[i]
        sl = slots[i].long()
        t = torch.bmm(a.index_select(0, sl).double(), xs[i].double().unsqueeze(-1))
        dd = torch.bmm(b.index_select(0, sl).double(), t).squeeze(-1) * scales.double().index_select(0, sl).unsqueeze(-1)
        base_refs.append(xs[i].double() @ ws[i].double().t())
        refs.append(base_refs[-1] + dd)
    row = {"case": "bank64_" + mix, "rows": m, "N": n, "K": k}
    sk.measure(row, "cublas_base", lambda i: torch.matmul(xs[i], ws[i].t(), out=outs[i]), base_refs, outs)
    base = row["variants"]["cublas_base"]["us"]
    run = lambda i: sk.must(st.lora_bank_linear(xs[i], ws[i], bk[i][0], bk[i][1], slots[i], ranks, scales, out=outs[i], b_bank_t=bts[i]))  # noqa: E731
    sk.measure(row, "shipped (b_bank_t)", run, refs, outs)
    # the side stream's work alone (its time on the whole GPU)
    row["variants"]["side alone"] = {"us": sk.graph_us([lambda i=i: ev3(xs[i], ws[i], bk[i][0], bts[i], outs[i], slots[i], ranks, scales, rmax, gemm=False) for i in range(SETS)])}
    for co in carveouts:
        with Lt(co):
            sk.measure(row, "lt carve %d base" % co, lambda i: torch.matmul(xs[i], ws[i].t(), out=outs[i]), base_refs, outs)
        for gf in (False, True):
            name = "ev3 lt carve %d %s" % (co, "gemm first" if gf else "lora first")
            sk.measure(row, name, lambda i, co=co, gf=gf: ev3(xs[i], ws[i], bk[i][0], bts[i], outs[i], slots[i], ranks, scales, rmax, carve=co, gemm_first=gf), refs, outs)
        if green and co:
            gs, why = green_stream(co)
            if gs is None:
                row["variants"]["green %d" % co] = {"error": why}
            else:
                g, s = gs
                row["variants"]["green %d side alone" % co] = {}
                try:
                    row["variants"]["green %d side alone" % co] = {"us": sk.graph_us([lambda i=i: ev3(xs[i], ws[i], bk[i][0], bts[i], outs[i], slots[i], ranks, scales, rmax, side=s, gemm=False) for i in range(SETS)])}
                except Exception as ex:  # noqa: BLE001
                    row["variants"]["green %d side alone" % co] = {"error": "%s: %s" % (type(ex).__name__, str(ex)[:300])}
                    traceback.print_exc(limit=2)
                for gf in (False, True):
                    name = "ev3 green %d lt carve %d %s" % (co, co, "gemm first" if gf else "lora first")
                    sk.measure(row, name, lambda i, co=co, gf=gf, s=s: ev3(xs[i], ws[i], bk[i][0], bts[i], outs[i], slots[i], ranks, scales, rmax, carve=co, gemm_first=gf, side=s), refs, outs)
    for v in row["variants"].values():
        if "us" in v:
            v["x_base"] = v["us"] / base
    row["cublas_base_us"] = base
    res["rows"].append(row)
    print("%s %d rows N %d K %d:" % (row["case"], m, n, k), flush=True)
    for kk, v in row["variants"].items():
        print("   %-40s %s" % (kk, ("%.2f us x%.3f" % (v["us"], v["x_base"])) if "us" in v else v.get("error", "?")[:200]), flush=True)
    with open(ARGS.out, "w") as f:
        json.dump(res, f, indent=1)


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="32,64")
    ap.add_argument("--carveouts", default="0,8,16,24,32,48")
    ap.add_argument("--no-green", action="store_true")
    ap.add_argument("--mixes", default="8-16-64,r16")
    ARGS = ap.parse_args()
    carveouts = [int(v) for v in ARGS.carveouts.split(",") if v]
    res = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                    "sms": torch.cuda.get_device_properties(0).multi_processor_count, "copy_TBps": sk.copy_tbs(),
                    "has_carveout": hasattr(torch._C, "_set_sm_carveout_experimental")}, "rows": []}
    try:
        from torch.cuda import green_contexts as gcm  # noqa: PLC0415
        res["meta"]["green_contexts"] = [n for n in dir(gcm.GreenContext) if not n.startswith("__")]
    except Exception as ex:  # noqa: BLE001
        res["meta"]["green_contexts"] = "unavailable: %s" % ex
    print(json.dumps(res["meta"]), flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        for mix in [v for v in ARGS.mixes.split(",") if v]:
            for m in [int(v) for v in ARGS.rows.split(",")]:
                case(res, mix, m, 4096, 4096, carveouts, not ARGS.no_green)
        for n, k in ((14336, 4096), (4096, 14336), (1024, 4096)):
            case(res, "8-16-64", 64, n, k, [c for c in carveouts if c in (0, 16, 32)] or carveouts, False)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
