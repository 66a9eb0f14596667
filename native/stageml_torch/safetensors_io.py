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


class MappedSafetensors:
    """One .safetensors file memory-mapped: its header parsed once, each tensor a view of the map in
    its stored dtype (no copy until it moves to a device). A malformed file is `RT_BAD_BUNDLE`."""

    def __init__(self, path):
        import mmap

        self.path = path
        try:
            with open(path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise errors.WorkerError(errors.BAD_BUNDLE, "cannot map %s: %s" % (path, e)) from e
        if len(self._map) < 8:
            raise errors.WorkerError(errors.BAD_BUNDLE, "%s is too short for a safetensors file" % path)
        (n,) = struct.unpack("<Q", self._map[:8])
        if 8 + n > len(self._map):
            raise errors.WorkerError(errors.BAD_BUNDLE, "%s: the header length %d runs past the file" % (path, n))
        try:
            self.header = json.loads(self._map[8 : 8 + n].decode("utf-8"))
        except ValueError as e:
            raise errors.WorkerError(errors.BAD_BUNDLE, "%s: the header is not JSON (%s)" % (path, e)) from e
        self._base = 8 + n
        # torch.frombuffer wants a writable buffer: a private (copy-on-write) view of the same pages.
        self._view = memoryview(self._map)

    def tensor(self, name):
        """Tensor `name` as a CPU tensor over the mapped pages, in its stored dtype."""
        info = self.header.get(name)
        if name == "__metadata__" or not isinstance(info, dict):
            raise errors.WorkerError(errors.BAD_BUNDLE, "%s has no tensor '%s'" % (self.path, name))
        dt = _DTYPES.get(info.get("dtype"))
        if dt is None:
            raise errors.WorkerError(errors.BAD_BUNDLE, "%s: tensor '%s' has unsupported dtype %s" % (self.path, name, info.get("dtype")))
        start, end = info["data_offsets"]
        shape = [int(s) for s in info["shape"]]
        count = 1
        for s in shape:
            count *= s
        itemsize = torch.empty((), dtype=dt).element_size()
        if end < start or self._base + end > len(self._map) or end - start != count * itemsize:
            raise errors.WorkerError(errors.BAD_BUNDLE, "%s: tensor '%s' lies outside the file or does not fit its shape" % (self.path, name))
        if count == 0:
            return torch.empty(shape, dtype=dt)
        import warnings

        with warnings.catch_warnings():
            # The map is read-only; the tensor is only ever read (copied to the device).
            warnings.simplefilter("ignore")
            raw = torch.frombuffer(self._view, dtype=torch.uint8, count=end - start, offset=self._base + start)
        if (self._base + start) % itemsize != 0:
            # Not aligned to its element size in the file: viewed as its dtype only after a copy.
            raw = raw.clone()
        return raw.view(dt).reshape(shape)
