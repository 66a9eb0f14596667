"""Runs the torch worker with the profiler on its prefill runs (run.sh, PREFILL_PROF=1): the first
PREFILL_PROF_RUNS (default 8) `run` requests that append more than one position to a row, and for
comparison the first PREFILL_PROF_DECODE (default 2) decode runs after a prefill, each under
torch.profiler. PREFILL_PROF_OUT gets, per profiled run, its wall ms, rows and appended positions,
the device's kernel time (the sum of CUDA kernel self times) against the wall, the top kernels
and ops by device time and, on CUDA, the ops by host time (dispatch, and waits for the device):
whether a slow prefill is the host dispatching ops (kernel time well below the wall) or the
kernels themselves, and which. Without CUDA it profiles the CPU ops alone (the tests run it so)."""

import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from stageml_torch import worker as W

OUT = open(os.environ.get("PREFILL_PROF_OUT", "/tmp/prefill-prof.txt"), "w", buffering=1)
LEFT = {"prefill": int(os.environ.get("PREFILL_PROF_RUNS", "8")), "decode": int(os.environ.get("PREFILL_PROF_DECODE", "2"))}
SEEN_PREFILL = [False]
_orig = W.Worker._run_request


def _device_us(evt):
    for name in ("self_device_time_total", "self_cuda_time_total"):
        v = getattr(evt, name, None)
        if v is not None:
            return v
    return 0


def _table(events, cuda):
    keys = ("self_device_time_total", "self_cuda_time_total") if cuda else ("self_cpu_time_total",)
    for key in keys:
        try:
            return events.table(sort_by=key, row_limit=25)
        except (AttributeError, KeyError, ValueError):  # torch before the device_time names
            continue
    return events.table(row_limit=25)


def profiled(self, header, tensors):
    rows = (header.get("caches") or {}).get("rows") or []
    append = [int(r["append"][1]) for r in rows]
    kind = "prefill" if any(a > 1 for a in append) else "decode"
    if kind == "prefill":
        SEEN_PREFILL[0] = True
    if LEFT[kind] <= 0 or (kind == "decode" and not SEEN_PREFILL[0]):
        return _orig(self, header, tensors)
    LEFT[kind] -= 1
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        reply = _orig(self, header, tensors)
        sync()
    wall = (time.perf_counter() - t) * 1e3
    events = prof.key_averages()
    kernels = sum(_device_us(e) for e in events if "CUDA" in str(getattr(e, "device_type", ""))) / 1e3
    device = f"device kernels {kernels:.2f} ms ({100 * kernels / wall:.0f} % of the wall)" if cuda else "no CUDA device: CPU ops only"
    OUT.write(f"\n=== {kind} run: {len(rows)} rows, appended {sum(append)} positions (max {max(append) if append else 0} a row), "
              f"wall {wall:.2f} ms (profiled), {device}\n")
    OUT.write(_table(events, cuda) + "\n")
    if cuda:
        # The host's side: where its time went (op dispatch, and waits for the device such as
        # cudaStreamSynchronize or a blocking copy, which stall the ops queued behind them).
        OUT.write("host (self CPU time):\n" + events.table(sort_by="self_cpu_time_total", row_limit=15) + "\n")
    return reply


if __name__ == "__main__":
    W.Worker._run_request = profiled
    sys.exit(W.main(sys.argv[1:]))
