"""Runs the torch worker with a per-run trace (run.sh, TRACE=1): one JSON line per `run` request in
TRACE_OUT, with its wall times (frame handled, ms), its rows and appended positions, and what the
worker's counters say happened inside it (restaged, eager step, capture, replay, the step launched
ahead taken). Summarize with trace_summary.py: which runs of a case are slow, and why."""

import json
import os
import sys
import time

from stageml_torch import worker as W

OUT = open(os.environ.get("TRACE_OUT", "/tmp/worker-trace.jsonl"), "w", buffering=1)
T0 = time.perf_counter()
_orig = W.Worker._run_request


def traced(self, header, tensors):
    before = self.stats()
    t = time.perf_counter()
    try:
        return _orig(self, header, tensors)
    finally:
        after = self.stats()
        spec = header.get("caches") or {}
        rows = spec.get("rows") or []
        rec = {"t": round((t - T0) * 1e3, 3), "ms": round((time.perf_counter() - t) * 1e3, 3), "prog": header.get("handle"),
               "rows": len(rows), "append": sum(int(r["append"][1]) for r in rows),
               "cap": None if self.staged is None else self.staged.cap, "batch": None if self.staged is None else self.staged.rows}
        for k in ("restages", "joins", "graphEager", "graphCaptures", "graphCaptureUs", "graphPrimeUs", "graphPassUs", "graphReplays", "aheadHits", "stageUs", "launchUs", "pickUs"):
            d = after.get(k, 0) - before.get(k, 0)
            if d:
                rec[k] = d
        OUT.write(json.dumps(rec) + "\n")


W.Worker._run_request = traced
sys.exit(W.main(sys.argv[1:]))
