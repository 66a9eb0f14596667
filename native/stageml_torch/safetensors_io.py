"""A minimal safetensors reader (no dependency beyond torch; Debian's python3-torch has no
`safetensors` package): header JSON, then little-endian row-major tensor bytes."""

import json
import struct

import torch

from . import errors

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors(path):
    """All tensors of a .safetensors file as {name: CPU tensor}; a malformed file is `RT_BAD_BUNDLE`."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise errors.WorkerError(errors.BAD_BUNDLE, "cannot read %s: %s" % (path, e)) from e
    if len(raw) < 8:
        raise errors.WorkerError(errors.BAD_BUNDLE, "%s is too short for a safetensors file" % path)
    (n,) = struct.unpack("<Q", raw[:8])
    try:
        header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    except ValueError as e:
        raise errors.WorkerError(errors.BAD_BUNDLE, "%s: the header is not JSON (%s)" % (path, e)) from e
    base = 8 + n
    out = {}
    buf = bytearray(raw[base:])
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _DTYPES.get(info["dtype"])
        if dt is None:
            raise errors.WorkerError(errors.BAD_BUNDLE, "%s: tensor '%s' has unsupported dtype %s" % (path, name, info["dtype"]))
        start, end = info["data_offsets"]
        shape = info["shape"]
        if end < start or end > len(buf):
            raise errors.WorkerError(errors.BAD_BUNDLE, "%s: tensor '%s' lies outside the file" % (path, name))
        if end == start:
            out[name] = torch.empty(shape, dtype=dt)
            continue
        t = torch.frombuffer(buf, dtype=torch.uint8, count=end - start, offset=start)
        out[name] = t.view(dt).reshape(shape).clone()
    return out
