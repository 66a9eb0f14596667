"""Summarizes a profiled serving run (`PROFILE=1 bash bench/gpu/serve/run.sh ...`): the torch
worker's cProfile (worker.prof) and Node's CPU profiles (*.cpuprofile) under DIR/prof, as the
functions with the most time of their own.

    python3 bench/gpu/serve/profile_summary.py DIR [--top 30]
"""
import argparse
import glob
import io
import json
import os
import pstats
from collections import defaultdict


def worker(path, top):
    out = io.StringIO()
    st = pstats.Stats(path, stream=out)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def node(path, top):
    prof = json.load(open(path))
    nodes = {n["id"]: n for n in prof["nodes"]}
    dts = prof.get("timeDeltas") or []
    samples = prof.get("samples") or []
    self_us = defaultdict(float)
    for sid, dt in zip(samples, dts):
        f = nodes[sid]["callFrame"]
        key = "%s %s:%d" % (f["functionName"] or "(anonymous)", os.path.basename(f["url"]) or "-", f["lineNumber"] + 1)
        self_us[key] += dt
    total = sum(self_us.values()) or 1.0
    lines = ["%s: %.2f s sampled" % (os.path.basename(path), total / 1e6)]
    for key, us in sorted(self_us.items(), key=lambda kv: -kv[1])[:top]:
        lines.append("  %7.1f ms %5.1f%%  %s" % (us / 1e3, 100 * us / total, key))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    prof = os.path.join(a.dir, "prof")
    w = os.path.join(prof, "worker.prof")
    if os.path.exists(w):
        print(worker(w, a.top))
    for p in sorted(glob.glob(os.path.join(prof, "*.cpuprofile"))):
        print(node(p, a.top))


if __name__ == "__main__":
    main()
