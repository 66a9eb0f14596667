"""Decode steps of the engine's program through the torch worker as `stageml serve --executor torch`
drives it: KV caches resident on the worker (seeded with random keys and values), slot tables
resident, each step sending ids, positions, the new key's mask and the row slots. With and without
the CUDA graphs of decode steps (native/stageml_torch/cudagraph.py, `STAGEML_TORCH_GRAPHS`), with and
without the slot linears through the bank kernel (`STAGEML_TORCH_FUSE`; `--fuse auto-nosets`: each
slot linear alone, `STAGEML_TORCH_BANK_SETS=0`).

    python3 bench/gpu/worker_graphs.py --graph .gpu/wbank/graph.json --out $OUT/worker_graphs.json
        [--batches 1,16,64] [--past 128] [--steps 24] [--kv auto,0]

The program and its inputs are what bench/gpu/prepare-engine-graph.ts wrote (graph.json +
manifest.json); weights and slot tables are drawn here (bench/gpu/worker_bank.py's draw_*). Every
configuration runs the same steps from the same seeds in a worker of its own; per step: the wall
time of the worker's `run` request and of writing its reply frame (to /dev/null; the outputs copied
to the host through protocol.write_frame; `run_ms`: the request alone, synchronized), median of the steps after the first 8; `device_ms`: the graph replay's own time on the GPU
(CUDA events around it), the step's kernels without the host's part of the request; the logits of
each step against the same configuration without graphs (relative error, argmax agreement).
`--reply full,lean` with the full reply and with a greedy one that leaves the new keys and values on the worker (`omit` + `argmax`);
the full reply's steps also time a greedy and a sampled reply (`reply_greedy_ms`, `reply_sample_ms`:
`ops.sample_rows` at top-p 0.95, temperature 0.8, then the frame with one id per row).
`--repeat N` runs the configurations N times over, interleaved (run-to-run spread), `--profile K`
K more steps under torch.profiler (kernels per step by name), `--kv auto` (the only value now: the
keys are appended in place by the `cachedAttention` handler, ops.op_cached_attention; the copying
comparison is a program written with that op decomposed).
"""
import argparse
import cProfile
import json
import pstats
import os
import re
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "native"))

import torch  # noqa: E402

import worker_bank as wb  # noqa: E402
from stageml_torch import ops, protocol  # noqa: E402
from stageml_torch.protocol import write_frame  # noqa: E402
from stageml_torch.worker import Worker  # noqa: E402

MASKED = -3.4028234663852886e38

# The device time of every CUDA graph replay (events on the replaying stream around
# torch.cuda.CUDAGraph.replay): the step's kernels without the host's part of the request. The
# events are read after the request (`replay_ms`): waiting for them inside it would hold back the
# host work the worker queues behind the replay (the cache commit) until the GPU is done.
REPLAY_EVENTS = []
_REPLAY = torch.cuda.CUDAGraph.replay


def _timed_replay(self):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    _REPLAY(self)
    e1.record()
    REPLAY_EVENTS.append((e0, e1))


def replay_ms():
    """The replays' GPU time since the last call (None without one), after a synchronize."""
    if not REPLAY_EVENTS:
        return None
    total = sum(e0.elapsed_time(e1) for e0, e1 in REPLAY_EVENTS)
    REPLAY_EVENTS.clear()
    return total


torch.cuda.CUDAGraph.replay = _timed_replay


_BEFORE_PINNED = {}


def write_frame_before(stream, header, tensors):
    """The reply's writing as it was before the tenth session (for `reply_before_ms`): each CUDA
    tensor copied to a pinned buffer in its own dtype and waited for, one by one, then widened to
    its wire storage on the host."""
    entries, payloads = [], []
    for name, t in tensors.items():
        key = (tuple(t.shape), t.dtype)
        buf = _BEFORE_PINNED.get(key)
        if buf is None:
            buf = _BEFORE_PINNED[key] = torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=True)
        buf.copy_(t, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        dtype = protocol.IR_DTYPE[t.dtype]
        w = buf.to(protocol.WIRE[dtype]).contiguous()
        data = memoryview(w.numpy()).cast("B")
        entries.append({"name": name, "dtype": dtype, "shape": list(w.shape), "nbytes": len(data)})
        payloads.append(data)
    body = json.dumps(dict(header, tensors=entries)).encode()
    stream.write(len(body).to_bytes(4, "little"))
    stream.write(body)
    for p in payloads:
        stream.write(p)
    stream.flush()


class _Counting:
    """A sink that counts the bytes written to it (the reply frame's size)."""

    def __init__(self, inner):
        self.inner, self.n = inner, 0

    def write(self, b):
        self.n += len(b)
        return self.inner.write(b)

    def flush(self):
        self.inner.flush()


def kernel_summary(prof, steps):
    """Per step: the CUDA kernels' total µs and launches by name (the profiled steps' device time)."""
    agg = {}
    for e in prof.events():
        if getattr(e, "device_type", None) is None or str(e.device_type) != "DeviceType.CUDA":
            continue
        r = agg.setdefault(e.name[:120], [0.0, 0])
        r[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        r[1] += 1
    rows = sorted(agg.items(), key=lambda kv: -kv[1][0])
    return {"total_us": sum(v[0] for _, v in rows) / steps, "kernels": [{"name": n, "us": v[0] / steps, "launches": v[1] / steps} for n, v in rows[:40]]}


_SEEDS = {}
# `--host-profile`: a cProfile.Profile around the worker's `run` requests of the timed steps.
HOST_PROFILE = [None]


def cache_seeds(batch, past, item, seed):
    """The rows' seeded keys and values (bf16, drawn on the device once per batch, context and seed:
    every configuration starts from the same caches)."""
    key = (batch, past, seed)
    if key not in _SEEDS:
        _SEEDS.clear()
        g = torch.Generator(device="cuda")
        g.manual_seed(seed + 1)
        _SEEDS[key] = {"cache:%d:%s" % (r + 1, name): (torch.randn([past] + it, generator=g, device="cuda") * 0.5).to(torch.bfloat16)
                       for r in range(batch) for name, it in item.items()}
    return _SEEDS[key]


def run_config(graph, manifest, params, tables, batch, past, steps, fuse, graphs, seed, profile=0, kv="auto", lean=False):
    # "auto-nosets": the bank kernel with every slot linear a step of its own (STAGEML_TORCH_BANK_SETS=0)
    if kv != "auto":
        raise SystemExit("--kv %s: the in-place KV append is the cachedAttention handler's, not a switch (write the program with the op decomposed to compare)" % kv)
    os.environ["STAGEML_TORCH_BANK_SETS"] = "0" if fuse == "auto-nosets" else "auto"
    os.environ["STAGEML_TORCH_FUSE"] = "auto" if fuse == "auto-nosets" else fuse
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
    times, run_times, logits, reply_times, reply_before_times, reply_greedy_times, reply_sample_times, reply_bytes = [], [], [], [], [], [], [], []
    sink = open(os.devnull, "wb")
    names = {n: i for i, n in enumerate(sorted(tables))}
    prof_all = None
    device_times = []
    for s in range(steps):
        tensors = {"input_ids": torch.randint(0, vocab, (batch, 1), generator=gen), "position_ids": torch.full((batch, 1), past + s, dtype=torch.int64),
                   "attention_mask": torch.zeros((batch, 1), dtype=torch.float32)}
        if "row_slot" in takes:
            tensors["row_slot"] = torch.tensor(slots, dtype=torch.int64)
        header = {"op": "run", "handle": h, "caches": {"streams": streams, "rows": [{"id": r + 1, "append": [0, 1]} for r in range(batch)]}}
        if lean:
            # The engine's greedy step without its host KV copy (RunOptions.omit + argmax): the
            # step's keys and values stay in the worker's caches, one i64 per row comes back.
            header["omit"] = [st["from"] for st in streams if st["from"] is not None]
            header["argmax"] = ["logits"]
        if s == 0:
            header["store"] = {n: i for n, i in names.items()}
            tensors.update(tables)
            tensors.update(cache_seeds(batch, past, item, seed))
            for r in range(batch):
                tensors["cache:%d:attention_mask" % (r + 1)] = torch.zeros((past,), dtype=torch.float32)
        else:
            header["resident"] = {n: i for n, i in names.items()}
        if profile and s == steps - profile:
            # the last `profile` steps under the profiler (not among the timed ones)
            prof_all = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof_all.__enter__()
        torch.cuda.synchronize()
        REPLAY_EVENTS.clear()
        t0 = time.perf_counter()
        if HOST_PROFILE[0] is not None and s >= 8:
            HOST_PROFILE[0].enable()
        reply, out = w.handle(header, tensors)
        if HOST_PROFILE[0] is not None and s >= 8:
            torch.cuda.synchronize()
            HOST_PROFILE[0].disable()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        t2 = time.perf_counter()
        counted = _Counting(sink)
        write_frame(counted, reply, out)  # what the worker does with the reply: the outputs to host bytes, written
        times.append((time.perf_counter() - t0) * 1e3)
        reply_times.append((time.perf_counter() - t2) * 1e3)
        reply_bytes.append(counted.n)
        if not lean:
            t3 = time.perf_counter()
            write_frame_before(sink, reply, out)
            reply_before_times.append((time.perf_counter() - t3) * 1e3)
            # a greedy step's reply (RunOptions.argmax: each row's index of its largest logit instead of the logits)
            if hasattr(ops, "argmax_rows"):  # (a worker before the tenth session has none)
                t4 = time.perf_counter()
                write_frame(sink, reply, dict(out, logits=ops.argmax_rows(out["logits"])))
                reply_greedy_times.append((time.perf_counter() - t4) * 1e3)
            # a sampled step's reply (RunOptions.sample: each row's token drawn on the device, top-p
            # 0.95 at temperature 0.8, instead of the logits), the draw's sort and scans included
            if hasattr(ops, "sample_rows"):  # (a worker before the twelfth session has none)
                n = out["logits"].numel() // out["logits"].shape[-1]
                t5 = time.perf_counter()
                picks = ops.sample_rows(out["logits"], [0.8] * n, [0] * n, [0.95] * n, [((s * 7919 + r * 104729) % 1000) / 1000 for r in range(n)])
                write_frame(sink, reply, dict(out, logits=picks))
                reply_sample_times.append((time.perf_counter() - t5) * 1e3)
        # lean: the picks themselves (compared with the full reply's argmax by the caller)
        lg = out["logits"].cpu() if lean else out["logits"].float().cpu()
        run_times.append((t1 - t0) * 1e3)
        device_times.append(replay_ms())
        if not reply.get("ok"):
            raise RuntimeError(str(reply))
        logits.append(lg)
        if profile and s == steps - 1:
            prof_all.__exit__(None, None, None)
    stats = dict(w.graphs.stats)
    w.handle({"op": "dispose", "handle": h}, {})
    timed = slice(8, steps - profile)
    dev = [t for t in device_times[timed] if t is not None]
    res = {"cache_concats": prep.get("cacheConcats"), "device_ms": statistics.median(dev) if dev else None, "ms": statistics.median(times[timed]), "ms_min": min(times[timed]), "run_ms": statistics.median(run_times[timed]), "reply_ms": statistics.median(reply_times[timed]), "reply_before_ms": statistics.median(reply_before_times[timed]) if reply_before_times else None, "reply_bytes": statistics.median(reply_bytes[timed]), "reply_greedy_ms": statistics.median(reply_greedy_times[timed]) if reply_greedy_times else None, "reply_sample_ms": statistics.median(reply_sample_times[timed]) if reply_sample_times else None, "first_ms": times[:3], "graphs": stats}
    if profile:
        res["profile"] = kernel_summary(prof_all, profile)
    return res, logits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--past", type=int, default=128)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", type=int, default=0, help="profile this many more steps after the timed ones: their kernels per step by name (torch.profiler)")
    ap.add_argument("--repeat", type=int, default=1, help="run the batch's configurations this many times over, interleaved")
    ap.add_argument("--fuse", default="auto,0", help="the 64-adapter program's configurations: auto (bank kernel, sibling projections as sets), auto-nosets (each slot linear alone), 0 (unfused ops)")
    ap.add_argument("--host-profile", action="store_true", help="cProfile the worker's run requests of the timed steps (graphs on): the host's functions by own time, per configuration")
    ap.add_argument("--reply", default="full", help="the steps' replies: full (logits and the new keys and values, as with the engine's host KV copy), lean (RunOptions.omit of the new keys and values + argmax of the logits: a greedy step of the engine without the copy)")
    ap.add_argument("--kv", default="auto", help="auto only: the cachedAttention handler appends the keys in place")
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
    configs = ([("base program", base)] if base is not None else []) + [(fuse, graph) for fuse in args.fuse.split(",")]
    kvs = args.kv.split(",")
    if kvs != ["auto"]:
        configs = [("%s kv=%s" % (name, kv), prog) for kv in kvs for name, prog in configs]
    replies = args.reply.split(",")
    if any(r not in ("full", "lean") for r in replies):
        ap.error("--reply takes full and/or lean, not %r" % args.reply)
    configs = [(name + (" lean" if r == "lean" else ""), prog) for r in replies for name, prog in configs]
    for batch in [int(b) for b in args.batches.split(",")]:
        seen = {}  # config -> its graphed logits (first pass): configurations against each other, repeats against the first
        for rep in range(args.repeat):
            for name, prog in configs:
                # the engine's base program (no slot tables) is what the 64-adapter step is held against
                m = re.match(r"^(?P<plain>.*?)(?: kv=(?P<kv>\S+))?(?P<lean> lean)?$", name)
                plain, kv, lean = m.group("plain"), m.group("kv") or "auto", bool(m.group("lean"))
                fuse = "0" if plain == "base program" else plain
                row = {"batch": batch, "fuse": name, "kv": kv, "reply": "lean" if lean else "full", "repeat": rep}
                try:
                    if args.host_profile:
                        HOST_PROFILE[0] = cProfile.Profile()
                    graphed, lg = run_config(prog, manifest, params, tables, batch, args.past, args.steps, fuse, True, args.seed, args.profile, kv, lean)
                    if args.host_profile:
                        st = pstats.Stats(HOST_PROFILE[0])
                        steps_n = args.steps - 8
                        top = sorted(st.stats.items(), key=lambda kv_: -kv_[1][2])[:30]
                        graphed["host_profile"] = [{"fn": "%s:%d %s" % (f[0].split("/")[-1], f[1], f[2]), "calls": v[1] / steps_n, "own_ms": v[2] * 1e3 / steps_n, "cum_ms": v[3] * 1e3 / steps_n} for f, v in top]
                        HOST_PROFILE[0] = None
                        print("  host profile per step (own ms): " + "; ".join("%s %.2f/%d" % (r["fn"][:60], r["own_ms"], r["calls"]) for r in graphed["host_profile"][:14]), flush=True)
                    row.update({"graphs": graphed, "tok_s_graphs": batch * 1000.0 / graphed["ms"]})
                    if rep == 0:
                        for other, lo in seen.items():
                            if other.startswith("base program") != name.startswith("base program"):
                                continue  # only the same program in another setting
                            if lean and other == name[: -len(" lean")]:
                                # the picks against the full reply's logits of the same configuration
                                agree = statistics.mean(float((x == y.argmax(-1).reshape(x.shape)).float().mean()) for x, y in zip(lg, lo))
                                row["picks_agree_vs_full"] = agree
                                print("batch %3d %s picks against %s's argmax: %.3f" % (batch, name, other, agree), flush=True)
                            elif lean and other.endswith(" lean"):
                                # two greedy settings of one program: the fraction of equal picks
                                agree = statistics.mean(float((x == y).float().mean()) for x, y in zip(lg, lo))
                                row.setdefault("picks_agree_vs", {})[other] = agree
                                print("batch %3d %s picks against %s: %.3f" % (batch, name, other, agree), flush=True)
                            elif not lean and not other.endswith(" lean"):
                                rel = max(float((x - y).norm() / y.norm()) for x, y in zip(lg, lo))
                                row.setdefault("max_rel_err_vs", {})[other] = rel
                                print("batch %3d %s against %s: max rel %.2e" % (batch, name, other, rel), flush=True)
                        seen[name] = lg
                    if rep == 0:
                        eager, le = run_config(prog, manifest, params, tables, batch, args.past, args.steps, fuse, False, args.seed, 0, kv, lean)
                        row.update({"eager": eager, "speedup": eager["ms"] / graphed["ms"], "tok_s_eager": batch * 1000.0 / eager["ms"]})
                        if lean:
                            # every replay's picks against eager's (a replay that reused an earlier
                            # step's argmax as its logits would disagree from the second on)
                            row["max_rel_err_vs_eager"] = None
                            row["argmax_agree_vs_eager"] = statistics.mean(float((x == y).float().mean()) for x, y in zip(lg, le))
                        else:
                            row["max_rel_err_vs_eager"] = max(float((x - y).norm() / y.norm()) for x, y in zip(lg, le))
                            row["argmax_agree_vs_eager"] = statistics.mean(float((x.argmax(-1) == y.argmax(-1)).float().mean()) for x, y in zip(lg, le))
                        print("batch %3d %-12s eager %8.2f ms (run %.2f)  graphs %8.2f ms (run %.2f, device %.2f, reply %.2f / %d B, before %.2f, greedy %.2f, sampled %.2f)  x%.2f  rel %.2e argmax %.3f  %s" % (
                            batch, name, eager["ms"], eager["run_ms"], graphed["ms"], graphed["run_ms"], graphed["device_ms"] or 0, graphed["reply_ms"], graphed["reply_bytes"], graphed["reply_before_ms"] or 0, graphed["reply_greedy_ms"] or 0, graphed["reply_sample_ms"] or 0, row["speedup"], row["max_rel_err_vs_eager"] or 0,
                            row["argmax_agree_vs_eager"], graphed["graphs"]), flush=True)
                    else:
                        if name in seen and not lean:
                            # the same configuration again: the logits' run-to-run spread
                            row["max_rel_err_vs_first_pass"] = max(float((x - y).norm() / y.norm()) for x, y in zip(lg, seen[name]))
                            print("batch %3d %s against its first pass: max rel %.2e" % (batch, name, row["max_rel_err_vs_first_pass"]), flush=True)
                        print("batch %3d %-12s (repeat %d) graphs %8.2f ms (run %.2f, device %.2f, reply %.2f, before %.2f, greedy %.2f)" % (
                            batch, name, rep, graphed["ms"], graphed["run_ms"], graphed["device_ms"] or 0, graphed["reply_ms"], graphed["reply_before_ms"] or 0, graphed["reply_greedy_ms"] or 0), flush=True)
                    if args.profile:
                        pr = graphed["profile"]
                        print("  kernels %.0f us/step: %s" % (pr["total_us"], "; ".join("%s %.0f/%d" % (k["name"][:48], k["us"], k["launches"]) for k in pr["kernels"][:8])), flush=True)
                except Exception as ex:  # noqa: BLE001 - one case failing leaves the others
                    row["error"] = "%s: %s" % (type(ex).__name__, str(ex)[:400])
                    traceback.print_exc()
                res["cases"].append(row)
                with open(args.out, "w") as f:
                    json.dump(res, f, indent=1)
                torch.cuda.empty_cache()

if __name__ == "__main__":
    main()
