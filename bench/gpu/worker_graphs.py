"""Decode steps of the engine's program through the torch worker as `stageml serve --executor torch`
drives it: KV caches resident on the worker (seeded with random keys and values), slot tables
resident, each step sending ids, positions, the new key's mask and the row slots. With and without
the CUDA graphs of decode steps (native/stageml_torch/cudagraph.py, `STAGEML_TORCH_GRAPHS`), with and
without the slot linears through the bank kernel (`STAGEML_TORCH_FUSE`).

    python3 bench/gpu/worker_graphs.py --graph .gpu/wbank/graph.json --out $OUT/worker_graphs.json
        [--batches 1,16,64] [--past 128] [--steps 24]

The program and its inputs are what bench/gpu/prepare-engine-graph.ts wrote (graph.json +
manifest.json); weights and slot tables are drawn here (bench/gpu/worker_bank.py's draw_*). Every
configuration runs the same steps from the same seeds in a worker of its own; per step: the wall
time of the worker's `run` request and of writing its reply frame (to /dev/null; the outputs copied
to the host through protocol.write_frame; `run_ms`: the request alone, synchronized), median of the steps after the first 8; the logits of each step against the
same configuration without graphs (relative error, argmax agreement).
"""
import argparse
import json
import os
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "native"))

import torch  # noqa: E402

import worker_bank as wb  # noqa: E402
from stageml_torch.protocol import write_frame  # noqa: E402
from stageml_torch.worker import Worker  # noqa: E402

MASKED = -3.4028234663852886e38


def run_config(graph, manifest, params, tables, batch, past, steps, fuse, graphs, seed):
    os.environ["STAGEML_TORCH_FUSE"] = fuse
    os.environ["STAGEML_TORCH_GRAPHS"] = "auto" if graphs else "0"
    w = Worker("cuda")
    prep = w.handle({"op": "prepare", "graph": graph}, dict(params))[0]
    h = prep["handle"]
    takes = set(prep["inputs"])
    tables = {k: v for k, v in tables.items() if k in takes}
    layers = sum(1 for i in manifest["inputs"] if i["name"].startswith("past_key."))
    streams = [{"input": "past_%s.%d" % (kv, l), "from": "new_%s.%d" % (kv, l), "pad": 0, "store": None} for l in range(layers) for kv in ("key", "value")]
    streams.append({"input": "attention_mask", "from": None, "pad": MASKED, "store": None})
    item = {i["name"]: [int(d) for d in i["shape"][2:]] for i in manifest["inputs"] if i["name"].startswith("past_")}
    gen = torch.Generator()
    gen.manual_seed(seed)
    slots = [1 + (i % (manifest["slots"] - 1)) for i in range(batch)]
    vocab = manifest["config"]["vocab_size"]
    times, run_times, logits = [], [], []
    sink = open(os.devnull, "wb")
    names = {n: i for i, n in enumerate(sorted(tables))}
    for s in range(steps):
        tensors = {"input_ids": torch.randint(0, vocab, (batch, 1), generator=gen), "position_ids": torch.full((batch, 1), past + s, dtype=torch.int64),
                   "attention_mask": torch.zeros((batch, 1), dtype=torch.float32)}
        if "row_slot" in takes:
            tensors["row_slot"] = torch.tensor(slots, dtype=torch.int64)
        header = {"op": "run", "handle": h, "caches": {"streams": streams, "rows": [{"id": r + 1, "append": [0, 1]} for r in range(batch)]}}
        if s == 0:
            header["store"] = {n: i for n, i in names.items()}
            tensors.update(tables)
            for r in range(batch):
                for name, it in item.items():
                    tensors["cache:%d:%s" % (r + 1, name)] = (torch.randn([past] + it, generator=gen) * 0.5).to(torch.bfloat16)
                tensors["cache:%d:attention_mask" % (r + 1)] = torch.zeros((past,), dtype=torch.float32)
        else:
            header["resident"] = {n: i for n, i in names.items()}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        reply, out = w.handle(header, tensors)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        write_frame(sink, reply, out)  # what the worker does with the reply: the outputs to host bytes, written
        times.append((time.perf_counter() - t0) * 1e3)
        lg = out["logits"].float().cpu()
        run_times.append((t1 - t0) * 1e3)
        if not reply.get("ok"):
            raise RuntimeError(str(reply))
        logits.append(lg)
    stats = dict(w.graphs.stats)
    w.handle({"op": "dispose", "handle": h}, {})
    return {"ms": statistics.median(times[8:]), "ms_min": min(times[8:]), "run_ms": statistics.median(run_times[8:]), "first_ms": times[:3], "graphs": stats}, logits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--past", type=int, default=128)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with open(args.graph) as f:
        graph = json.load(f)
    with open(os.path.join(os.path.dirname(os.path.abspath(args.graph)), "manifest.json")) as f:
        manifest = json.load(f)
    res = {"suite": "worker-graphs", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "config": manifest["config"], "form": manifest["form"], "slots": manifest["slots"], "rank": manifest["rank"], "past": args.past, "steps": args.steps, "cases": []}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    params = wb.draw_params(manifest, "cuda", gen)
    # Slot tables stored into each worker from the device (a frame would bring them from the host
    # once; the steps timed here read them where they live either way).
    tables = wb.draw_tables(manifest, "cuda", gen)
    torch.backends.cuda.matmul.allow_tf32 = False
    base_path = os.path.join(os.path.dirname(os.path.abspath(args.graph)), "base.json")
    base = json.load(open(base_path)) if os.path.exists(base_path) else None
    for batch in [int(b) for b in args.batches.split(",")]:
        if base is not None:
            # the engine's base program (no slot tables): what the 64-adapter step is held against
            row = {"batch": batch, "fuse": "base program"}
            try:
                eager, le = run_config(base, manifest, params, tables, batch, args.past, args.steps, "0", False, args.seed)
                graphed, lg = run_config(base, manifest, params, tables, batch, args.past, args.steps, "0", True, args.seed)
                row.update({"eager": eager, "graphs": graphed, "speedup": eager["ms"] / graphed["ms"],
                            "max_rel_err_vs_eager": max(float((a - b).norm() / b.norm()) for a, b in zip(lg, le))})
                print("batch %3d base program eager %8.2f ms (run %.2f)  graphs %8.2f ms (run %.2f)  x%.2f  rel %.2e" % (batch, eager["ms"], eager["run_ms"], graphed["ms"], graphed["run_ms"], row["speedup"], row["max_rel_err_vs_eager"]), flush=True)
            except Exception as ex:  # noqa: BLE001
                row["error"] = "%s: %s" % (type(ex).__name__, str(ex)[:400])
                traceback.print_exc()
            res["cases"].append(row)
        for fuse in ("auto", "0"):
            row = {"batch": batch, "fuse": fuse}
            try:
                eager, le = run_config(graph, manifest, params, tables, batch, args.past, args.steps, fuse, False, args.seed)
                graphed, lg = run_config(graph, manifest, params, tables, batch, args.past, args.steps, fuse, True, args.seed)
                rel = max(float((a - b).norm() / b.norm()) for a, b in zip(lg, le))
                agree = statistics.mean(float((a.argmax(-1) == b.argmax(-1)).float().mean()) for a, b in zip(lg, le))
                row.update({"eager": eager, "graphs": graphed, "speedup": eager["ms"] / graphed["ms"], "max_rel_err_vs_eager": rel, "argmax_agree_vs_eager": agree,
                            "tok_s_graphs": batch * 1000.0 / graphed["ms"], "tok_s_eager": batch * 1000.0 / eager["ms"]})
                print("batch %3d fuse %-4s eager %8.2f ms (run %.2f)  graphs %8.2f ms (run %.2f)  x%.2f  rel %.2e argmax %.3f  %s" % (batch, fuse, eager["ms"], eager["run_ms"], graphed["ms"], graphed["run_ms"], row["speedup"], rel, agree, graphed["graphs"]), flush=True)
            except Exception as ex:  # noqa: BLE001 - one case failing leaves the others
                row["error"] = "%s: %s" % (type(ex).__name__, str(ex)[:400])
                traceback.print_exc()
            res["cases"].append(row)
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
