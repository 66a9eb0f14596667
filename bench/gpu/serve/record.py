"""Runs the torch worker recording every request frame the server sends it (run.sh, on by default;
RECORD=0 turns it off), so that replay.py can later send the same frames to a fresh worker with no
server around it: the worker alone on exactly the work the server gave it.

RECORD_DIR receives `frames.bin` (the request bytes as read, in order), `index.jsonl` (one line per
frame: byte offset, length, op, and the wall clock when the frame had been read) and `meta.json`
(the worker's arguments, the environment it needs, and the time spent writing the record, which
the server's start-up and its steps paid)."""

import json
import os
import sys
import time

from stageml_torch import worker as W

DIR = os.environ["RECORD_DIR"]
os.makedirs(DIR, exist_ok=True)


class Tee:
    """The worker's stdin, copying every byte read into the record."""

    def __init__(self, raw, out):
        self.raw, self.out, self.n, self.write_s = raw, out, 0, 0.0
        # Why the record stopped (a full disk): the worker goes on serving, the replay refuses.
        self.failed = None

    def readinto(self, view):
        k = self.raw.readinto(view)
        if k:
            if self.failed is None:
                t = time.perf_counter()
                try:
                    self.out.write(view[:k])
                except OSError as e:
                    self.failed = "writing the record failed after %d bytes: %s" % (self.n, e)
                    print("record.py: %s; the run goes on unrecorded" % self.failed, file=sys.stderr)
                self.write_s += time.perf_counter() - t
            self.n += k
        return k


# Unbuffered: every frame is in the file as soon as the worker has read it, however the worker ends.
TEE = Tee(sys.stdin.buffer, open(os.path.join(DIR, "frames.bin"), "wb", buffering=0))
INDEX = open(os.path.join(DIR, "index.jsonl"), "w", buffering=1)
_read = W.read_frame


def recorded(stream):
    start = TEE.n
    frame = _read(TEE)
    if frame is not None:
        INDEX.write(json.dumps({"off": start, "len": TEE.n - start, "op": frame[0].get("op"), "t": time.time()}) + "\n")
    return frame


def meta():
    env = {k: v for k, v in os.environ.items() if k.startswith(("STAGEML_", "PYTHON", "CUDA_", "NCCL_", "TORCH"))}
    with open(os.path.join(DIR, "meta.json"), "w") as f:
        json.dump({"argv": sys.argv[1:], "env": env, "bytes": TEE.n, "record_write_s": TEE.write_s, "failed": TEE.failed}, f)


W.read_frame = recorded
meta()
try:
    code = W.main(sys.argv[1:])
finally:
    meta()
sys.exit(code)
