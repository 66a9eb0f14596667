"""Runs the torch worker with torch's CUDA sync debug mode on (run.sh, SYNC_DEBUG=1): every
operation that makes the host wait for the device is reported once per distinct call stack, on
stderr (the server's log), with the worker's frames that led to it. A decode step launched ahead
must queue without such a wait; the reply's copy of the picks is the one expected."""

import runpy
import sys
import traceback
import warnings

import torch

seen = set()


def show(message, category, filename, lineno, file=None, line=None):
    stack = [f for f in traceback.extract_stack()[:-1] if "stageml_torch" in f.filename]
    key = (str(message)[:60], tuple((f.filename, f.lineno) for f in stack))
    if key in seen:
        return
    seen.add(key)
    where = " <- ".join("%s:%d %s" % (f.filename.rsplit("/", 1)[-1], f.lineno, f.name) for f in reversed(stack[-6:]))
    sys.stderr.write("sync-debug: %s at %s\n" % (str(message).splitlines()[0][:120], where or "%s:%d" % (filename, lineno)))


warnings.showwarning = show
warnings.simplefilter("always")
torch.cuda.set_sync_debug_mode("warn")
sys.argv = ["stageml_torch.worker"] + sys.argv[1:]
runpy.run_module("stageml_torch.worker", run_name="__main__", alter_sys=True)
