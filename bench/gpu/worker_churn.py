"""Decode steps of the engine's program through the torch worker while sequences come and go, as
the server's scheduler drives it: `--rows` live caches, and every `--every` decode steps the oldest
one is dropped (`cache_drop`) and a new sequence's prompt is prefilled (one chunk run of `--chunk`
tokens), then it joins the decode steps. Run it once per worker (PYTHONPATH picks the
`stageml_torch` package: this checkout's native/ or an older one) to compare how the worker keeps
its cache batch across such changes: the wall time of each decode step and prefill run (the
request synchronized; greedy lean replies, the new keys and values omitted, as the engine asks),
and the worker's counters (re-stagings, rows joined, CUDA graph captures and replays).

    PYTHONPATH=native python3 bench/gpu/worker_churn.py --graph .gpu/w1b/graph.json --out $OUT/churn.json

The program and its inputs are what bench/gpu/prepare-engine-graph.ts wrote (graph.json +
manifest.json beside it); weights and slot tables are drawn here (worker_bank.py's draw_*).
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from stageml_torch.worker import Worker  # noqa: E402
from worker_bank import draw_params, draw_tables  # noqa: E402

MASKED = -3.4028234663852886e38
ROW_INPUTS = ["input_ids", "position_ids", "attention_mask", "row_slot"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", required=True)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--past", type=int, default=128, help="each new sequence's prompt (its prefill chunk)")
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--label", default="")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a check of the script with a small program)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.graph) as f:
        graph = json.load(f)
    with open(os.path.join(os.path.dirname(os.path.abspath(args.graph)), "manifest.json")) as f:
        manifest = json.load(f)
    dev = args.device
    cuda = dev.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    params = draw_params(manifest, dev, gen)
    tables = draw_tables(manifest, dev, gen)
    w = Worker(dev)
    prep = w.handle({"op": "prepare", "graph": graph}, dict(params))[0]
    h = prep["handle"]
    takes = set(prep["inputs"])
    tables = {k: v for k, v in tables.items() if k in takes}
    names = {n: i for i, n in enumerate(sorted(tables))}
    layers = sum(1 for i in manifest["inputs"] if i["name"].startswith("past_key."))
    streams = [{"input": "past_%s.%d" % (kv, l), "from": "new_%s.%d" % (kv, l), "pad": 0, "store": None} for l in range(layers) for kv in ("key", "value")]
    streams.append({"input": "attention_mask", "from": None, "pad": MASKED, "store": None})
    omit = [s["from"] for s in streams if s["from"] is not None]
    vocab = manifest["config"]["vocab_size"]
    slots_n = manifest["slots"]
    cpu = torch.Generator()
    cpu.manual_seed(2)
    stored = [False]

    def run(rows, tensors):
        header = {"op": "run", "handle": h, "caches": {"streams": streams, "rows": rows, "rowInputs": ROW_INPUTS}, "omit": omit, "argmax": ["logits"]}
        if not stored[0]:
            header["store"] = dict(names)
            tensors.update(tables)
            stored[0] = True
        else:
            header["resident"] = dict(names)
        sync()
        t0 = time.perf_counter()
        reply, out = w.handle(header, tensors)
        sync()
        if not reply.get("ok"):
            raise RuntimeError(str(reply))
        return (time.perf_counter() - t0) * 1e3, out

    live = []  # [cid, length, slot]
    next_id = [1]

    def prefill(n):
        """n new sequences, their prompts prefilled in one chunk run."""
        new = []
        for _ in range(n):
            new.append([next_id[0], 0, next_id[0] % slots_n])
            next_id[0] += 1
        c = args.past
        tensors = {"input_ids": torch.randint(0, vocab, (n, c), generator=cpu), "position_ids": torch.arange(c, dtype=torch.int64).repeat(n, 1),
                   "attention_mask": torch.zeros((n, c), dtype=torch.float32), "row_slot": torch.tensor([r[2] for r in new], dtype=torch.int64)}
        ms, _ = run([{"id": r[0], "append": [0, c]} for r in new], tensors)
        for r in new:
            r[1] = c
        live.extend(new)
        return ms

    prefill(args.rows)
    decode_ms, prefill_ms = [], []
    t_start = time.perf_counter()
    for s in range(args.steps):
        if s > 0 and s % args.every == 0:
            gone = live.pop(0)
            w.handle({"op": "cache_drop", "ids": [gone[0]]}, {})
            prefill_ms.append(prefill(1))
        n = len(live)
        tensors = {"input_ids": torch.randint(0, vocab, (n, 1), generator=cpu), "position_ids": torch.tensor([[r[1]] for r in live], dtype=torch.int64),
                   "attention_mask": torch.zeros((n, 1), dtype=torch.float32), "row_slot": torch.tensor([r[2] for r in live], dtype=torch.int64)}
        ms, out = run([{"id": r[0], "append": [0, 1]} for r in live], tensors)
        if out["logits"].shape[0] != n:
            raise RuntimeError("logits for %d rows, the step has %d" % (out["logits"].shape[0], n))
        decode_ms.append(ms)
        for r in live:
            r[1] += 1
    total = (time.perf_counter() - t_start) * 1e3
    stats = w.stats() if hasattr(w, "stats") else dict(w.counts if hasattr(w, "counts") else {}, **{"graph" + k.capitalize(): v for k, v in w.graphs.stats.items()})
    res = {"label": args.label, "rows": args.rows, "past": args.past, "steps": args.steps, "every": args.every,
           "decode_ms_median": statistics.median(decode_ms[8:]), "decode_ms_mean": statistics.mean(decode_ms[8:]), "prefill_ms_median": statistics.median(prefill_ms) if prefill_ms else None,
           "total_ms": total, "decode_tokens_per_s": 1000.0 * sum(1 for _ in decode_ms) * args.rows / total, "stats": stats, "device": torch.cuda.get_device_name() if cuda else "cpu"}
    print(json.dumps(res))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
