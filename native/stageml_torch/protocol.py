"""The framed binary protocol between the TypeScript `torch` executor and this worker.

A frame is a little-endian u32 header length, the header (UTF-8 JSON), then the raw bytes of each
tensor the header lists under `tensors`, in order. A tensor entry is
`{"name", "dtype", "shape", "nbytes"}`; its bytes are the dtype's *host storage* on the TS side
(`allocData` in @stageml/ir): f32/f16/bf16 as float32, f64 and i64 as float64, i32 as int32, i8
as int8, u8 and bool as uint8, little-endian, row-major.

Requests (`op`): `hello`, `prepare` (graph JSON, device, parameter tensors → `handle`), `run`
(handle, input tensors → output tensors; resident inputs and caches, docs/gpu.md §3),
`cache_drop` (ids), `dispose` (handle), `shutdown`. Every reply has `ok`;
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


def _to_host(t):
    """`t` in host memory. A CUDA tensor goes through a pinned buffer: a pageable copy of a decode
    step's logits ran at ~1.3 GB/s on the H200 host (64 rows × 32000 f32, 8 MB: ~6 ms)."""
    t = t.detach()
    if t.device.type != "cuda":
        return t.to("cpu")
    key = (tuple(t.shape), t.dtype, str(t.device))
    buf = _PINNED.get(key)
    if buf is None:
        size = t.numel() * t.element_size()
        if size > PINNED_BYTES:
            return t.to("cpu")
        if sum(b.numel() * b.element_size() for b in _PINNED.values()) + size > PINNED_BYTES:
            _PINNED.clear()
        buf = _PINNED[key] = torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=True)
    buf.copy_(t, non_blocking=True)
    torch.cuda.current_stream(t.device).synchronize()
    return buf


def to_wire(t):
    """(IR dtype name, contiguous CPU tensor in wire storage) of a tensor (valid until the next call
    for a CUDA tensor: it may be a reused pinned buffer)."""
    if t.dtype not in IR_DTYPE:
        raise errors.WorkerError(errors.BAD_VALUE, "tensor dtype %s has no IR dtype" % t.dtype)
    dtype = IR_DTYPE[t.dtype]
    return dtype, _to_host(t).to(WIRE[dtype]).contiguous()


def write_frame(stream, header, tensors=None):
    """Writes one frame; `tensors` maps name → torch tensor (any device)."""
    header = dict(header)
    payloads = []
    entries = []
    for name, t in (tensors or {}).items():
        dtype, w = to_wire(t)
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
