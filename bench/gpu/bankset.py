"""A layer's sibling bank linears (one input, one row→slot map) as one set against one at a time:
q/k/v (N 4096 / 1024 / 1024, K 4096) and gate/up (N 14336 / 14336, K 4096) of the Llama-3-8B
shape, 64-adapter banks (ranks 8/16/64 cycled, or r16), row i on adapter (i + 7·set) mod 64, at
16-64 rows (the fourth operand set: every fifth row slot -1, the others sharing 7 slots). Variants: the base GEMMs alone; each projection through `stream.lora_bank_linear`
(shipped dispatch, with b_bank_t); the set through `stream.lora_bank_linear_set` (one shrink and
one expand beside the GEMMs, one add after the join). Times as bench/gpu/splitk.py (CUDA-graph
replay over 4 operand sets past the L2, median of 20); every output NaN-poisoned and checked
against float64 before and after the timed replays (bound 1e-2).

    python3 bench/gpu/bankset.py --out bankset.json [--rows 16,32,64]
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import splitk as sk  # noqa: E402
from stageml_torch import stream as st  # noqa: E402

SETS = 4
MIXES = {"8-16-64": [[8, 16, 64][i % 3] for i in range(64)], "r16": [16] * 64}
GROUPS = {"qkv": [4096, 1024, 1024], "gate_up": [14336, 14336]}
K = 4096


def make(rank_list, ns):
    rmax = max(rank_list)
    ranks = torch.tensor(rank_list, device="cuda", dtype=torch.int32)
    scales = torch.tensor([2.0 if j % 2 == 0 else 1.0 for j in range(64)], device="cuda", dtype=torch.float32)
    sets = []
    for _ in range(SETS):
        projs = []
        for n in ns:
            w = torch.randn((n, K), device="cuda", dtype=torch.bfloat16) / K ** 0.5
            a = torch.randn((64, rmax, K), device="cuda", dtype=torch.bfloat16) / 64
            b = torch.randn((64, n, rmax), device="cuda", dtype=torch.bfloat16) / 4
            for j, r in enumerate(rank_list):
                a[j, r:] = 0
                b[j, :, r:] = 0
            projs.append((w, a, b, ranks, scales, b.transpose(1, 2).contiguous()))
        sets.append(projs)
    return sets


def check(run, xs, sets, slots, refs):
    """Largest relative error over every set and projection, outputs NaN-poisoned first."""
    worst = 0.0
    for i in range(SETS):
        ys = run(i)
        torch.cuda.synchronize()
        for y, ref in zip(ys, refs[i]):
            worst = max(worst, sk.rel_err(y, ref))
    return worst


def case(res, mix, group, m):
    ns = GROUPS[group]
    sets = make(MIXES[mix], ns)
    xs = [torch.randn((m, K), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    # the last operand set: every fifth row base only (slot -1) and rows sharing slots
    slots = [torch.tensor([(j + 7 * i) % 64 if i < SETS - 1 else (-1 if j % 5 == 4 else j % 7) for j in range(m)], device="cuda", dtype=torch.int32)
             for i in range(SETS)]
    refs = []
    for i in range(SETS):
        on = (slots[i] >= 0).double().unsqueeze(-1)
        sl = slots[i].clamp(min=0).long()
        per = []
        for w, a, b, _, scales, _ in sets[i]:
            t = torch.bmm(a.index_select(0, sl).double(), xs[i].double().unsqueeze(-1))
            d = torch.bmm(b.index_select(0, sl).double(), t).squeeze(-1) * scales.double().index_select(0, sl).unsqueeze(-1) * on
            per.append(xs[i].double() @ w.double().t() + d)
        refs.append(per)
    outs = [[torch.empty((m, n), device="cuda", dtype=torch.bfloat16) for n in ns] for _ in range(SETS)]

    def base(i):
        for (w, *_), y in zip(sets[i], outs[i]):
            torch.matmul(xs[i], w.t(), out=y)
        return outs[i]

    def each(i):
        for (w, a, b, r, s, bt), y in zip(sets[i], outs[i]):
            sk.must(st.lora_bank_linear(xs[i], w, a, b, slots[i], r, s, out=y, b_bank_t=bt))
        return outs[i]

    def one_set(i, cfg=None):
        ys = st.lora_bank_linear_set(xs[i], sets[i], slots[i], cfg=cfg)
        if ys is None:
            raise RuntimeError("lora_bank_linear_set declined")
        return ys

    row = {"case": "%s %s" % (group, mix), "rows": m, "N": ns, "K": K, "variants": {}}
    runs = [("base GEMMs", base), ("each: lora_bank_linear", each), ("set: lora_bank_linear_set", one_set)]
    for c in [tuple(int(v) if v.isdigit() else v for v in c.split(",")) for c in ARGS.set_cfgs.split(";") if c]:
        runs.append(("set %s" % (c,), lambda i, c=c: one_set(i, c)))
    for name, run in runs:
        rec = {}
        try:
            if name != "base GEMMs":
                for o in outs:
                    for y in o:
                        y.fill_(float("nan"))
                rec["rel_err"] = check(run, xs, sets, slots, refs)
                if not rec["rel_err"] < 1e-2:
                    rec["error"] = "wrong result (rel err %.3g)" % rec["rel_err"]
            if "error" not in rec:
                rec["us"] = sk.graph_us([lambda i=i: run(i) for i in range(SETS)])
                if name != "base GEMMs":
                    rec["rel_err_after"] = check(run, xs, sets, slots, refs)
        except Exception as ex:  # noqa: BLE001 - record and continue
            rec = {"error": "%s: %s" % (type(ex).__name__, str(ex)[:300])}
        row["variants"][name] = rec
    b_us = row["variants"]["base GEMMs"].get("us")
    for v in row["variants"].values():
        if "us" in v and b_us:
            v["x_base"] = v["us"] / b_us
    res["rows"].append(row)
    print("%s %d rows: %s" % (row["case"], m, {k: (round(v["us"], 2), round(v.get("x_base", 0), 3), v.get("rel_err")) if "us" in v else v.get("error", "?")[:80]
                                             for k, v in row["variants"].items()}), flush=True)
    with open(ARGS.out, "w") as f:
        json.dump(res, f, indent=1)
    del sets
    torch.cuda.empty_cache()


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="16,32,64")
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--set-cfgs", default="", help="more sx configurations to time the set under, ';'-separated (e.g. sx,8,128,1,3)")
    ARGS = ap.parse_args()
    res = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                    "copy_TBps": sk.copy_tbs(), "bank_table": {str(kk): list(v) for kk, v in st.DEFAULT_BANK.items()}}, "rows": []}
    print("copy %.2f TB/s" % res["meta"]["copy_TBps"], flush=True)
    with torch.no_grad():
        for mix in [v for v in ARGS.mixes.split(",") if v]:
            for group in GROUPS:
                for m in [int(v) for v in ARGS.rows.split(",")]:
                    case(res, mix, group, m)


if __name__ == "__main__":
    main()
