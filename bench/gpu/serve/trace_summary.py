"""Summarizes a worker trace (trace.py): per case (runs separated by >= 0.3 s of quiet), the run
count, the wall from the first run to the last, the steady decode run's median, and every run
slower than twice that median with what happened inside it.
  python3 bench/gpu/serve/trace_summary.py TRACE.jsonl"""

import json
import statistics
import sys

runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
cases, cur = [], []
for r in runs:
    if cur and r["t"] - (cur[-1]["t"] + cur[-1]["ms"]) > 300:
        cases.append(cur)
        cur = []
    cur.append(r)
if cur:
    cases.append(cur)
for c in cases:
    steady = [r["ms"] for r in c if r.get("graphReplays") and r["append"] == r["rows"]]
    med = statistics.median(steady) if steady else statistics.median(r["ms"] for r in c)
    gaps = [b["t"] - (a["t"] + a["ms"]) for a, b in zip(c, c[1:])]
    print("case: %d runs, max rows %d, wall %.1f ms, busy %.1f ms, steady run p50 %.2f ms, gap p50 %.2f ms" % (
        len(c), max(r["rows"] for r in c), c[-1]["t"] + c[-1]["ms"] - c[0]["t"], sum(r["ms"] for r in c), med,
        statistics.median(gaps) if gaps else 0))
    for i, r in enumerate(c):
        if r["ms"] > 2 * med or r["append"] != r["rows"] or i < 2:
            extra = {k: v for k, v in r.items() if k not in ("t", "ms", "prog", "rows", "append")}
            print("   #%-3d +%7.1f ms  %7.2f ms  rows %3d append %5d  %s" % (i, r["t"] - c[0]["t"], r["ms"], r["rows"], r["append"], extra))
