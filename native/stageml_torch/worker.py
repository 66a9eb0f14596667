"""`python3 -m stageml_torch.worker [--device cpu|cuda|auto]`: serves the framed protocol
(protocol.py) on stdin/stdout for the TypeScript `torch` executor. Diagnostics go to stderr."""

import argparse
import math
import sys
import time
import traceback
from collections import OrderedDict

import torch

from . import PROTOCOL_VERSION, __version__, cudagraph, errors, ops, tma, tp
from .ahead import Ahead
from .graph import Program
from .ops import DTYPES
from .protocol import read_frame, write_frame
from .safetensors_io import MappedSafetensors


def pick_device(name):
    """`auto`, `cpu`, `cuda` or `cuda:N`; a device torch does not see is `RT_BACKEND_UNAVAILABLE`."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        index = int(name[5:]) if ":" in name else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise errors.WorkerError("RT_BACKEND_UNAVAILABLE", "device '%s' was asked for, but torch %s sees %d CUDA device(s)" % (name, torch.__version__, torch.cuda.device_count() if torch.cuda.is_available() else 0))
        return name
    raise errors.WorkerError("RT_BACKEND_UNAVAILABLE", "unknown device '%s' (auto, cpu, cuda, cuda:N)" % name)


def _float_output(prog, name):
    """Whether `name` is a float output of the program (what argmax and sample reduce)."""
    return name in prog.output_names() and prog.value_types[dict(prog.outputs)[name]][1] in ("f32", "f16", "bf16", "f64")


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_sample(prog, header):
    """The run request's `sample` ({output: {temperature, topK, topP, u}: one entry per row}),
    checked before anything runs: a float output of the program named by neither `argmax` nor
    `omit`, lists of one length, temperature finite and >= 0, topK an integer >= 0, topP in (0, 1],
    u in [0, 1); anything else is RT_BAD_VALUE naming what."""
    sample = header.get("sample") or {}
    if not isinstance(sample, dict):
        raise errors.WorkerError(errors.BAD_VALUE, "sample must be an object of outputs, got %r" % (type(sample).__name__,))
    for name, spec in sample.items():
        if not _float_output(prog, name):
            raise errors.WorkerError(errors.BAD_VALUE, "sample names '%s', which is not a float output of @%s" % (name, prog.name))
        if name in (header.get("argmax") or []):
            raise errors.WorkerError(errors.BAD_VALUE, "'%s' is named by both sample and argmax" % (name,))
        cols = ("temperature", "topK", "topP", "u")
        if not isinstance(spec, dict) or not all(isinstance(spec.get(c), list) for c in cols):
            raise errors.WorkerError(errors.BAD_VALUE, "sample '%s' needs lists %s" % (name, ", ".join(cols)))
        n = len(spec["u"])
        if n == 0 or any(len(spec[c]) != n for c in cols):
            raise errors.WorkerError(errors.BAD_VALUE, "sample '%s' needs one entry per row in each of %s" % (name, ", ".join(cols)))
        for i in range(n):
            t, k, p, u = (spec[c][i] for c in cols)
            if not (_num(t) and math.isfinite(t) and t >= 0):
                raise errors.WorkerError(errors.BAD_VALUE, "sample '%s' row %d: temperature must be a finite number >= 0, got %r" % (name, i, t))
            if not (isinstance(k, int) and not isinstance(k, bool) and 0 <= k < 2**31):
                raise errors.WorkerError(errors.BAD_VALUE, "sample '%s' row %d: topK must be an integer >= 0, got %r" % (name, i, k))
            if not (_num(p) and 0 < p <= 1):
                raise errors.WorkerError(errors.BAD_VALUE, "sample '%s' row %d: topP must be in (0, 1], got %r" % (name, i, p))
            if not (_num(u) and 0 <= u < 1):
                raise errors.WorkerError(errors.BAD_VALUE, "sample '%s' row %d: u must be in [0, 1), got %r" % (name, i, u))
        if spec.get("processing") is not None:
            check_processing(name, spec["processing"], n)
    return sample


def _id(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31


def check_processing(name, processing, n):
    """The `processing` column of a sample request: one entry per row, null or an object of
    logitBias [[id, value]], repetitionPenalty (> 0), seen [id], frequencyPenalty, presencePenalty
    (finite) and counts [[id, count >= 1]], ids distinct within each list; else RT_BAD_VALUE."""
    def bad(i, what):
        raise errors.WorkerError(errors.BAD_VALUE, "sample '%s' row %d: processing %s" % (name, i, what))
    if not isinstance(processing, list) or len(processing) != n:
        raise errors.WorkerError(errors.BAD_VALUE, "sample '%s' needs one processing entry (or null) per row" % (name,))
    for i, p in enumerate(processing):
        if p is None:
            continue
        if not isinstance(p, dict):
            bad(i, "must be an object")
        for key, second in (("logitBias", lambda b: _num(b) and math.isfinite(b)), ("counts", lambda c: _id(c) and c >= 1)):
            pairs = p.get(key)
            if pairs is None:
                continue
            if not isinstance(pairs, list) or not all(isinstance(e, list) and len(e) == 2 and _id(e[0]) and second(e[1]) for e in pairs):
                bad(i, "%s must be [id, value] pairs" % key)
            if len({e[0] for e in pairs}) != len(pairs):
                bad(i, "%s ids must be distinct" % key)
        seen = p.get("seen")
        if seen is not None and (not isinstance(seen, list) or not all(_id(s) for s in seen) or len(set(seen)) != len(seen)):
            bad(i, "seen must be distinct token ids")
        rep = p.get("repetitionPenalty")
        if rep is not None and not (_num(rep) and math.isfinite(rep) and rep > 0):
            bad(i, "repetitionPenalty must be a positive number")
        for key in ("frequencyPenalty", "presencePenalty"):
            if p.get(key) is not None and not (_num(p[key]) and math.isfinite(p[key])):
                bad(i, "%s must be a finite number" % key)


def device_memory(device):
    """{total, free} bytes of the worker's device: the GPU's (torch.cuda.mem_get_info) or, on the
    CPU, the host's physical and available memory; None where neither can be read."""
    try:
        if device.startswith("cuda"):
            free, total = torch.cuda.mem_get_info(torch.device(device))
            return {"total": int(total), "free": int(free)}
        import os

        page = os.sysconf("SC_PAGE_SIZE")
        return {"total": int(os.sysconf("SC_PHYS_PAGES") * page), "free": int(os.sysconf("SC_AVPHYS_PAGES") * page)}
    except (AttributeError, ValueError, OSError, RuntimeError):
        return None


class Cache:
    """One sequence's cache on the device: per stream input a position-major buffer [capacity, *item]
    with `length` positions filled — its own (grown by doubling) until a run names it, then its row
    (`row`) of the worker's persistent batch (`staged`) until it is dropped."""

    __slots__ = ("cid", "buffers", "length", "staged", "row")

    def __init__(self, cid):
        self.cid = cid
        self.buffers = {}
        self.length = 0
        self.staged = None
        self.row = None

    def view(self, name):
        return self.buffers[name][: self.length]

    def write(self, name, rows, dtype):
        """Writes `rows` [n, *item] at positions [length, length + n) of stream `name` in its own
        buffer (the caller moves `length`)."""
        n = rows.shape[0]
        buf = self.buffers.get(name)
        need = self.length + n
        if buf is None or buf.shape[0] < need:
            cap = max(16, buf.shape[0] if buf is not None else 0)
            while cap < need:
                cap *= 2
            grown = torch.empty((cap, *rows.shape[1:]), dtype=dtype, device=rows.device)
            if buf is not None and self.length > 0:
                grown[: self.length] = buf[: self.length]
            self.buffers[name] = buf = grown
        buf[self.length : need] = rows.to(dtype)


class Staged:
    """The worker's persistent batch of caches: per stream one [rows, cap, *item] buffer whose row i
    is the storage of the cache that owns it (`owners[i]`; positions beyond its length hold the
    stream's pad). A cache takes a row when a run first names it and frees it when dropped, so
    rows joining and leaving write or free only their own row: the buffers — and the CUDA graphs
    bound to them — stay while the batch has a free row and room for the step. `rows` is a power
    of two: a graphed decode step runs every row (free ones and rows not in the step as dummies
    whose results are dropped), so its shapes repeat as the batch changes."""

    __slots__ = ("rows", "cap", "layout", "buffers", "tails", "views", "owners", "ran", "groups")

    def __init__(self, rows, cap, layout=()):
        self.rows = rows
        # Per stream (input name, item shape, storage dtype): a program whose streams differ (another
        # model's engine on the same worker) re-stages rather than joining buffers of another shape.
        self.layout = layout
        # The first rows the current run reads in place (a run's view of the first `ran` rows is
        # the only one a step's keys are appended into in place: ops.append_in_place).
        self.ran = rows
        self.cap = cap
        self.buffers = {}
        # Each stream's view at the capacity over every row, what a graphed step reads (made once).
        self.views = {}
        # Keys and values: their storage (ops.Tail, registered in ops.CACHE_TAILS), TAIL positions
        # longer than `cap`, so that a step at the capacity appends its keys in place as well.
        self.tails = {}
        # (storage [S, rows, heads, cap + TAIL, dim], the S stream names it holds, in order): the
        # key and value streams of one item shape, dtype and pad.
        self.groups = []
        self.owners = [None] * rows

    @property
    def ids(self):
        """The cache id of each row (None: a free row)."""
        return tuple(None if c is None else c.cid for c in self.owners)

    def used(self):
        return sum(1 for c in self.owners if c is not None)

    def free(self, cache):
        if cache.row is not None and cache.row < self.rows and self.owners[cache.row] is cache:
            self.owners[cache.row] = None
        cache.staged = None
        cache.row = None

    def reset_tails(self):
        """Puts each stream's pad back over the positions a run appended in place below `cap`
        (those past `cap` are never read: the next batch copies only filled positions)."""
        for t in self.tails.values():
            if t.written is not None:
                start, n = t.written
                end = min(start + n, self.cap)
                if start < end:
                    # Only the rows the run read: a row beyond them may hold positions there.
                    t.phys.narrow(0, 0, self.ran).narrow(t.axis, start, end - start).fill_(t.pad)
                t.written = None


def copy_all(dsts, srcs):
    """dsts[i].copy_(srcs[i]) for every i, as one multi-tensor copy where torch has it (a batch of
    64 rows of a 1B model re-staged copies 32 streams of each: ~2,000 copies, a launch each when
    made one by one)."""
    if not dsts:
        return
    if hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(dsts, srcs)
    else:
        for d, s in zip(dsts, srcs):
            d.copy_(s)


def bucket(n):
    """The batch's rows for `n` caches: the next power of two (graph keys repeat as rows come and go)."""
    r = 1
    while r < n:
        r *= 2
    return r


STAGE_STEP = 64
# How far past the positions a run needs a re-staged batch reaches for its rows' expected lengths
# (`reserve`): twice the need, or the need plus this many, whichever is more. Each growth of the
# batch copies every row and costs the decode step's CUDA graph a new capture (~100 ms on an H100
# for a 1B model), while a position staged ahead costs the graphed step only its masked attention.
RESERVE_AHEAD = 512
# Positions past the capacity in a staged key or value buffer: where a decode step at the capacity
# (a CUDA graph's) writes its key before the attention reads the buffer (ops.append_in_place).
TAIL = 1


class Worker:
    def __init__(self, device, tp_rank=0, tp_world=1, ranks=None):
        self.device = device
        # Tensor parallelism (tp.py, dist.py): this rank's place; `ranks` on rank 0 only. Resident
        # tensors are then kept whole on the host and each rank's part moved to its device at its
        # first use (`shards`, by (id, axis); a write or drop forgets them).
        self.tp_rank, self.tp_world, self.ranks = tp_rank, tp_world, ranks
        self.home = "cpu" if tp_world > 1 else device
        self.shards = {}
        if device.startswith("cuda") and cudagraph.cudnn_sdp_mode() != "1" and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            # SDPA's cuDNN backend builds a plan for every new shape, ~19 ms of host time per call
            # on the H200 (torch 2.11): an eager run whose context length is new (every prefill
            # chunk) paid it in each layer (a 4-layer 4096-wide step at 64 rows: 86.7 ms with it,
            # 16.6 ms without; bench/results/gpu-worker.md). So flash / memory-efficient attention for
            # eager runs, and cuDNN's (faster on the GPU: 2.5 against 4.9 ms for that step) only
            # where a decode step is captured into a CUDA graph (cudagraph.py).
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.programs = {}
        self.next_handle = 1
        self.resident = {}
        # Per program handle, the last `resident` map a run sent: a run whose header says
        # `residentSame` uses it (the host sends the map again only when it changes). With it, the
        # part of a step graph's key its inputs make (`_fixed_token`), recomputed only after
        # `resident_version` moved (a resident tensor added, replaced, dropped or written).
        self.resident_maps = {}
        self.resident_version = 0
        self.fixed_tokens = OrderedDict()
        self.next_token = 0
        # Safetensors files mapped by a `load` in progress (path -> MappedSafetensors).
        self.files = {}
        self.caches = {}
        self.staged = None
        self.graphs = cudagraph.StepGraphs()
        self.ahead = Ahead(self)
        # Counters of the cache batch, reported with every run (the host's `CacheStore.stats`).
        # runBusyUs: wall time spent on run requests, from the frame read to its reply written (the
        # step rate the worker alone sustains is runs / runBusyUs; the rest of the wall is the host's).
        # Its parts (microseconds, summed over runs): stageUs (resident inputs and the cache batch
        # before the program runs), launchUs (the program's run or graph replay: queued on a GPU),
        # pickUs (argmax/sample and the cache commit), replyUs (the reply frame: on a GPU the wait
        # for the step's kernels). waitUs: time between a reply written and the next run's frame
        # read (the host's part of the step, where the device idles unless it is still busy).
        self.counts = {"restages": 0, "joins": 0, "gathers": 0, "dummyRows": 0, "runs": 0, "runBusyUs": 0,
                       "stageUs": 0, "launchUs": 0, "pickUs": 0, "replyUs": 0, "waitUs": 0}

    def handle(self, header, tensors):
        op = header.get("op")
        if op != "run":
            # Loads, writes, drops and disposals change what a step launched ahead read.
            self.ahead.discard(sync=True)
        if op == "hello":
            hello = {"ok": True, "protocol": PROTOCOL_VERSION, "worker": __version__, "torch": torch.__version__, "device": self.device, "cuda": torch.cuda.is_available(), "deviceName": torch.cuda.get_device_name() if self.device.startswith("cuda") else "cpu", "memory": device_memory(self.device)}
            if self.ranks is not None:
                hello["tensorParallel"] = {"size": self.tp_world, "pids": self.ranks.pids(), "devices": self.ranks.devices}
            return hello, None
        if op == "load":
            return self._load(header.get("files") or [])
        if op == "alloc":
            return self._alloc(header.get("allocs") or [])
        if op == "write":
            return self._write(header.get("writes") or [], tensors)
        if op == "prepare":
            device = header.get("device") or self.device
            device = pick_device(device) if device != self.device else device
            prog = self._prepare(header["graph"], tensors, device)
            h = self.next_handle
            self.next_handle += 1
            self.programs[h] = prog
            return {"ok": True, "handle": h, "device": str(prog.device), "inputs": prog.input_names(), "outputs": prog.output_names(), "fusedSlotLinears": prog.fused_slots, "fusedSlotSets": prog.slot_sets, "cacheConcats": prog.cache_concats, "collectives": prog.tp_collectives}, None
        if op == "run":
            return self._run_request(header, tensors)
        if op == "cache_drop":
            for i in set(header.get("ids") or []):
                c = self.caches.pop(i, None)
                if c is not None and c.staged is not None:
                    # Its row of the batch is free for the next cache to join: nothing else moves.
                    c.staged.free(c)
            # `caches`: how many the worker holds now (what the host's stats report as `caches`).
            return {"ok": True, "caches": len(self.caches)}, None
        if op == "cache_fork":
            return self._cache_fork(header.get("from"), header.get("to"), header.get("length"))
        if op == "cache_keep":
            return self._cache_keep(header.get("cache"), header.get("length"))
        if op == "dispose":
            self.graphs.drop(self._program(header))
            del self.programs[header["handle"]]
            self.resident_maps.pop(header["handle"], None)
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            return {"ok": True}, None
        if op == "shutdown":
            return None, None
        raise errors.WorkerError(errors.PROTOCOL, "unknown request op %r" % (op,))

    def _run_request(self, header, tensors):
        """A `run` request: its outputs, from the step launched ahead for it where that step is
        this request's (ahead.py), else from running it now; then the next decode step is
        launched ahead where it can be, before the reply waits for this one's picks."""
        prog = self._program(header)
        # The resident map first, before anything can fail: a later run may name it by
        # `residentSame` (the host sends them in order, without waiting for this one's reply).
        if not header.get("residentSame"):
            rmap = header.get("resident") or {}
            if not isinstance(rmap, dict):
                raise errors.WorkerError(errors.PROTOCOL, "resident must be an object {input name: id}")
            self.resident_maps[header.get("handle")] = {"map": rmap, "version": None, "token": None}
        for name in header.get("argmax") or []:
            if not _float_output(prog, name):
                raise errors.WorkerError(errors.BAD_VALUE, "argmax names '%s', which is not a float output of @%s" % (name, prog.name))
        sample = check_sample(prog, header)
        omit = header.get("omit") or []
        outputs = set(prog.output_names()) if omit else ()
        for name in omit:
            if name not in outputs or name in (header.get("argmax") or []) or name in sample:
                raise errors.WorkerError(errors.BAD_VALUE, "omit names '%s', which is not an output of @%s or is also in argmax or sample" % (name, prog.name))
        sent = dict(tensors)
        got = self.ahead.take(prog, header, sent)
        if got is None:
            out, commit, graphed = self._run(prog, header, tensors, sample, omit)
        else:
            out, commit, graphed = got
        if commit is not None:
            commit()
        if graphed:
            launched = self.ahead.launch(prog, header, sent, out, sample)
            if launched is not None:
                out, done = launched
                if done is not None:
                    done.synchronize()
        return {"ok": True, "stats": self.stats()}, out

    def _run(self, prog, header, tensors, sample, omit):
        """Runs a request's program: (its outputs after picks and omissions, a function appending
        the run's positions to its caches — not called yet — or None, whether a CUDA graph ran it)."""
        t_stage = time.perf_counter()
        tensors, rmap, stable = self._resident(header, tensors, prog)
        spec = header.get("caches")
        # NOTE: no CUDA graphs for a tensor-parallel step (its collectives are not captured).
        graphed = bool(spec) and self.tp_world == 1 and self.graphs.wanted(prog, spec)
        commit, unpermute = self._caches(prog, spec, tensors, at_capacity=graphed) if spec else (None, None)
        t_launch = time.perf_counter()
        with torch.no_grad():
            try:
                if graphed:
                    # Bound in place (part of a graph's key): resident inputs and the staged cache
                    # streams; everything else is copied into the graph's buffers (cudagraph.py).
                    bound = set(rmap) | set(header.get("store") or {})
                    bound |= {s["input"] for s in spec["streams"] if s.get("from") is not None}
                    # A copy: a replay returns the graph's own outputs, which the argmax and
                    # omit below must not replace or remove for the next replay.
                    out = dict(self.graphs.run(prog, tensors, bound, stable, rmap))
                else:
                    out = prog.run(tensors)
                    self.graphs.timeline.eager()
                    self.graphs.ran(prog)
                if unpermute is not None:
                    # The request's rows, in its order (dummy rows of the batch dropped).
                    out = unpermute(out)
                # What the caches append from (the picks and omissions below leave it whole).
                local = dict(out)
                if self.tp_world > 1:
                    # Every rank joins the all-gathers of the split outputs the host gets (or
                    # picks from); the caches append this rank's part (`local`).
                    out = self._whole(prog, out, set(omit))
            finally:
                # Keys appended in place (ops.append_in_place) leave the pad behind them, run
                # or failed: the commit writes each row's own at its own length.
                if spec and self.staged is not None:
                    self.staged.reset_tails()
            t_pick = time.perf_counter()
            for name in header.get("argmax") or []:
                # Only the index of each row's maximum crosses to the host (a greedy pick).
                # Before the commit: a run that fails here leaves the caches as they were.
                out[name] = ops.argmax_rows(out[name])
            for name, cols in sample.items():
                # One drawn token per row crosses instead of the row's values (the host's draws).
                rows = out[name].numel() // out[name].shape[-1] if out[name].dim() and out[name].shape[-1] else 0
                if rows != len(cols["u"]):
                    raise errors.WorkerError(errors.BAD_VALUE, "sample '%s' gives %d rows, the output has %d" % (name, len(cols["u"]), rows))
                out[name] = ops.sample_rows(out[name], cols["temperature"], cols["topK"], cols["topP"], cols["u"], cols.get("processing"))
            for name in omit:
                # Left on the device (the caches take what they append from `local`): never copied out.
                out.pop(name, None)
        t_end = time.perf_counter()
        self.counts["stageUs"] += int((t_launch - t_stage) * 1e6)
        self.counts["launchUs"] += int((t_pick - t_launch) * 1e6)
        self.counts["pickUs"] += int((t_end - t_pick) * 1e6)
        return out, (None if commit is None else (lambda: commit(local))), graphed

    def _load(self, entries):
        """`load`: each entry {id, file, tensor, dtype, shape} is read from its safetensors file
        (memory-mapped, in the stored dtype), moved to the device and converted there as the host
        would convert it (widened exactly to f32, then rounded to nearest even to `dtype`), and
        kept as resident input `id`. Checked first (files, names, shapes, dtypes): a bad entry (a
        missing or malformed file too) is RT_BAD_VALUE and nothing is kept."""
        plan = []
        for e in entries:
            dt = DTYPES.get(e.get("dtype"))
            if dt is None or not dt.is_floating_point:
                raise errors.WorkerError(errors.BAD_VALUE, "load: tensor '%s' asks for dtype %r (a float dtype: f32, f16, bf16, f64)" % (e.get("tensor"), e.get("dtype")))
            path = e["file"]
            try:
                m = self.files.get(path)
                if m is None:
                    m = self.files[path] = MappedSafetensors(path)
                src = m.tensor(e["tensor"])
            except errors.WorkerError as err:
                self.files.clear()
                raise errors.WorkerError(errors.BAD_VALUE, "load: %s" % err.message) from err
            shape = [int(d) for d in e["shape"]]
            if list(src.shape) != shape:
                self.files.clear()
                raise errors.WorkerError(errors.BAD_VALUE, "load: %s stores '%s' as %s, the request says %s" % (path, e["tensor"], list(src.shape), shape))
            if not src.dtype.is_floating_point:
                raise errors.WorkerError(errors.BAD_VALUE, "load: %s stores '%s' as %s, not a float dtype" % (path, e["tensor"], src.dtype))
            plan.append((int(e["id"]), src, dt))
        nbytes = 0
        for i, src, dt in plan:
            t = src.to(self.home)
            if t.dtype != dt:
                t = t.to(torch.float32).to(dt) if dt != torch.float64 else t.to(dt)
            elif t.device.type == "cpu" and t.data_ptr() == src.data_ptr():
                # Kept on the CPU in its stored dtype: a copy of its own, not a view of the map.
                t = t.clone()
            self.resident[i] = t
            self._forget(i)
            nbytes += t.numel() * t.element_size()
        # The maps are only needed while loading: a later load maps its files again.
        self.files.clear()
        return {"ok": True, "bytes": nbytes}, None

    def _alloc(self, entries):
        """`alloc`: each entry {id, dtype, shape} becomes a zero resident input on the device."""
        made = []
        for e in entries:
            dt = DTYPES.get(e.get("dtype"))
            shape = e.get("shape")
            if dt is None or not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
                raise errors.WorkerError(errors.BAD_VALUE, "alloc: entry %r needs a dtype and a shape of sizes >= 0" % (e,))
            made.append((int(e["id"]), dt, shape))
        nbytes = 0
        for i, dt, shape in made:
            t = torch.zeros(shape, dtype=dt, device=self.home)
            self.resident[i] = t
            self._forget(i)
            nbytes += t.numel() * t.element_size()
        return {"ok": True, "bytes": nbytes}, None

    def _write(self, writes, tensors):
        """`write`: each entry {id, start, tensor} writes the frame's tensor (flattened, converted to
        the resident input's dtype: to nearest even) over elements [start, start + n) of resident
        input `id` (flattened), in place. An entry may transform the tensor on the device first:
        `scale` (a number) multiplies each value in f64 and rounds the product to f32, `transpose`
        [r, c] writes the [r, c] matrix transposed (a LoRA B as the slot tables hold it). All are
        checked before any is written (RT_BAD_VALUE). Graphs captured over the old contents are
        dropped (a replay would read derived copies)."""
        todo = []
        for w in writes:
            i = w.get("id")
            if i not in self.resident:
                raise errors.WorkerError(errors.BAD_VALUE, "write: resident input %r is not held by the worker" % (i,))
            src = tensors.get(w.get("tensor"))
            if src is None:
                raise errors.WorkerError(errors.PROTOCOL, "write: the frame does not carry tensor %r" % (w.get("tensor"),))
            dst = self.resident[i]
            start = w.get("start")
            n = src.numel()
            if not (isinstance(start, int) and not isinstance(start, bool) and 0 <= start and start + n <= dst.numel()):
                raise errors.WorkerError(errors.BAD_VALUE, "write: elements [%r, %r + %d) lie outside resident input %r (%d elements)" % (start, start, n, i, dst.numel()))
            scale, tr = w.get("scale"), w.get("transpose")
            if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale)):
                raise errors.WorkerError(errors.BAD_VALUE, "write: scale %r is not a finite number" % (scale,))
            if tr is not None and not (isinstance(tr, list) and len(tr) == 2 and all(_id(d) for d in tr) and tr[0] * tr[1] == n):
                raise errors.WorkerError(errors.BAD_VALUE, "write: transpose %r is not [rows, columns] of the tensor's %d elements" % (tr, n))
            if (scale is not None or tr is not None) and not (src.dtype.is_floating_point and dst.dtype.is_floating_point):
                raise errors.WorkerError(errors.BAD_VALUE, "write: scale and transpose take a float tensor into a float input, got %s into %s" % (src.dtype, dst.dtype))
            todo.append((dst, start, src, scale, tr))
        for dst, start, src, scale, tr in todo:
            src = src.reshape(-1).to(dst.device)
            if scale is not None:
                src = (src.double() * float(scale)).float()
            if tr is not None:
                src = src.reshape(tr[0], tr[1]).t().reshape(-1)
            dst.view(-1)[start : start + src.numel()].copy_(src.to(dst.dtype))
        for w in writes:
            self._forget(w.get("id"))
        if todo:
            for prog in self.programs.values():
                self.graphs.drop(prog)
        return {"ok": True}, None

    def _resident(self, header, tensors, prog):
        """Resident inputs: `drop` ids are forgotten, `store` {name: id} inputs of this frame are kept
        (on the program's device) for later runs, `resident` {name: id} inputs are taken from what was
        kept. The stores happen first, so a failing run never leaves a sent input unkept.

        On a tensor-parallel rank every input the rank's graph takes split (`prog.tp_inputs`) is
        cut to the rank's chunk here: a resident one once (kept on the device by id and axis), a
        sent one (and a cache seed, `cache:<id>:<input>`, one axis less) every run.

        `residentSame` in place of `resident`: the map the last run of this program sent (kept per
        handle). Returns (the inputs, the resident map, its key: (map serial, resident version))."""
        device = prog.device
        entry = self.resident_maps.get(header.get("handle"))
        if entry is None:
            raise errors.WorkerError(errors.PROTOCOL, "residentSame: no run of handle %r has sent a resident map" % (header.get("handle"),))
        rmap = entry["map"]
        home = self.home if self.tp_world > 1 else device
        for i in header.get("drop") or []:
            self.resident.pop(i, None)
            self._forget(i)
        for name, i in (header.get("store") or {}).items():
            if name not in tensors:
                raise errors.WorkerError(errors.PROTOCOL, "store names input '%s', which the frame does not carry" % (name,))
            tensors[name] = tensors[name].to(home)
            self.resident[i] = tensors[name]
            self._forget(i)
        if self.tp_world > 1:
            split = prog.tp_inputs
            for key in list(tensors):
                name = key.split(":", 2)[2] if key.startswith("cache:") else key
                axis = split.get(name)
                if axis is not None:
                    axis = axis - 1 if key.startswith("cache:") else axis
                    tensors[key] = tp.chunk(tensors[key], axis, self.tp_rank, self.tp_world).contiguous()
        for name, i in rmap.items():
            if i not in self.resident:
                raise errors.WorkerError(errors.BAD_VALUE, "resident input '%s' (id %r) is not held by the worker" % (name, i))
            if self.tp_world > 1:
                axis = prog.tp_inputs.get(name)
                got = self.shards.get((i, axis, str(device)))
                if got is None:
                    t = self.resident[i]
                    t = t if axis is None else tp.chunk(t, axis, self.tp_rank, self.tp_world)
                    got = self.shards[(i, axis, str(device))] = t.to(device).contiguous()
                tensors[name] = got
                continue
            tensors[name] = self.resident[i]
        return tensors, rmap, (None if self.tp_world > 1 else self._fixed_token(entry, tensors))

    def _fixed_token(self, entry, tensors):
        """A number standing for the resident inputs of a run in a step graph's key: equal numbers
        for equal (name, shape, dtype, address) of every one of them, as the key would hold them
        one by one. Computed again only after a resident tensor changed."""
        if entry["version"] == self.resident_version:
            return entry["token"]
        part = tuple((name, tensors[name].shape, tensors[name].dtype, tensors[name].data_ptr()) for name in sorted(entry["map"]))
        token = self.fixed_tokens.get(part)
        if token is None:
            # A number is never given to other contents (a count, not a slot of the table).
            token = self.fixed_tokens[part] = self.next_token
            self.next_token += 1
            while len(self.fixed_tokens) > 64:
                self.fixed_tokens.popitem(last=False)
        else:
            self.fixed_tokens.move_to_end(part)
        entry["version"], entry["token"] = self.resident_version, token
        return token

    def _forget(self, i):
        """Resident tensor `i` changed: a new resident version, and its device parts dropped (tensor
        parallelism)."""
        self.resident_version += 1
        if self.shards:
            for k in [k for k in self.shards if k[0] == i]:
                del self.shards[k]

    def _prepare(self, graph, params, device):
        """A Program; on a tensor-parallel rank, of the rank's graph (tp.shard_graph) with its
        parameters cut to the rank's chunks."""
        if self.tp_world == 1:
            prog = Program(graph, params, device)
            prog.tp_inputs, prog.tp_outputs, prog.tp_collectives = {}, {}, 0
            return prog
        local, ins, outs = tp.shard_graph(graph, self.tp_rank, self.tp_world)
        params = {k: (v if ins.get(k) is None else tp.chunk(v, ins[k], self.tp_rank, self.tp_world).contiguous()) for k, v in params.items()}
        prog = Program(local, params, device, extra_ops=tp.TP_OPS)
        prog.tp_inputs, prog.tp_outputs, prog.tp_collectives = ins, outs, local.get("tpCollectives", 0)
        return prog

    def _whole(self, prog, out, omit):
        """The run's outputs with those split across ranks all-gathered (all but `omit`: those stay
        on the device, each rank its part). Every rank calls it with the same names, in order."""
        whole = dict(out)
        for name in prog.output_names():
            axis = prog.tp_outputs.get(name)
            if axis is None or name in omit or name not in out:
                continue
            whole[name] = tp.op_all_gather([out[name]], {"axis": axis}, None)[0]
        return whole

    def _caches(self, prog, spec, tensors, at_capacity=False):
        """Cache-fed inputs (`caches` of a run): each stream input [rows, past, *item] from the
        persistent batch (`Staged`; past = the longest run row, or with `at_capacity` the batch's
        capacity, so that the steps of one batch have one shape for a CUDA graph; beyond a row's
        length: `pad`), then the run's tail along axis 1 for a stream without `from`. Seeds
        `cache:<id>:<input>` [length, *item] replace a cache. A cache the batch lacks joins it in a
        free row (only its own row is written); the batch is re-staged (every row copied) only when
        it has no free row, no room for the step's positions, or is mostly free.

        Which rows run: with `rowInputs` (the inputs whose leading axis is the row) a graphed step
        runs every row of the batch, others the rows they name in batch order (a decode step also
        the few free rows between them); the row inputs are scattered to those rows (zeros
        elsewhere: dummy rows, whose results are dropped) and the outputs gathered back to the
        request's row order. Without `rowInputs` the rows run in the request's order. Rows that are
        not the batch's first ones in order are gathered (copied) out of it.

        Returns (commit, unpermute): `unpermute(out)` puts the outputs in the request's row order;
        `commit(out)` appends, after the run succeeded, each row's positions [from, from + count) of
        output `from` (or of the tail); no cache changes length before it."""
        device = prog.device
        streams = spec["streams"]
        declared = {name: prog.value_types[vid] for name, vid in prog.inputs}
        for s in streams:
            if s["input"] not in declared:
                raise errors.WorkerError(errors.UNKNOWN_INPUT, "cache stream '%s' is not an input of @%s" % (s["input"], prog.name))
        seeds = {}
        for key in [k for k in tensors if k.startswith("cache:")]:
            _, cid, name = key.split(":", 2)
            seeds.setdefault(int(cid), {})[name] = tensors.pop(key)
        rows = spec["rows"]
        if len({r["id"] for r in rows}) != len(rows):
            raise errors.WorkerError(errors.BAD_VALUE, "a cache appears twice in one run")
        caches = []
        for r in rows:
            cid = r["id"]
            if cid in seeds:
                c = Cache(cid)
                lengths = set()
                for s in streams:
                    t = seeds[cid].get(s["input"])
                    if t is None:
                        raise errors.WorkerError(errors.BAD_VALUE, "cache %d: the seed lacks stream '%s'" % (cid, s["input"]))
                    c.write(s["input"], t.to(device), self._store_dtype(s, declared))
                    lengths.add(t.shape[0])
                if len(lengths) != 1:
                    raise errors.WorkerError(errors.BAD_VALUE, "cache %d: the seed's streams hold different numbers of positions" % cid)
                c.length = lengths.pop()
                old = self.caches.get(cid)
                if old is not None and old.staged is not None:
                    old.staged.free(old)
                self.caches[cid] = c
            else:
                c = self.caches.get(cid)
                if c is None:
                    # Empty until the run's commit: a failed run leaves an empty cache, as none.
                    c = self.caches[cid] = Cache(cid)
            caches.append(c)
        need = max([c.length + int(r["append"][1]) for c, r in zip(caches, rows)] or [1])
        reserve = 0
        for r in rows:
            v = r.get("reserve")
            if v is not None:
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise errors.WorkerError(errors.BAD_VALUE, "cache %d: reserve %r is not a count of positions" % (r["id"], v))
                reserve = max(reserve, v)
        st = self.staged
        layout = self._layout(streams, declared)
        joining = [c for c in caches if st is None or c.staged is not st]
        if st is None or st.layout != layout or need > st.cap or len(joining) > st.rows - st.used() or (st.rows >= 8 and 4 * (st.used() + len(joining)) <= st.rows):
            grow = st.cap + st.cap // 2 if st is not None and need > st.cap else 0
            ahead = min(reserve, max(2 * need, need + RESERVE_AHEAD))
            st = self._restage(caches, streams, declared, device, max(need, grow), layout, ahead)
        else:
            for c in joining:
                self._join(st, c, streams)
        index = [c.row for c in caches]
        n = len(index)
        row_inputs = spec.get("rowInputs")
        if row_inputs is None or n == 0:
            run = index
        elif at_capacity:
            run = list(range(st.rows))
        elif all(int(r["append"][1]) == 1 for r in rows) and max(index) + 1 - n <= n // 4 + 1:
            run = list(range(max(index) + 1))
        else:
            run = sorted(index)
        k = len(run)
        permuted = run != index
        if at_capacity:
            past = st.cap
        else:
            past = max([st.owners[b].length for b in run if st.owners[b] is not None] or [0])
        prefix = run == list(range(k))
        st.ran = k if prefix else 0
        block = not prefix and k > 0 and run == list(range(run[0], run[0] + k))
        gather = None
        if not prefix and not block:
            gather = ops.queued_longs([run], device)[0]
            self.counts["gathers"] += 1
        pos = None
        if permuted:
            where = {b: j for j, b in enumerate(run)}
            pos = ops.queued_longs([[where[b] for b in index]], device)[0]
            self.counts["dummyRows"] += k - n

        def scatter(name, t):
            # On the tensor's own device: ids and slots stay on the host, where a graph's replay
            # range-checks them (cudagraph.StepGraphs._replay).
            if t.dim() == 0 or t.shape[0] % max(n, 1) != 0:
                raise errors.WorkerError(errors.BAD_VALUE, "row input '%s' [%s] does not have one row per cache row (%d)" % (name, ", ".join(str(d) for d in t.shape), n))
            per = t.reshape(n, -1, *t.shape[1:]) if t.shape[0] != n else t
            out = torch.zeros((k, *per.shape[1:]), dtype=per.dtype, device=per.device)
            # index_copy_, not an indexed assignment: on a CUDA device that one waits for the device.
            out.index_copy_(0, pos.to(per.device), per)
            return out.reshape(k * (t.shape[0] // n), *t.shape[1:]) if t.shape[0] != n else out

        tails = {}
        stream_names = set()
        for s in streams:
            name = s["input"]
            stream_names.add(name)
            _, dt, _ = declared[name]
            full = st.buffers[name]
            if prefix:
                whole = k == st.rows and past == st.cap
                view = st.views.get(name) if whole else None
                if view is None:
                    view = full[:k, :past]
                    if whole:
                        st.views[name] = view
            elif block:
                view = full[run[0] : run[0] + k, :past]
            else:
                view = full[:, :past].index_select(0, gather)
            tail = st.tails.get(name)
            if tail is not None:
                tail.length, tail.written = past, None
            if view.dtype != DTYPES[dt]:
                view = view.to(DTYPES[dt])
            if s.get("from") is None:
                if name not in tensors:
                    raise errors.WorkerError(errors.MISSING_INPUT, "cache stream '%s' takes its tail from the inputs, which lack it" % name)
                tails[name] = ops.queued(tensors[name], device)
                fed = scatter(name, tails[name]) if permuted else tails[name]
                view = torch.cat([view, fed.to(view.dtype)], dim=1)
            tensors[name] = view
        if permuted:
            for name in row_inputs:
                if name in tensors and name not in stream_names:
                    tensors[name] = scatter(name, tensors[name])
        # Every appended position as (batch row, source row, source position, destination
        # position): one indexed write per group of streams (Staged.groups) whatever the rows.
        bi, ri, si, di = [], [], [], []
        for i, (r, c) in enumerate(zip(rows, caches)):
            a, m = int(r["append"][0]), int(r["append"][1])
            bi.extend([c.row] * m)
            ri.extend([i] * m)
            si.extend(range(a, a + m))
            di.extend(range(c.length, c.length + m))
        # Queued behind the device's work, not waited for (ops.queued): a step launched ahead is
        # staged while the step before it still runs.
        at = ops.queued_longs([bi, ri, si, di], device)

        def unpermute(out):
            if not permuted:
                return out
            return {name: (t.index_select(0, pos) if t.dim() > 0 and t.shape[0] == k else t) for name, t in out.items()}

        def commit(out):
            if ri:
                src = {s["input"]: (tails[s["input"]] if s.get("from") is None else out[s["from"]]) for s in streams}
                done = set()
                for big, names in st.groups:
                    # One indexed write for every stream of the group (32 writes a step for a
                    # 16-layer model took ~1 ms of host time, between two decode steps).
                    parts = [src.get(name) for name in names]
                    if len(parts) > 1 and all(t is not None and t.shape == parts[0].shape and t.dtype == parts[0].dtype for t in parts):
                        big.permute(0, 1, 3, 2, 4)[:, at[0], at[3]] = torch.stack(parts)[:, at[1], at[2]].to(big.dtype)
                        done.update(names)
                for s in streams:
                    if s["input"] in done:
                        continue
                    buf = st.buffers[s["input"]]
                    buf[at[0], at[3]] = src[s["input"]][at[1], at[2]].to(buf.dtype)
            for r, c in zip(rows, caches):
                c.length += int(r["append"][1])
                self.caches[r["id"]] = c

        return commit, unpermute

    def _held_cache(self, cid, what):
        """Cache `cid` of a cache request: RT_CACHE_LOST where the worker holds none of that id."""
        if not _id(cid):
            raise errors.WorkerError(errors.BAD_VALUE, "%s: cache id %r is not an integer >= 0" % (what, cid))
        c = self.caches.get(cid)
        if c is None:
            raise errors.WorkerError(errors.CACHE_LOST, "%s: cache %d is not held by the worker (never filled, dropped, or lost with a restarted worker)" % (what, cid))
        return c

    @staticmethod
    def _positions(c, length, what):
        """`length` of a cache request: an integer in [0, c.length], else RT_BAD_VALUE."""
        if not (_id(length) and length <= c.length):
            raise errors.WorkerError(errors.BAD_VALUE, "%s: length %r is not a count of positions within cache %d's %d" % (what, length, c.cid, c.length))
        return length

    @staticmethod
    def _own_copy(c, length):
        """Cache `c`'s first `length` positions of every stream as buffers of its own (a device copy,
        `length` positions; at least one, so an empty copy keeps each stream's item shape)."""
        return {name: buf[: max(length, 1)].clone(memory_format=torch.contiguous_format) for name, buf in c.buffers.items()}

    def _cache_fork(self, src, dst, length):
        """`cache_fork {from, to, length}`: a new cache `to` holding the first `length` positions of
        cache `from` (every stream, copied on the device; `from` is left as it was), outside the
        persistent batch until a run names it (it then joins a free row). Prefix caching seeds a
        sequence this way from a retained or running sequence's cache instead of prefilling those
        positions. An unknown `from` is RT_CACHE_LOST, a `to` already held or a length beyond
        `from`'s RT_BAD_VALUE; nothing changes then."""
        c = self._held_cache(src, "cache_fork")
        n = self._positions(c, length, "cache_fork")
        if not _id(dst) or dst in self.caches:
            raise errors.WorkerError(errors.BAD_VALUE, "cache_fork: target cache %r is not a free id (an integer >= 0 the worker holds no cache under)" % (dst,))
        fork = Cache(dst)
        fork.buffers = self._own_copy(c, n)
        fork.length = n
        self.caches[dst] = fork
        return {"ok": True, "caches": len(self.caches)}, None

    def _cache_keep(self, cid, length):
        """`cache_keep {cache, length}`: keeps cache `cache` for reuse (a finished sequence's prefix) at its
        first `length` positions, in buffers of its own: a cache in the persistent batch leaves it
        (its row is free for the next sequence: a kept cache must not make every graphed decode
        step run a dummy row for it, nor keep the batch's buffers alive after a re-staging). An
        unknown id is RT_CACHE_LOST, a length beyond the cache's RT_BAD_VALUE."""
        c = self._held_cache(cid, "cache_keep")
        n = self._positions(c, length, "cache_keep")
        c.buffers = self._own_copy(c, n)
        if c.staged is not None:
            c.staged.free(c)
        c.length = n
        return {"ok": True, "caches": len(self.caches)}, None

    def _layout(self, streams, declared):
        """Each stream's (input name, item shape, storage dtype): what a batch's buffers hold."""
        return tuple((s["input"], tuple(int(d) for d in declared[s["input"]][2][2:]), str(self._store_dtype(s, declared))) for s in streams)

    def _restage(self, caches, streams, declared, device, need, layout, ahead=0):
        """A new persistent batch: the live caches of the previous one (in their order; only where
        its layout is this run's: caches of another program's shapes keep their rows of the old
        buffers, from which they join a batch of their own later) and the run's caches it lacked,
        each copied into its row; `need` positions per row at least, `ahead` (the rows' expected
        lengths, bounded) where the device has room for it."""
        old = self.staged
        kept = old is not None and old.layout == layout
        members = [c for c in (old.owners if kept else []) if c is not None and self.caches.get(c.cid) is c]
        seen = set(id(c) for c in members)
        members += [c for c in caches if id(c) not in seen]
        need = max([need] + [c.length for c in members])
        cap = -(-need // STAGE_STEP) * STAGE_STEP
        rows = bucket(len(members))
        if ahead > cap:
            wide = -(-ahead // STAGE_STEP) * STAGE_STEP
            if self._fits(streams, declared, device, rows, wide):
                cap = wide
        st = Staged(rows, cap, layout)
        self.counts["restages"] += 1
        # The key and value streams of one item shape, dtype and pad (every layer's keys, every
        # layer's values) are slices of one allocation, so that a run's commit appends to all of
        # them with one indexed write (`Staged.groups`).
        kv = {}
        for s in streams:
            item = tuple(int(d) for d in declared[s["input"]][2][2:])
            if len(item) == 2:
                kv.setdefault((item, self._store_dtype(s, declared), float(s["pad"])), []).append(s["input"])
        slices = {}
        for (item, dt, pad), names in kv.items():
            big = torch.full((len(names), st.rows, item[0], cap + TAIL, item[1]), pad, dtype=dt, device=device)
            st.groups.append((big, names))
            slices.update((name, big[j]) for j, name in enumerate(names))
        # Every member's filled positions of every stream, copied together (copy_all).
        dsts, srcs = [], []
        for s in streams:
            name = s["input"]
            _, dt, shape = declared[name]
            item = [int(d) for d in shape[2:]]
            if len(item) == 2:
                # Keys and values [rows, cap, heads, dim] are stored heads-first ([rows, heads, cap,
                # dim], seen through a permuted view): the program's transpose to [rows, heads, past,
                # dim] is then the storage itself at the staged capacity, which a graphed decode
                # step reads, and its concatenation with the step's keys copies contiguous blocks
                # (the strided copy took 5.3 of a Llama-3-8B step's 14 ms of kernels at 64 rows).
                # The step's keys are not copied at all where `cachedAttention` reads the cache
                # (ops.op_cached_attention): the key goes into the next position.
                phys = slices[name]
                buf = phys.permute(0, 2, 1, 3)[:, :cap]
                st.tails[name] = tail = ops.Tail(phys, 2, float(s["pad"]))
                ops.CACHE_TAILS[phys.data_ptr()] = tail
            else:
                buf = torch.full((st.rows, cap, *item), float(s["pad"]), dtype=self._store_dtype(s, declared), device=device)
            for i, c in enumerate(members):
                if c.length > 0 and name in c.buffers:
                    dsts.append(buf[i, : c.length])
                    srcs.append(c.view(name))
            st.buffers[name] = buf
        copy_all(dsts, srcs)
        for i, c in enumerate(members):
            c.buffers = {name: b[i] for name, b in st.buffers.items()}
            c.staged, c.row = st, i
            st.owners[i] = c
        self.staged = st
        return st

    def _fits(self, streams, declared, device, rows, cap):
        """Whether a batch of `rows` × `cap` positions of every stream takes at most three quarters
        of the device's free memory (the rest for the step's work; the old batch is still held
        while its rows are copied)."""
        if not str(device).startswith("cuda"):
            return True
        size = 0
        for s in streams:
            _, _, shape = declared[s["input"]]
            item = 1
            for d in shape[2:]:
                item *= int(d)
            size += rows * (cap + TAIL) * item * torch.empty((), dtype=self._store_dtype(s, declared)).element_size()
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return size <= 0.75 * free

    def _join(self, st, c, streams):
        """Writes cache `c` into a free row of batch `st` (its positions, the pad after them)."""
        row = st.owners.index(None)
        dsts, srcs = [], []
        for s in streams:
            name = s["input"]
            buf = st.buffers[name]
            buf[row].fill_(float(s["pad"]))
            if c.length > 0 and name in c.buffers:
                dsts.append(buf[row, : c.length])
                srcs.append(c.view(name))
        copy_all(dsts, srcs)
        c.buffers = {name: b[row] for name, b in st.buffers.items()}
        c.staged, c.row = st, row
        st.owners[row] = c
        self.counts["joins"] += 1

    def stats(self):
        """The counters a run's reply carries: the cache batch's (`restages`: every row copied into
        a new batch; `joins`: one row written into a free row of the batch; `gathers`: runs whose
        rows were copied out of the batch; `dummyRows`: masked rows run to keep a graphed batch's
        shape) and the step graphs' (`graphEager`, `graphCaptures`, `graphReplays`,
        `graphFailures`, `graphFirstSight`: captures made at a key's first sight; `graphCaptureUs`:
        the captures' host time, of which `graphPrimeUs` priming and `graphPassUs` the program's run
        under capture), the device's clock around the replays (`replayUs`, `betweenUs`, `betweenN`:
        cudagraph.Timeline) and the process's kernel builds (`kernelBuilds`, `kernelBuildUs`: NVRTC and
        cupy compilations and their time; `kernelCacheHits`: images read from the disk cache instead,
        tma.BUILDS)."""
        g = self.graphs.stats
        k = tma.BUILDS
        return dict(self.counts, graphEager=g["eager"], graphCaptures=g["captures"], graphReplays=g["replays"], graphFailures=g["failures"], graphFirstSight=g["firstSight"],
                    graphCaptureUs=g["captureUs"], graphPrimeUs=g["primeUs"], graphPassUs=g["passUs"], kernelBuilds=k["builds"], kernelBuildUs=k["us"], kernelCacheHits=k["cached"], **self.ahead.stats, **self.graphs.timeline.stats)

    @staticmethod
    def _store_dtype(stream, declared):
        return DTYPES[stream.get("store") or declared[stream["input"]][1]]

    def _program(self, header):
        h = header.get("handle")
        if h not in self.programs:
            raise errors.WorkerError(errors.DISPOSED, "no prepared graph with handle %r (disposed or never prepared)" % (h,))
        return self.programs[h]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="stageml_torch.worker", description=__doc__)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    # Set by rank 0 for the ranks it starts (dist.py), never by hand.
    ap.add_argument("--tp-rank", type=int, default=0)
    ap.add_argument("--tp-port", type=int, default=0)
    ap.add_argument("--tp-backend", default="gloo")
    args = ap.parse_args(argv)
    world = args.tensor_parallel_size
    if args.tp_rank > 0:
        from . import dist

        return dist.serve_rank(lambda d: Worker(d, args.tp_rank, world), args.device, world, args.tp_rank, args.tp_port, args.tp_backend)
    inp = sys.stdin.buffer
    out = sys.stdout.buffer
    # Nothing but frames may reach stdout: route stray prints to stderr.
    sys.stdout = sys.stderr
    ranks = None
    try:
        if world < 1:
            raise errors.WorkerError(tp.TP_ERROR, "tensor-parallel size must be an integer >= 1, got %d" % world)
        if world > 1:
            from . import dist

            ranks, device = dist.start(args.device, world)
            worker = Worker(device, 0, world, ranks)
        else:
            worker = Worker(pick_device(args.device))
    except errors.WorkerError as e:
        write_frame(out, {"ok": False, "code": e.code, "message": e.message})
        return 1
    try:
        return _serve(worker, inp, out, ranks)
    finally:
        if ranks is not None:
            ranks.stop()


def _serve(worker, inp, out, ranks):
    """The request loop of rank 0 (with `ranks`: every request goes to the other ranks first)."""
    replied = None
    while True:
        try:
            frame = read_frame(inp)
        except errors.WorkerError as e:
            write_frame(out, {"ok": False, "code": e.code, "message": e.message})
            return 1
        if frame is None:
            if ranks is not None:
                ranks.send(None)
            return 0
        header, tensors = frame
        if replied is not None and header.get("op") == "run":
            worker.counts["waitUs"] += int((time.perf_counter() - replied) * 1e6)
        rid = header.get("id")
        if ranks is not None:
            ranks.send(None if header.get("op") == "shutdown" else (header, tensors))
        started = time.perf_counter()
        try:
            reply, out_tensors = worker.handle(header, tensors)
        except errors.WorkerError as e:
            reply, out_tensors = {"ok": False, "code": e.code, "message": e.message}, None
        except (KeyError, TypeError, ValueError) as e:
            reply, out_tensors = {"ok": False, "code": errors.PROTOCOL, "message": "malformed %s request: %s" % (header.get("op"), e)}, None
        except Exception as e:  # noqa: BLE001 - any torch failure becomes a coded reply, the worker lives on
            traceback.print_exc(file=sys.stderr)
            reply, out_tensors = {"ok": False, "code": errors.EVAL, "message": "%s: %s" % (type(e).__name__, e)}, None
        if reply is None:
            write_frame(out, {"ok": True, "id": rid})
            return 0
        reply["id"] = rid
        writing = time.perf_counter()
        try:
            write_frame(out, reply, out_tensors)
        except errors.WorkerError as e:
            write_frame(out, {"ok": False, "id": rid, "code": e.code, "message": e.message})
        replied = time.perf_counter()
        if header.get("op") == "run":
            worker.counts["runs"] += 1
            worker.counts["runBusyUs"] += int((replied - started) * 1e6)
            worker.counts["replyUs"] += int((replied - writing) * 1e6)
        else:
            replied = None


if __name__ == "__main__":
    sys.exit(main())
