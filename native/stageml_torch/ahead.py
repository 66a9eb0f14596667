"""The next decode step, launched before its request arrives.

A served decode batch repeats one request shape step after step: the same program, the same rows
appending one position each, every row's next token the greedy pick of the step before, its
position one further, the slots and the key mask's tail unchanged. Between two steps the device
would wait for the reply to reach the host, the host to take the tokens and build the next
request, and the worker to read and stage it — a few milliseconds a step, as long as a 1B
model's whole step on an H100. So after a graphed greedy step the worker queues the step its next
request will most likely be — the same graph replayed on the picks it just made, still on the
device — before it waits for this step's picks to reach the host; the device runs it while the
host works.

When the request arrives it is compared with what was launched: the same header (program, rows,
picks, omissions, resident inputs; nothing stored or dropped) and the same inputs, the token ids
equal to the picks replied and the positions one further. Equal: its outputs are the request's and
its positions are appended to the caches only now (nothing is committed before); anything else:
the launched step is dropped — it changed nothing the next run reads (the graph's own buffers and
the pad put back after an in-place append) — and the request runs as it would have. Any other
request (loads, writes, cache drops, disposals) drops it first.

A step is launched ahead only where that is safe without the host's checks: a replayed CUDA graph
(`StepGraphs.replayed`), one argmax output and no sampled or processed rows, every cache of the
run in the staged batch with room for one more position, the next positions within the bounds
the graph's index inputs were checked against, and the picks within the token ids' bound.
"""

import sys

import torch

TOKENS = "input_ids"
POSITIONS = "position_ids"


def _signature(header):
    """Everything of a run request but its id and tensor table. Compared with `==` (nested dicts
    and lists, in C: ~11 µs for a 64-row request's header, where its canonical JSON took ~120 µs
    on the step's critical path). The header is parsed JSON the worker does not change."""
    return {k: v for k, v in header.items() if k not in ("id", "tensors")}


def _same(a, b):
    if a.keys() != b.keys():
        return False
    for name, t in a.items():
        u = b[name]
        if t.shape != u.shape or t.dtype != u.dtype or not torch.equal(t, u):
            return False
    return True


class Ahead:
    """The worker's step launched ahead (at most one) and its counters (`ahead`: steps launched,
    `aheadHits`: those a request took)."""

    def __init__(self, worker):
        self.w = worker
        self.pending = None
        self.stats = {"ahead": 0, "aheadHits": 0}
        self.warned = False

    def discard(self, sync=False):
        """Drops the step launched ahead (its counts taken back); `sync`: wait for the device to
        finish it first (before a request that frees or rewrites what it reads)."""
        p, self.pending = self.pending, None
        if p is None:
            return
        for k, v in p["counts"].items():
            self.w.counts[k] -= v
        for k, v in p["graph_counts"].items():
            self.w.graphs.stats[k] -= v
        if sync and p["cuda"]:
            torch.cuda.synchronize(p["device"])

    def take(self, prog, header, sent):
        """The launched step's (outputs, commit, graphed) when it is this request's, else None
        (and it is dropped)."""
        p = self.pending
        if p is None:
            return None
        if p["prog"] is not prog or p["signature"] != _signature(header) or not _same(sent, p["expect"]()):
            self.discard()
            return None
        self.pending = None
        self.stats["aheadHits"] += 1
        return p["out"], p["commit"], True

    def launch(self, prog, header, sent, out, sample):
        """Queues the step after this one (`out` are this step's outputs, on the device) where
        that is safe. Returns None where it did not (the reply takes `out` as it is), else this
        step's outputs on their way to the host and the event to wait for before reading them
        (the copies do not wait for the step queued behind them)."""
        argmax = header.get("argmax") or []
        w = self.w
        e = w.graphs.replayed
        if e is None or len(argmax) != 1 or sample or header.get("sample") or header.get("store") or header.get("drop") or w.tp_world > 1:
            return None
        pick = argmax[0]
        if TOKENS not in sent or POSITIONS not in sent or set(out) != {pick} or any(k.startswith("cache:") for k in sent):
            return None
        ids, pos = sent[TOKENS], sent[POSITIONS]
        if ids.dtype.is_floating_point or pos.dtype.is_floating_point or ids.numel() == 0 or ids.numel() != out[pick].numel():
            return None
        st = w.staged
        rows = (header.get("caches") or {}).get("rows") or []
        if st is None or not rows:
            return None
        for r in rows:
            c = w.caches.get(r["id"])
            if c is None or c.staged is not st or c.length + 1 > st.cap:
                return None
        if st.rows >= 8 and 4 * st.used() <= st.rows:
            return None
        bounds = dict(e.checks)
        width = prog.value_types[dict(prog.outputs)[pick]][2][-1]
        if TOKENS in bounds and not (isinstance(width, int) and width <= bounds[TOKENS]):
            return None
        nxt = pos + 1
        if POSITIONS in bounds and int(nxt.max()) >= bounds[POSITIONS]:
            return None
        picks = out[pick]
        cuda = picks.is_cuda
        host, done = picks, None
        if cuda:
            host = torch.empty(picks.shape, dtype=picks.dtype, pin_memory=True)
            host.copy_(picks, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        feed = dict(sent)
        feed[TOKENS] = picks.reshape(ids.shape).to(ids.dtype)
        feed[POSITIONS] = nxt
        before, graph_before = dict(w.counts), dict(w.graphs.stats)

        def restore():
            for k in w.counts:
                w.counts[k] = before.get(k, 0)
            w.graphs.stats.update(graph_before)

        try:
            got, commit, graphed = w._run(prog, header, feed, {}, header.get("omit") or [])
        except Exception as ex:  # noqa: BLE001 - a step launched ahead never fails a request
            restore()
            if not self.warned:
                self.warned = True
                print("stageml_torch: a decode step launched ahead failed (%s: %s); requests run as sent" % (type(ex).__name__, str(ex)[:300]), file=sys.stderr)
            if cuda:
                torch.cuda.synchronize(picks.device)
            return {pick: host}, done
        if not graphed or w.graphs.replayed is not e:
            # It did not replay this step's graph (a new key): not the step the request will be.
            restore()
            return {pick: host}, done
        self.stats["ahead"] += 1
        self.pending = {
            "prog": prog,
            "signature": _signature(header),
            # The request it stands for: this one's inputs, the picks (as replied) for the token
            # ids, the positions one further.
            "expect": lambda: {**sent, TOKENS: host.reshape(ids.shape).to(ids.dtype), POSITIONS: nxt},
            "out": got,
            "commit": commit,
            "counts": {k: w.counts[k] - before.get(k, 0) for k in w.counts},
            "graph_counts": {k: w.graphs.stats[k] - graph_before.get(k, 0) for k in w.graphs.stats},
            "cuda": cuda,
            "device": picks.device,
        }
        return {pick: host}, done
