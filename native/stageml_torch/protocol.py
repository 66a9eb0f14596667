"""The framed binary protocol between the TypeScript `torch` executor and this worker.

A frame is a little-endian u32 header length, the header (UTF-8 JSON), then the raw bytes of each
tensor the header lists under `tensors`, in order. A tensor entry is
`{"name", "dtype", "shape", "nbytes"}`; its bytes are the dtype's *host storage* on the TS side
(`allocData` in @stageml/ir): f32/f16/bf16 as float32, f64 and i64 as float64, i32 as int32, i8
as int8, u8 and bool as uint8, little-endian, row-major.

Requests (`op`): `hello`, `prepare` (graph JSON, device, parameter tensors → `handle`), `run`
(handle, input tensors → output tensors; resident inputs and caches, docs/gpu.md §3),
`cache_drop` (ids), `dispose` (handle), `shutdown`; since version 4 `load` (tensors the worker reads
from safetensors files itself), `alloc` (zero tensors) and `write` (element ranges of them, in
place), all kept as resident inputs by id; since version 5 `cache_fork` (a new cache holding the first
positions of another, copied on the device: prefix caching without a host copy) and `cache_keep`
(a cache kept at its first positions, out of the persistent batch). Every reply has `ok`;
a failed request replies `{"ok": false, "code": "RT_…", "message"}` and changes no state.
"""

import json
import struct

import torch

from . import errors
from .ops import DTYPES

# Host storage of each IR dtype on the wire.
WIRE = {
    "f64": torch.float64,
    "i64": torch.float64,
    "f32": torch.float32,
    "f16": torch.float32,
    "bf16": torch.float32,
    "i32": torch.int32,
    "i8": torch.int8,
    "u8": torch.uint8,
    "bool": torch.uint8,
}
IR_DTYPE = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 1 << 30


def _read_exact(stream, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = stream.readinto(view[got:])
        if not k:
            if got == 0 and n > 0:
                return None
            raise errors.WorkerError(errors.PROTOCOL, "stream ended inside a frame (%d of %d bytes)" % (got, n))
        got += k
    return buf


def read_frame(stream):
    """Reads one frame: (header dict, {name: torch tensor in the IR dtype on the CPU}); None at EOF."""
    raw = _read_exact(stream, 4)
    if raw is None:
        return None
    (n,) = struct.unpack("<I", raw)
    if n > MAX_HEADER:
        raise errors.WorkerError(errors.PROTOCOL, "header of %d bytes is too large" % n)
    header = json.loads(bytes(_read_exact(stream, n)).decode("utf-8"))
    tensors = {}
    for t in header.get("tensors", []):
        dtype = t["dtype"]
        if dtype not in WIRE:
            raise errors.WorkerError(errors.PROTOCOL, "tensor '%s': unknown dtype %r" % (t.get("name"), dtype))
        wire = WIRE[dtype]
        shape = [int(s) for s in t["shape"]]
        count = 1
        for s in shape:
            count *= s
        nbytes = count * torch.empty((), dtype=wire).element_size()
        if int(t["nbytes"]) != nbytes:
            raise errors.WorkerError(errors.PROTOCOL, "tensor '%s': %s%s needs %d bytes, header says %s" % (t["name"], dtype, shape, nbytes, t["nbytes"]))
        data = _read_exact(stream, nbytes) if nbytes > 0 else bytearray()
        if nbytes > 0 and data is None:
            raise errors.WorkerError(errors.PROTOCOL, "stream ended inside tensor '%s'" % t["name"])
        flat = torch.frombuffer(data, dtype=wire) if nbytes > 0 else torch.empty(0, dtype=wire)
        tensors[t["name"]] = from_wire(flat.reshape(shape), dtype)
    return header, tensors


def from_wire(t, dtype):
    """A wire tensor (host storage) as a tensor of the IR dtype."""
    want = DTYPES[dtype]
    if dtype == "bool":
        return t != 0
    return t if t.dtype == want else t.to(want)


# Pinned host buffers for replies from a GPU, by (shape, dtype, device), reused by the next frame
# (write_frame has written the bytes before it returns); at most PINNED_BYTES in all.
_PINNED = {}
PINNED_BYTES = 512 << 20


def _to_host(t, uses, waits):
    """`t` in host memory, in its wire storage (or a `_Widen` to convert after the wait). A CUDA
    tensor of `GPU_WIDEN_MIN` elements or more is converted where it lives (bf16 and f16 to f32,
    i64 to f64: the host then only copies); it goes through a pinned buffer (a pageable
    copy of a decode step's logits ran at ~1.3 GB/s on the H200 host: 64 rows × 32000 f32, 8 MB,
    ~6 ms), copied without waiting: its stream goes into `waits`, which the caller synchronizes
    once for the whole frame. `uses` counts the frame's tensors of one shape and dtype, each of
    which takes a buffer of its own (a step's 64 new keys and values have one shape)."""
    t = t.detach()
    wire = WIRE[IR_DTYPE[t.dtype]]
    if t.device.type != "cuda":
        return t.to("cpu").to(wire).contiguous()
    if t.numel() >= GPU_WIDEN_MIN:
        t = t.to(wire)
    key = (tuple(t.shape), t.dtype, str(t.device))
    n = uses.get(key, 0)
    uses[key] = n + 1
    key += (n,)
    buf = _PINNED.get(key)
    if buf is None:
        size = t.numel() * t.element_size()
        if size > PINNED_BYTES:
            return t.to("cpu").to(wire).contiguous()
        if sum(b.numel() * b.element_size() for b in _PINNED.values()) + size > PINNED_BYTES:
            _PINNED.clear()
        buf = _PINNED[key] = torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=True)
    buf.copy_(t, non_blocking=True)
    waits[str(t.device)] = torch.cuda.current_stream(t.device)
    return buf if buf.dtype == wire else _Widen(buf)


class _Widen:
    """A pinned buffer still to be widened to its wire storage on the host, once the frame's copies
    are waited for."""

    __slots__ = ("buf",)

    def __init__(self, buf):
        self.buf = buf


# Tensors of at least this many elements are widened on the GPU (a Llama-3-8B step's reply at 64
# rows: 2.0-3.2 ms written against 9.3-13.8 ms widened on the host, bench/results/gpu-worker.md);
# smaller ones on the host, where one row's 64 new keys cost less than 64 kernel launches.
GPU_WIDEN_MIN = 1 << 16


def write_frame(stream, header, tensors=None):
    """Writes one frame; `tensors` maps name → torch tensor (any device). Every CUDA tensor is on
    its way to the host before one wait for all of them (a wait per tensor cost a round trip each:
    65 in a 32-layer step's reply)."""
    header = dict(header)
    hosts = []
    uses, waits = {}, {}
    for name, t in (tensors or {}).items():
        if t.dtype not in IR_DTYPE:
            raise errors.WorkerError(errors.BAD_VALUE, "tensor '%s': dtype %s has no IR dtype" % (name, t.dtype))
        hosts.append((name, IR_DTYPE[t.dtype], _to_host(t, uses, waits)))
    for s in waits.values():
        s.synchronize()
    payloads = []
    entries = []
    for name, dtype, w in hosts:
        if isinstance(w, _Widen):
            w = w.buf.to(WIRE[dtype])
        data = memoryview(w.numpy()).cast("B") if w.numel() > 0 else b""  # the tensor's bytes, not a copy
        entries.append({"name": name, "dtype": dtype, "shape": list(w.shape), "nbytes": len(data)})
        payloads.append(data)
    header["tensors"] = entries
    body = json.dumps(header, separators=(",", ":")).encode("utf-8")
    stream.write(struct.pack("<I", len(body)))
    stream.write(body)
    for p in payloads:
        stream.write(p)
    stream.flush()
