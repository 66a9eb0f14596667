"""`python3 -m stageml_torch.worker [--device cpu|cuda|auto]`: serves the framed protocol
(protocol.py) on stdin/stdout for the TypeScript `torch` executor. Diagnostics go to stderr."""

import argparse
import sys
import traceback

import torch

from . import PROTOCOL_VERSION, __version__, errors
from .graph import Program
from .protocol import read_frame, write_frame


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


class Worker:
    def __init__(self, device):
        self.device = device
        self.programs = {}
        self.next_handle = 1
        self.resident = {}

    def handle(self, header, tensors):
        op = header.get("op")
        if op == "hello":
            return {"ok": True, "protocol": PROTOCOL_VERSION, "worker": __version__, "torch": torch.__version__, "device": self.device, "cuda": torch.cuda.is_available(), "deviceName": torch.cuda.get_device_name() if self.device.startswith("cuda") else "cpu"}, None
        if op == "prepare":
            device = header.get("device") or self.device
            device = pick_device(device) if device != self.device else device
            prog = Program(header["graph"], tensors, device)
            h = self.next_handle
            self.next_handle += 1
            self.programs[h] = prog
            return {"ok": True, "handle": h, "device": str(prog.device), "inputs": prog.input_names(), "outputs": prog.output_names(), "fusedLoraLinears": prog.fused}, None
        if op == "run":
            prog = self._program(header)
            tensors = self._resident(header, tensors, prog.device)
            with torch.no_grad():
                out = prog.run(tensors)
            return {"ok": True}, out
        if op == "dispose":
            self._program(header)
            del self.programs[header["handle"]]
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            return {"ok": True}, None
        if op == "shutdown":
            return None, None
        raise errors.WorkerError(errors.PROTOCOL, "unknown request op %r" % (op,))

    def _resident(self, header, tensors, device):
        """Resident inputs: `drop` ids are forgotten, `store` {name: id} inputs of this frame are kept
        (on the program's device) for later runs, `resident` {name: id} inputs are taken from what was
        kept. The stores happen first, so a failing run never leaves a sent input unkept."""
        for i in header.get("drop") or []:
            self.resident.pop(i, None)
        for name, i in (header.get("store") or {}).items():
            if name not in tensors:
                raise errors.WorkerError(errors.PROTOCOL, "store names input '%s', which the frame does not carry" % (name,))
            tensors[name] = tensors[name].to(device)
            self.resident[i] = tensors[name]
        for name, i in (header.get("resident") or {}).items():
            if i not in self.resident:
                raise errors.WorkerError(errors.BAD_VALUE, "resident input '%s' (id %r) is not held by the worker" % (name, i))
            tensors[name] = self.resident[i]
        return tensors

    def _program(self, header):
        h = header.get("handle")
        if h not in self.programs:
            raise errors.WorkerError(errors.DISPOSED, "no prepared graph with handle %r (disposed or never prepared)" % (h,))
        return self.programs[h]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="stageml_torch.worker", description=__doc__)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    inp = sys.stdin.buffer
    out = sys.stdout.buffer
    # Nothing but frames may reach stdout: route stray prints to stderr.
    sys.stdout = sys.stderr
    try:
        worker = Worker(pick_device(args.device))
    except errors.WorkerError as e:
        write_frame(out, {"ok": False, "code": e.code, "message": e.message})
        return 1
    while True:
        try:
            frame = read_frame(inp)
        except errors.WorkerError as e:
            write_frame(out, {"ok": False, "code": e.code, "message": e.message})
            return 1
        if frame is None:
            return 0
        header, tensors = frame
        rid = header.get("id")
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
        try:
            write_frame(out, reply, out_tensors)
        except errors.WorkerError as e:
            write_frame(out, {"ok": False, "id": rid, "code": e.code, "message": e.message})


if __name__ == "__main__":
    sys.exit(main())
