"""The engine's decode program on the torch worker, slot linears through the bank kernel or not.

Reads the program bench/gpu/prepare-engine-graph.ts wrote (graph.json + manifest.json beside it:
the engine's `gathered` decode step, bf16, adapterDtype same), draws random bf16 weights and random
slot tables (slot 0 zeros, slot j ≥ 1 of rank 8/16/64 cycled, zero-padded to R), and per batch
(1/8/16/32/64 rows, each on its own slot 1..batch) runs decode steps with the graph prepared twice:
`STAGEML_TORCH_FUSE=auto` (slot linears through `stream.lora_bank_linear`) and `=0` (the IR's torch
ops). Checks the logits agree (relative error, argmax agreement) and records the median step ms of
both, and of the engine's base program (base.json beside the graph, if there: what an all-base
batch runs, the issue's "base-only step"); a second case per batch has every row on slot 0 (base rows: the kernel with slots −1). Each
case runs in its own try/except; the JSON is rewritten after every case.

python3 bench/gpu/worker_bank.py --graph .gpu/wbank/graph.json --out $OUT/worker_bank.json
  [--batches 1,8,16,32,64] [--past 128] [--steps 30] [--warmup 5] [--device cuda] [--fuse auto]
(`--device cpu --fuse 1` runs the fallback ops on a CPU host: a smoke test of the script.)
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "native"))

import torch  # noqa: E402

from stageml_torch import bank  # noqa: E402
from stageml_torch.dims import evaluate_dim  # noqa: E402
from stageml_torch.graph import Program  # noqa: E402
from stageml_torch.ops import DTYPES  # noqa: E402

RANKS = (8, 16, 64)


def draw_params(manifest, device, gen):
    out = {}
    for p in manifest["params"]:
        shape = [int(d) for d in p["shape"]]
        dt = DTYPES[p["dtype"]]
        if len(shape) == 1:
            out[p["name"]] = torch.ones(shape, dtype=dt, device=device)
        else:
            bound = shape[-1] ** -0.5
            out[p["name"]] = ((torch.rand(shape, generator=gen, device=device) * 2 - 1) * bound).to(dt)
    return out


def draw_tables(manifest, device, gen):
    """name → slot table: A [S, R, in] (rows beyond the slot's rank zero), B [S, R, out] with the
    scale 2 folded in; slot 0 all zeros; the output tables S and C [S, out] zeros."""
    out = {}
    for i in manifest["inputs"]:
        if not i["name"].startswith("slots."):
            continue
        if len(i["shape"]) == 2:
            # S (DoRA's column scale - 1) and C (LoRA bias) [S, out]: zero, as for plain LoRA adapters
            out[i["name"]] = torch.zeros([int(v) for v in i["shape"]], dtype=DTYPES[i["dtype"]], device=device)
            continue
        s, r, d = [int(v) for v in i["shape"]]
        t = torch.zeros((s, r, d), dtype=torch.float32, device=device)
        is_a = i["name"].endswith(".A")
        for j in range(1, s):
            rank = min(RANKS[(j - 1) % len(RANKS)], r)
            scale = d ** -0.5 if is_a else 2.0 / rank
            t[j, :rank] = (torch.rand((rank, d), generator=gen, device=device) * 2 - 1) * scale
        out[i["name"]] = t.to(DTYPES[i["dtype"]])
    return out


def step_inputs(manifest, tables, batch, past, slots, device, gen):
    # The grouped form's distinct slots (as the engine builds them: [0] when every row is base).
    groups = sorted(set(s for s in slots if s != 0)) or [0]
    env = {"batch": batch, "seq": 1, "past": past, "groups": len(groups)}
    cfg = manifest["config"]
    ins = {}
    for i in manifest["inputs"]:
        name, dt = i["name"], DTYPES[i["dtype"]]
        if name.startswith("slots."):
            ins[name] = tables[name]
            continue
        shape = [evaluate_dim(d, env) for d in i["shape"]]
        if name == "input_ids":
            ins[name] = torch.randint(0, cfg["vocab_size"], shape, generator=gen, device=device)
        elif name == "position_ids":
            ins[name] = torch.full(shape, past, dtype=dt, device=device)
        elif name == "attention_mask":
            ins[name] = torch.zeros(shape, dtype=dt, device=device)
        elif name == "row_slot":
            ins[name] = torch.tensor(slots, dtype=dt, device=device)
        elif name == "one_slot":
            ins[name] = torch.tensor(slots[0], dtype=dt, device=device)
        elif name == "group_slot":
            ins[name] = torch.tensor(groups, dtype=dt, device=device)
        elif name == "row_group":
            ins[name] = torch.tensor([[1.0 if s != 0 and s == g else 0.0 for g in groups] for s in slots], dtype=dt, device=device)
        elif name == "row_mask":
            ins[name] = torch.tensor([1.0 if s else 0.0 for s in slots], dtype=dt, device=device).reshape(shape)
        elif name.startswith("past_"):
            ins[name] = (torch.randn(shape, generator=gen, device=device) * 0.5).to(dt)
        else:
            raise SystemExit("worker_bank: no rule for input '%s' %s" % (name, i["shape"]))
    return ins


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(prog, ins, steps, warmup, device):
    out = None
    with torch.no_grad():
        for _ in range(warmup):
            out = prog.run(ins)
        times = []
        for _ in range(steps):
            sync(device)
            t0 = time.perf_counter()
            out = prog.run(ins)
            sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
    return out, statistics.median(times), min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", required=True)
    ap.add_argument("--manifest", default=None, help="default: manifest.json beside the graph")
    ap.add_argument("--base", default=None, help="the base program (default: base.json beside the graph; skipped when missing)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,8,16,32,64")
    ap.add_argument("--past", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--fuse", default="auto", help="STAGEML_TORCH_FUSE of the fused program (auto on CUDA, 1 on a CPU)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with open(args.graph) as f:
        graph = json.load(f)
    with open(args.manifest or os.path.join(os.path.dirname(os.path.abspath(args.graph)), "manifest.json")) as f:
        manifest = json.load(f)
    device = args.device
    result = {
        "suite": "worker-bank",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "config": manifest["config"],
        "form": manifest["form"],
        "slots": manifest["slots"],
        "rank": manifest["rank"],
        "ranks": list(RANKS),
        "past": args.past,
        "steps": args.steps,
        "cases": [],
    }

    def write():
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    try:
        gen = torch.Generator(device=device)
        gen.manual_seed(args.seed)
        params = draw_params(manifest, device, gen)
        tables = draw_tables(manifest, device, gen)
        progs = {}
        for mode in (args.fuse, "0"):
            os.environ["STAGEML_TORCH_FUSE"] = mode
            progs[mode] = Program(graph, params, device)
        base_path = args.base or os.path.join(os.path.dirname(os.path.abspath(args.graph)), "base.json")
        if os.path.exists(base_path):
            with open(base_path) as f:
                progs["base"] = Program(json.load(f), params, device)
        result["fusedSlotLinears"] = {m: p.fused_slots for m, p in progs.items()}
        print("prepared: fused slot linears %s" % result["fusedSlotLinears"], flush=True)
    except Exception as e:  # noqa: BLE001 - recorded, nothing else can run
        result["error"] = "%s: %s" % (type(e).__name__, e)
        traceback.print_exc()
        write()
        return 1
    write()
    fused, plain = progs[args.fuse], progs["0"]
    for batch in [int(b) for b in args.batches.split(",")]:
        for case in ("mixed", "base-rows"):
            row = {"batch": batch, "case": case}
            try:
                slots = [1 + (i % (manifest["slots"] - 1)) for i in range(batch)] if case == "mixed" else [0] * batch
                ins = step_inputs(manifest, tables, batch, args.past, slots, device, gen)
                calls0 = sum(s[1].hits for s in fused.steps if s[0] == bank.KEY)
                out_f, ms_f, min_f = timed(fused, ins, args.steps, args.warmup, device)
                calls = sum(s[1].hits for s in fused.steps if s[0] == bank.KEY) - calls0
                out_u, ms_u, min_u = timed(plain, ins, args.steps, args.warmup, device)
                if "base" in progs:
                    base_names = set(progs["base"].input_names())
                    _, ms_b, _ = timed(progs["base"], {k: v for k, v in ins.items() if k in base_names}, args.steps, args.warmup, device)
                    row.update({"base_ms": ms_b, "fused_vs_base": ms_f / ms_b, "unfused_vs_base": ms_u / ms_b})
                lf, lu = out_f["logits"].float(), out_u["logits"].float()
                rel = float((lf - lu).norm() / lu.norm().clamp_min(1e-30))
                agree = float((lf.argmax(-1) == lu.argmax(-1)).float().mean())
                row.update({"fused_ms": ms_f, "unfused_ms": ms_u, "fused_min_ms": min_f, "unfused_min_ms": min_u, "ratio": ms_f / ms_u,
                            "rel_err": rel, "argmax_agree": agree, "distinct_slots": len(set(slots)), "kernel_runs_per_step": calls / (args.steps + args.warmup)})
                print("batch %3d %-9s fused %8.3f ms  unfused %8.3f ms  x%.3f  base %s  rel %.2e  argmax %.3f  kernel runs/step %.1f"
                      % (batch, case, ms_f, ms_u, ms_f / ms_u, "%.3f ms" % row["base_ms"] if "base_ms" in row else "-", rel, agree, row["kernel_runs_per_step"]), flush=True)
            except Exception as e:  # noqa: BLE001 - one case failing leaves the others
                row["error"] = "%s: %s" % (type(e).__name__, e)
                traceback.print_exc()
                print("batch %3d %-9s FAILED %s" % (batch, case, row["error"]), flush=True)
            result["cases"].append(row)
            if "derivedRanks" not in result and bank._DERIVED:
                # The ranks derived from one projection's tables (slot 0 zeros, then 8/16/64 cycled).
                result["derivedRanks"] = next(iter(bank._DERIVED.values())).ranks[:8].tolist()
            write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
