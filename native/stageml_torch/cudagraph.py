"""CUDA graphs of the worker's decode steps.

A decode step of a served model is a few thousand small ops (every projection, norm, rotary and
attention of every layer); run one by one from Python, their dispatch, not the GPU, sets the pace.
So a cache-fed run in which every row appends exactly one position (a decode step) is captured
once into a CUDA graph and replayed while nothing it depends on changes:

- **What a graph is keyed by.** The program, every input's shape and dtype, and the *address* of
  each input bound in place: the resident inputs (weights fed as inputs, slot tables) and the
  cache streams read from the staged batch (`past_key.*`, `past_value.*`). The staged buffers keep
  their address while the worker's persistent batch has a free row and room for the step
  (worker.py `Staged`: rows joining and leaving write or free their own row, and a graphed step
  runs every row of it, those it does not name as dummies); a graph therefore lives until the
  batch is re-staged, not just while one composition lasts. Every other input (token ids,
  positions, slots, the key mask with the step's tail) is copied into the graph's own buffers
  before each replay.
- **Fixed shapes.** Cache streams are fed at the staged capacity (a multiple of 64 positions)
  instead of the longest row: positions past a row's length hold the stream's pad (the key mask's
  is MASKED, so attention gives them weight 0). The steps of one batch then have one shape until
  the batch grows past its capacity.
- **When a key is captured.** A program's first decode step runs eagerly (which warms every
  kernel, Triton's and ours, and the fused steps' derived tables) and is captured when the next
  step has the same key. Once a program is warm (a run of it finished: any eager step, prefill
  included), a new key of it is captured at first sight: a key lives until the batch is re-staged,
  so its next steps replay it, and the eager step a second sight needed cost a served case as much
  as the capture (an H200, a 1B model at 64 rows: 57 ms eager, then 26 ms to capture). Where a
  first-sight capture fails (a kernel that builds on first use and cannot build inside a capture),
  the step runs eagerly, which builds it, and the key is captured at its second sight; after
  `SECOND_AFTER` such failures a program's new keys always wait for their second sight. At most `LIMIT`
  graphs are kept (least recently used dropped); a disposed program drops its own.
- **What stays checked.** Index inputs (ids, slots, positions) that reach a gather, indexSelect or
  scatterAdd are range-checked on the host before every replay, against the bounds the eager run
  or the capture saw; indices the program computes itself are in range by construction. A program whose capture
  fails (an op that needs the host mid-run, e.g. the MoE grouping) runs eagerly from then on.
- **Numerics.** A graph replays exactly the kernels of an eager run of the same shapes, so a
  replayed step equals an eager step at the padded length bit for bit; against the unpadded eager
  step the attention runs over more (masked) positions: same values up to the kernels' reduction
  order (bench/results/gpu-worker.md).

- **Attention.** SDPA's cuDNN backend is the fastest on the GPU here (a 4-layer 4096-wide step at 64
  rows: 2.5 against 4.9 ms replayed) but builds a plan on the host for every new shape (~19 ms a
  call): the worker turns it off for eager runs (prefill chunks, a new length each) and on for the
  decode steps the graphs take (their eager first sight, then the capture), whose shapes repeat
  (rows × staged capacity). `STAGEML_TORCH_CUDNN_SDP`: `auto` (that), `1` (always), `0` (never).

- **The device's own clock.** Every CUDA replay is bracketed by two timing events on its stream;
  at the next replays the finished pairs are read without waiting (`Timeline`): `replayUs`, the
  device time inside replays, and `betweenUs` over `betweenN`, the device time from one replay's
  end to the next one's start where nothing but decode steps ran between them (the picks, the
  cache commit, and the device waiting for the host). Their sum over a served batch is the step
  loop's device wall; `betweenUs` is what the host's turnaround left the device idle or busy
  with work outside the graph.

`STAGEML_TORCH_GRAPHS`: `auto` (default: CUDA workers), `0` (never), `emulate` (the same
bookkeeping on any device with eager replays of the captured feed, for the CPU tests).
"""

import os
import sys
import time
from collections import OrderedDict, deque

import torch

from . import errors, ops

LIMIT = 8
# First-sight captures of one program that may fail before its new keys wait for a second sight.
SECOND_AFTER = 2


def mode():
    v = os.environ.get("STAGEML_TORCH_GRAPHS", "auto")
    return v if v in ("auto", "0", "emulate") else "auto"


def cudnn_sdp_mode():
    v = os.environ.get("STAGEML_TORCH_CUDNN_SDP", "auto")
    return v if v in ("auto", "0", "1") else "auto"


class _CudnnSdp:
    """SDPA's cuDNN backend on for the `with` body (mode `auto`, CUDA), as it was after."""

    def __init__(self, prog):
        self.on = prog.on_cuda and cudnn_sdp_mode() == "auto" and hasattr(torch.backends.cuda, "cudnn_sdp_enabled")

    def __enter__(self):
        if self.on:
            self.prev = torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(True)
        return self

    def __exit__(self, *exc):
        if self.on:
            torch.backends.cuda.enable_cudnn_sdp(self.prev)


class _Emulated:
    """What the CPU tests use for a CUDA graph: the captured feed run again eagerly on replay."""

    def __init__(self, prog, feed, relaxed=False):
        self.prog, self.feed = prog, feed
        self.out = None

    def capture(self):
        self.out = self.prog.run(self.feed)

    def replay(self):
        fresh = self.prog.run(self.feed)
        for k, v in fresh.items():
            self.out[k].copy_(v)


_SIDE = {}


def _side_stream(dev):
    """The stream captures run on (one per device; never the default stream, which cannot capture)."""
    s = _SIDE.get(dev)
    if s is None:
        s = _SIDE[dev] = torch.cuda.Stream(dev)
    return s


class _Cuda:
    def __init__(self, prog, feed, relaxed=False):
        self.prog, self.feed = prog, feed
        self.graph = torch.cuda.CUDAGraph()
        self.out = None
        # A first-sight capture may be the first use of a kernel at this shape (SDPA's cuDNN
        # backend builds its plan then, through CUDA calls a capture in the default "global"
        # mode refuses): "relaxed" lets such calls through; what would run on the captured
        # stream is still captured, and a host read of the device still fails the capture.
        self.mode = "relaxed" if relaxed else "global"

    def capture(self):
        # Not `torch.cuda.graph`: its entry synchronizes the device and empties the caching
        # allocator (every cached block freed, so the next eager prefill allocates its activations
        # from the driver again), ~tens of ms on a serving step for nothing a capture needs here.
        # The capture runs on a side stream that starts after the work already queued.
        dev = torch.device(self.prog.device)
        main = torch.cuda.current_stream(dev)
        side = _side_stream(dev)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            self.graph.capture_begin(capture_error_mode=self.mode)
            t = time.perf_counter()
            try:
                self.out = self.prog.run(self.feed)
                self.pass_s = time.perf_counter() - t
            except BaseException:
                try:
                    self.graph.capture_end()  # ends the (invalidated) capture; the run's error is the one raised
                except Exception:  # noqa: BLE001
                    pass
                raise
            self.graph.capture_end()
        main.wait_stream(side)

    def replay(self):
        self.graph.replay()


class Timeline:
    """Timing events around the CUDA replays of one worker, read once they have finished (never
    waited for): `stats` holds replayUs (device time inside replays), betweenUs and betweenN (the
    device time from a replay's end to the next replay's start, summed over pairs with no eager
    run between them)."""

    def __init__(self):
        self.pending = deque()
        self.stats = {"replayUs": 0, "betweenUs": 0, "betweenN": 0}
        self.last_end = None
        self.broken = True

    def eager(self):
        """An eager run happened: the next gap is not a decode step's."""
        self.broken = True

    def replay(self, graph):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        self.pending.append((start, end, self.broken))
        self.broken = False
        self.harvest()

    def harvest(self):
        while self.pending and self.pending[0][1].query():
            start, end, broken = self.pending.popleft()
            self.stats["replayUs"] += int(start.elapsed_time(end) * 1000)
            if self.last_end is not None and not broken:
                self.stats["betweenUs"] += int(self.last_end.elapsed_time(start) * 1000)
                self.stats["betweenN"] += 1
            self.last_end = end


class _Entry:
    __slots__ = ("graph", "static", "checks")

    def __init__(self, graph, static, checks):
        self.graph, self.static, self.checks = graph, static, checks


class StepGraphs:
    """The worker's graphs: `run(prog, inputs, bound)` returns the outputs of one decode step."""

    def __init__(self, limit=LIMIT):
        self.limit = limit
        self.graphs = OrderedDict()
        self.last = None  # (key, checks) of the last eager run
        # captureUs: host time of every capture (failed ones too), of which primeUs priming the
        # program and passUs its run under capture (kernel plans built there included); the rest
        # is ending the capture (the graph's instantiation).
        self.stats = {"eager": 0, "captures": 0, "replays": 0, "failures": 0, "firstSight": 0, "captureUs": 0, "primeUs": 0, "passUs": 0}
        self.announced = set()
        self.failed = set()  # ids of programs whose capture failed: eager from then on
        # ids of programs a run of which finished (kernels built): their new keys are captured at
        # first sight, until first-sight captures of a program failed SECOND_AFTER times (`second`:
        # id -> failures; a failure's key runs eagerly first, which builds what the capture could not).
        self.warm = set()
        self.second = {}
        self.replayed = None
        self.timeline = Timeline()

    def wanted(self, prog, caches):
        """Whether this run is one the graphs take: a cache-fed run on a CUDA program (or emulated),
        every row appending one position, of a program whose capture has not failed."""
        m = mode()
        if m == "0" or (m == "auto" and not prog.on_cuda) or id(prog) in self.failed:
            return False
        rows = caches.get("rows") or []
        return bool(rows) and all(int(r["append"][1]) == 1 for r in rows)

    def drop(self, prog):
        for k in [k for k in self.graphs if k[0] == id(prog)]:
            del self.graphs[k]
        if self.last is not None and self.last[0][0] == id(prog):
            self.last = None
        self.failed.discard(id(prog))
        self.announced.discard(id(prog))
        self.warm.discard(id(prog))
        self.second.pop(id(prog), None)

    def ran(self, prog):
        """A run of `prog` outside the graphs finished (a prefill): its kernels are built."""
        self.warm.add(id(prog))

    @staticmethod
    def _key(prog, inputs, bound, stable=None, fixed=()):
        # torch.Size and torch.dtype hash and compare as they are (building tuples and strings
        # of them took most of the ~0.5 ms this costs for the ~500 inputs of a Llama-3-8B step).
        # `fixed` (the resident inputs) stand in the key as `stable` (the worker's (map serial,
        # resident version), which names exactly those tensors), not one by one.
        return (id(prog), stable) + tuple((name, t.shape, t.dtype, t.data_ptr() if name in bound else None) for name, t in sorted(inputs.items()) if name not in fixed)

    def run(self, prog, inputs, bound, stable=None, fixed=()):
        """The outputs of a decode step: a replay of its graph, a capture, or an eager run.
        `bound`: the inputs bound in place (by address); `fixed` ⊆ `bound`: those `stable`
        identifies together (None: none)."""
        key = self._key(prog, inputs, bound, stable, fixed if stable is not None else ())
        e = self.graphs.get(key)
        # The graph the last run replayed (None: it ran eagerly): what a step launched ahead replays.
        self.replayed = None
        if e is not None:
            self.graphs.move_to_end(key)
            out = self._replay(e, inputs)
            self.replayed = e
            return out
        again = self.last is not None and self.last[0] == key
        first = not again and id(prog) in self.warm and self.second.get(id(prog), 0) < SECOND_AFTER
        if first or again:
            checks = None if first else self.last[1]
            self.last = None
            with _CudnnSdp(prog):
                e = self._capture(prog, inputs, bound, checks)
            if e is None and first and id(prog) not in self.failed:
                # Not at first sight then: eager now, captured when the key comes again.
                self.second[id(prog)] = self.second.get(id(prog), 0) + 1
            if e is not None:
                if first:
                    self.stats["firstSight"] += 1
                self.graphs[key] = e
                while len(self.graphs) > self.limit:
                    self.graphs.popitem(last=False)
                out = self._replay(e, inputs)
                self.replayed = e
                return out
        with _CudnnSdp(prog):
            out, checks = self._eager(prog, inputs)
        self.timeline.eager()
        self.warm.add(id(prog))
        self.last = (key, checks)
        return out

    def _eager(self, prog, inputs):
        """An eager run that records which integer inputs reach a range-checked index op, and the
        bound each was checked against."""
        dev = {k: v.to(prog.device) for k, v in inputs.items()}
        watch = {t.data_ptr(): name for name, t in dev.items() if not t.dtype.is_floating_point and t.numel() > 0}
        seen = []
        prev = ops.INDEX_WATCH[0]
        ops.INDEX_WATCH[0] = (watch, seen)
        try:
            out = prog.run(dev)
        finally:
            ops.INDEX_WATCH[0] = prev
        self.stats["eager"] += 1
        bounds = {}
        for name, size in seen:
            bounds[name] = min(size, bounds.get(name, size))
        return out, sorted(bounds.items())

    def _capture(self, prog, inputs, bound, checks):
        """The graph of one step, or None where its capture failed. `checks`: the index bounds an
        eager run of the key saw; None (a first-sight capture): recorded while capturing, and a
        failure then only means this key is run eagerly first (the caller's fallback)."""
        static = {}
        feed = {}
        for name, t in inputs.items():
            if name in bound:
                feed[name] = t
            else:
                s = t.to(prog.device, copy=True)
                static[name] = s
                feed[name] = s
        t0 = time.perf_counter()
        g = (_Emulated if mode() == "emulate" else _Cuda)(prog, feed, relaxed=checks is None)
        prime = getattr(prog, "prime", None)
        if prime is not None:
            prime(feed)
        self.stats["primeUs"] += int((time.perf_counter() - t0) * 1e6)
        seen = []
        watch = {t.data_ptr(): name for name, t in static.items() if not t.dtype.is_floating_point and t.numel() > 0} if checks is None else None
        prev = ops.INDEX_WATCH[0]
        try:
            ops.CAPTURING[0] = True
            ops.INDEX_WATCH[0] = (watch, seen) if watch is not None else None
            try:
                g.capture()
            finally:
                ops.CAPTURING[0] = False
                ops.INDEX_WATCH[0] = prev
                self.stats["passUs"] += int(getattr(g, "pass_s", 0.0) * 1e6)
                self.stats["captureUs"] += int((time.perf_counter() - t0) * 1e6)
        except Exception as ex:  # noqa: BLE001 - any capture failure: this program runs eagerly
            if prog.on_cuda:
                torch.cuda.synchronize(prog.device)
            if checks is None:
                print("stageml_torch: decode steps of @%s are captured on their second sight (a capture at first sight failed: %s: %s)" % (prog.name, type(ex).__name__, str(ex)[:300]), file=sys.stderr)
                return None
            self.failed.add(id(prog))
            self.stats["failures"] += 1
            print("stageml_torch: decode steps of @%s run without a CUDA graph (capture failed: %s: %s)" % (prog.name, type(ex).__name__, str(ex)[:300]), file=sys.stderr)
            return None
        if checks is None:
            bounds = {}
            for name, size in seen:
                bounds[name] = min(size, bounds.get(name, size))
            checks = sorted(bounds.items())
        self.stats["captures"] += 1
        if id(prog) not in self.announced:
            self.announced.add(id(prog))
            print("stageml_torch: decode steps of @%s replay CUDA graphs%s (first captured: %s)" % (
                prog.name, " (emulated)" if mode() == "emulate" else "", ", ".join("%s %s" % (k, list(v.shape)) for k, v in sorted(inputs.items())[:3])), file=sys.stderr)
        return _Entry(g, static, checks)

    def _replay(self, e, inputs):
        for name, size in e.checks:
            t = inputs.get(name)
            if t is not None and t.device.type == "cpu" and t.numel() > 0:
                lo, hi = int(t.min()), int(t.max())
                if lo < 0 or hi >= size:
                    raise errors.WorkerError(errors.EVAL, "input '%s': an index is out of range [0, %d) (got %d..%d)" % (name, size, lo, hi))
        for name, s in e.static.items():
            s.copy_(ops.pinned(inputs[name], s.device), non_blocking=True)
        if isinstance(e.graph, _Cuda):
            self.timeline.replay(e.graph.graph)
        else:
            e.graph.replay()
        self.stats["replays"] += 1
        return e.graph.out
