"""The process group of a tensor-parallel worker (`--tensor-parallel-size N`).

Rank 0 is the process the TypeScript executor started: it speaks the framed protocol on stdio,
starts ranks 1..N-1 itself (`python3 -m stageml_torch.worker --tp-rank r …`, stdin closed, their
stdout into its stderr) and sends each request it reads to them over torch.distributed
(`broadcast_object_list` on a gloo group of its own, so requests never wait on the GPUs), then
every rank handles it; only rank 0 answers. Rank r computes on `cuda:r` (NCCL, with
`NCCL_NVLS_ENABLE=0`: no NVLink multicast) or on the CPU (gloo).

The group lives and dies as one: rank 0 watches its children and exits when one exits (the
executor sees its worker die and starts a new group); a child exits when rank 0 does (the
parent-death signal, and a broken broadcast). A collective that waits longer than
`STAGEML_TORCH_TP_TIMEOUT` seconds (default 600) fails the group the same way.
"""

import ctypes
import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import torch

from . import errors, tp


def rank_devices(device, world):
    """The device of each rank for the worker's `--device` (`auto`, `cpu`, `cuda`, `cuda:K`: ranks
    on K, K+1, …); more CUDA ranks than devices is `RT_TENSOR_PARALLEL` naming both."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return ["cpu"] * world
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        first = int(device[5:]) if ":" in device else 0
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if first + world > have:
            raise errors.WorkerError(tp.TP_ERROR, "tensor-parallel size %d needs CUDA devices %d..%d, torch %s sees %d" % (world, first, first + world - 1, torch.__version__, have))
        return ["cuda:%d" % (first + r) for r in range(world)]
    raise errors.WorkerError("RT_BACKEND_UNAVAILABLE", "unknown device '%s' (auto, cpu, cuda, cuda:N)" % device)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    """Linux: this process gets SIGKILL when its parent (rank 0) exits."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Ranks:
    """Rank 0's view of its group: the children it started and the control group."""

    def __init__(self, world, devices, children, control):
        self.world = world
        self.devices = devices
        self.children = children
        self.control = control
        self.stopping = False

    def pids(self):
        return [os.getpid()] + [c.pid for c in self.children]

    def send(self, message):
        """Sends a request (header, tensors) — or None, to stop — from rank 0 to the others."""
        import torch.distributed as dist

        if message is None:
            self.stopping = True
        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.control)

    def watch(self):
        """A thread that ends this process when a child exits (the group goes down as one)."""

        def run():
            while True:
                for c in self.children:
                    code = c.poll()
                    if code is not None and not self.stopping:
                        sys.stderr.write("stageml_torch.worker: tensor-parallel rank pid %d exited (%s); the group stops\n" % (c.pid, code))
                        sys.stderr.flush()
                        for o in self.children:
                            if o.poll() is None:
                                o.kill()
                        os._exit(3)
                time.sleep(0.1)

        threading.Thread(target=run, daemon=True).start()

    def stop(self):
        """Waits a moment for the children to leave (after `send(None)`), then ends them."""
        self.stopping = True
        for c in self.children:
            try:
                c.wait(timeout=5)
            except subprocess.TimeoutExpired:
                c.kill()


def _init(backend, port, rank, world, device):
    import torch.distributed as dist

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(backend, init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=tp.timeout_seconds()))
    control = dist.new_group(backend="gloo") if backend != "gloo" else None
    tp.Group.rank, tp.Group.world, tp.Group.group = rank, world, None
    return control


def start(device, world):
    """Rank 0: starts ranks 1..world-1 and joins the group; returns (Ranks, rank 0's device)."""
    devices = rank_devices(device, world)
    backend = "nccl" if devices[0].startswith("cuda") else "gloo"
    port = free_port()
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    children = []
    for r in range(1, world):
        args = [sys.executable, "-m", "stageml_torch.worker", "--device", devices[r], "--tensor-parallel-size", str(world), "--tp-rank", str(r), "--tp-port", str(port), "--tp-backend", backend]
        children.append(subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(), env=env))
    ranks = Ranks(world, devices, children, None)
    ranks.watch()
    ranks.control = _init(backend, port, 0, world, devices[0])
    return ranks, devices[0]


def serve_rank(worker_factory, device, world, rank, port, backend):
    """Ranks 1..N-1: join the group, then handle every request rank 0 sends until it sends None."""
    import torch.distributed as dist

    _die_with_parent()
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    control = _init(backend, port, rank, world, device)
    worker = worker_factory(device)
    while True:
        box = [None]
        try:
            dist.broadcast_object_list(box, src=0, group=control)
        except RuntimeError as e:
            sys.stderr.write("stageml_torch.worker rank %d: the group broke (%s)\n" % (rank, e))
            return 1
        if box[0] is None:
            return 0
        header, tensors = box[0]
        try:
            worker.handle(header, tensors)
        except Exception as e:  # noqa: BLE001 - rank 0 reports the same failure of the same request
            sys.stderr.write("stageml_torch.worker rank %d: %s: %s\n" % (rank, type(e).__name__, e))
