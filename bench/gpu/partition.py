"""Could the LoRA half of a decode-sized linear run *beside* cuBLAS's base GEMM on SMs of its own?
One device call, three questions (bench/gpu/carve.py showed that cuBLASLt's SM carve-out leaves a
64-row GEMM's grid on every SM and that a side kernel then only adds its time):

1. how fast is cuBLAS's 64-row GEMM on a disjoint partition of 132 - c SMs (a CUDA green context
   made with the driver API: cuDevSmResourceSplitByCount, one group of c SMs and the remaining);
2. how many GB/s can a plain streaming read (16-byte loads, 8 in flight per thread, 2048 threads
   per SM) pull on c SMs;
3. so: what could co-running save, at the byte counts of the 64-row banks (bench/results/gpu-kernels.md).

    python3 bench/gpu/partition.py --out partition.json

Timing: CUDA-graph replay where capture on a green-context stream works, else eager launches;
events on the stream, median of 15 repetitions; the weights rotate over 4 sets (past the L2). (A first
version also launched both sides at once, eagerly: those timings were bound by the host's launches
and said nothing; they are in gpu-kernels.json, the measurement was removed.)
"""
import argparse
import ctypes
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RES_BYTES = 144  # sizeof(CUdevResource): type (4) + padding (92) + union (48)
SM_COUNT_AT = 96
SRC = r"""
extern "C" __global__ void stream_read(const uint4* __restrict__ p, unsigned long long n16, unsigned int* out) {
  const unsigned long long per = (unsigned long long)blockDim.x * 8;
  unsigned int acc = 0;
  for (unsigned long long base = (unsigned long long)blockIdx.x * per; base + per <= n16; base += (unsigned long long)gridDim.x * per) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = __ldcs(p + base + u * blockDim.x + threadIdx.x);
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}
"""


def _lib():
    lib = ctypes.CDLL("libcuda.so.1")
    return lib


def _ck(r, what):
    if r != 0:
        raise RuntimeError("%s failed: CUresult %d" % (what, r))


def partition(c):
    """Two green contexts on device 0: one of (at least) c SMs and one of the remaining SMs; returns
    [(stream handle, sm count), (stream handle, sm count)]."""
    lib = _lib()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    dev = ctypes.c_int()
    _ck(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    whole = ctypes.create_string_buffer(RES_BYTES)
    _ck(lib.cuDeviceGetDevResource(dev, whole, 1), "cuDeviceGetDevResource")
    group = ctypes.create_string_buffer(RES_BYTES)
    rest = ctypes.create_string_buffer(RES_BYTES)
    nb = ctypes.c_uint(1)
    _ck(lib.cuDevSmResourceSplitByCount(group, ctypes.byref(nb), whole, rest, 0, c), "cuDevSmResourceSplitByCount")
    out = []
    for r in (group, rest):
        desc = ctypes.c_void_p()
        _ck(lib.cuDevResourceGenerateDesc(ctypes.byref(desc), r, 1), "cuDevResourceGenerateDesc")
        g = ctypes.c_void_p()
        _ck(lib.cuGreenCtxCreate(ctypes.byref(g), desc, dev, 1), "cuGreenCtxCreate")
        s = ctypes.c_void_p()
        _ck(lib.cuGreenCtxStreamCreate(ctypes.byref(s), g, 1, 0), "cuGreenCtxStreamCreate")
        sms = int.from_bytes(r.raw[SM_COUNT_AT:SM_COUNT_AT + 4], "little")
        out.append((s.value, sms, g))
    return out


def timed(stream, fns, reps=15, graph=True):
    """Median µs of one pass over fns on `stream` (a torch stream)."""
    cur = torch.cuda.current_stream()
    stream.wait_stream(cur)
    with torch.cuda.stream(stream):
        for f in fns:
            f()
    torch.cuda.synchronize()
    g = None
    if graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                for f in fns:
                    f()
        except Exception:  # noqa: BLE001 - eager below
            traceback.print_exc(limit=1)
            g = None
            torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            e0.record()
            if g is not None:
                g.replay()
            else:
                for f in fns:
                    f()
            e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1000)
    ts.sort()
    return ts[len(ts) // 2], g is not None


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="16,32,48")
    args = ap.parse_args()
    import cupy  # noqa: PLC0415 - GPU hosts only

    torch.backends.cuda.matmul.allow_tf32 = False
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__, "device": torch.cuda.get_device_name(), "sms": sms},
           "rows": []}
    kern = cupy.RawKernel(SRC, "stream_read")
    buf = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    sink = torch.zeros(4, dtype=torch.int32, device="cuda")
    chunk = 32 << 20  # bytes one read pass streams (a 64-row bank's LoRA bytes are 17-31 MB)

    def reader(stream_ptr, blocks, i):
        off = (i % 8) * (64 << 20)
        ptr = buf.data_ptr() + off
        cs = cupy.cuda.ExternalStream(stream_ptr)
        return lambda: kern((blocks,), (1024,), (cupy.uint64(ptr), cupy.uint64(chunk // 16), cupy.uint64(sink.data_ptr())), stream=cs)

    shapes = [(64, 4096, 4096), (64, 4096, 14336)]
    gem = {}
    for (m, n, k) in shapes:
        ws = [torch.randn((n, k), device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        xs = [torch.randn((m, k), device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        ys = [torch.empty((m, n), device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        gem[(m, n, k)] = [lambda i=i, ws=ws, xs=xs, ys=ys: torch.matmul(xs[i % 4], ws[i % 4].t(), out=ys[i % 4]) for i in range(16)]
    full = torch.cuda.Stream()
    row = {"partition": "full", "sms": sms}
    for key, fns in gem.items():
        us, g = timed(full, fns)
        row["gemm %dx%dx%d us" % key] = us / len(fns)
        row["gemm graph"] = g
    rd = [reader(full.cuda_stream, 2 * sms, i) for i in range(8)]
    us, _ = timed(full, rd, graph=False)
    row["read GBps"] = chunk * len(rd) / (us * 1e-6) / 1e9
    res["rows"].append(row)
    print(json.dumps(row), flush=True)
    for c in [int(v) for v in args.parts.split(",") if v]:
        row = {"partition": c}
        try:
            (sp, nsmall, _), (rp, nrest, _) = partition(c)
            row.update({"small_sms": nsmall, "rest_sms": nrest})
            small = torch.cuda.ExternalStream(sp)
            rest = torch.cuda.ExternalStream(rp)
            for key, fns in gem.items():
                try:
                    us, g = timed(rest, fns)
                    row["gemm %dx%dx%d on rest us" % key] = us / len(fns)
                    row["gemm graph"] = g
                except Exception as ex:  # noqa: BLE001
                    row["gemm %dx%dx%d on rest" % key] = "%s: %s" % (type(ex).__name__, str(ex)[:200])
                    traceback.print_exc(limit=2)
            for blocks_per_sm in (2, 4):
                rd = [reader(sp, blocks_per_sm * nsmall, i) for i in range(8)]
                us, _ = timed(small, rd, graph=False)
                row["read on small GBps (%d blocks/SM)" % blocks_per_sm] = chunk * len(rd) / (us * 1e-6) / 1e9
                row["read on small GBps per SM (%d blocks/SM)" % blocks_per_sm] = chunk * len(rd) / (us * 1e-6) / 1e9 / nsmall
        except Exception as ex:  # noqa: BLE001
            row["error"] = "%s: %s" % (type(ex).__name__, str(ex)[:300])
            traceback.print_exc(limit=3)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    torch.cuda.synchronize()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
