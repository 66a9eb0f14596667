"""The worker alone on the server's own work: sends the frames record.py recorded during a serving
run to a fresh worker, each as soon as the previous one's reply has arrived (no HTTP, no scheduler,
no host turnaround), and times each drive case's frames.

    python3 bench/gpu/serve/replay.py --record DIR --drive drive.json --out replay.json

A case's frames are those the worker read between the case's first request and its last [DONE]
(drive.py's `t0_unix` / `t1_unix`); every frame before them is replayed untimed, so the worker holds
what it held then (weights, programs, adapters, caches, captured graphs of earlier cases). Per case:
the replayed wall from sending its first frame to its last reply, the case's tokens ÷ that wall (the
rate the worker alone sustains on the same batch), and the served rate ÷ that rate (what the server
around the worker costs); each frame's replayed ms and op (`frames_ms`), the median run's ms and the
time the case's runs took beyond it (`over_median_ms`: its prefills, re-stagings and graph
captures). A reply that is not ok is counted under `failed` (the served run's
replies are not recorded: compare with its log). The replay sends the served run's inputs whatever
the replayed worker picks, so a step launched ahead is taken exactly where the replayed picks equal
the served ones (greedy steps of the same kernels: everywhere, in practice).
"""
import argparse
import json
import mmap
import os
import struct
import subprocess
import sys
import time


def read_exact(stream, n):
    """n bytes of a buffered stream (its read blocks until n bytes or the end)."""
    buf = stream.read(n)
    if len(buf) != n:
        raise SystemExit("replay: the worker's stdout ended inside a reply (%d of %d bytes); see its stderr log" % (len(buf), n))
    return buf


def read_reply(stream):
    (n,) = struct.unpack("<I", read_exact(stream, 4))
    header = json.loads(bytes(read_exact(stream, n)).decode("utf-8"))
    size = sum(int(t["nbytes"]) for t in header.get("tensors", []))
    if size:
        read_exact(stream, size)
    return header


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--drive", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    meta = json.load(open(os.path.join(a.record, "meta.json")))
    if meta.get("failed"):
        raise SystemExit("replay: the record is incomplete (%s)" % meta["failed"])
    index = [json.loads(line) for line in open(os.path.join(a.record, "index.jsonl")) if line.strip()]
    drive = json.load(open(a.drive))
    cases = [c for c in drive.get("cases", []) if "t0_unix" in c]
    env = dict(os.environ)
    env.update(meta["env"])
    log = open(os.path.join(os.path.dirname(os.path.abspath(a.out)), "replay-worker.log"), "w")
    child = subprocess.Popen([a.python, "-m", "stageml_torch.worker", *meta["argv"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=log, env=env)
    sent, got, failed = [], [], []
    with open(os.path.join(a.record, "frames.bin"), "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.path.getsize(f.name) else b""
        t_start = time.perf_counter()
        for i, fr in enumerate(index):
            if fr["op"] == "shutdown":
                break
            if fr["off"] + fr["len"] > len(data):
                raise SystemExit("replay: frame %d (%s) ends past the record's %d bytes (a truncated record)" % (i, fr["op"], len(data)))
            t0 = time.perf_counter()
            child.stdin.write(data[fr["off"]: fr["off"] + fr["len"]])
            child.stdin.flush()
            reply = read_reply(child.stdout)
            t1 = time.perf_counter()
            sent.append(t0)
            got.append(t1)
            if not reply.get("ok"):
                failed.append({"frame": i, "op": fr["op"], "code": reply.get("code"), "message": str(reply.get("message"))[:200]})
        replayed = len(sent)
        total = time.perf_counter() - t_start
    child.stdin.close()
    child.wait(timeout=120)
    out = {"frames": len(index), "replayed": replayed, "replay_s": total, "record_bytes": meta.get("bytes"),
           "record_write_s": meta.get("record_write_s"), "failed": failed[:20], "failed_count": len(failed), "cases": []}
    for c in cases:
        idx = [i for i, fr in enumerate(index[:replayed]) if c["t0_unix"] <= fr["t"] <= c["t1_unix"]]
        if not idx:
            continue
        lo, hi = idx[0], idx[-1]
        wall = got[hi] - sent[lo]
        busy = sum(got[i] - sent[i] for i in range(lo, hi + 1))
        runs = sum(1 for i in range(lo, hi + 1) if index[i]["op"] == "run")
        alone = c["tokens"] / wall if wall > 0 else None
        # Each frame's replayed time (ms, from sending it to its reply) and op: where the case's
        # fixed costs (prefills, re-stagings, graph captures) sit against its steady steps.
        frames_ms = [[index[i]["op"], round((got[i] - sent[i]) * 1e3, 3)] for i in range(lo, hi + 1)]
        runs_ms = sorted(ms for op, ms in frames_ms if op == "run")
        median = runs_ms[len(runs_ms) // 2] if runs_ms else None
        out["cases"].append({"kind": c["kind"], "streams": c["streams"], "frames": hi - lo + 1, "runs": runs, "wall_s": wall, "busy_s": busy,
                             "tokens": c["tokens"], "alone_tok_s": alone, "http_tok_s": c["tok_s"],
                             "http_over_alone": c["tok_s"] / alone if alone else None, "run_median_ms": median,
                             "over_median_ms": None if median is None else round(sum(max(0.0, ms - median) for op, ms in frames_ms if op == "run"), 3),
                             "frames_ms": frames_ms})
        print("%-9s streams %3d: worker alone %9.1f tok/s (%d frames, %d runs, %.1f ms), served %9.1f tok/s: served / alone %.2f" % (
            c["kind"], c["streams"], alone or 0, hi - lo + 1, runs, wall * 1e3, c["tok_s"], c["tok_s"] / alone if alone else 0), flush=True)
    if failed:
        print("replay: %d replies were not ok (first: %s)" % (len(failed), failed[0]), flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
