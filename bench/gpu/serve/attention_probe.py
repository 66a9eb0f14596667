"""SDPA on the decode and prefill shapes of the torch worker's attention (native/stageml_torch/ops.py
`op_attention`), per backend, on the device machine: the first call of each new shape (SDPA's cuDNN
backend builds a plan there) and the steady time per call (ms), and each path's largest error
against f32 math. What chose the worker's paths: masked grouped-query attention repeats the key
heads for a prompt chunk, folds the query heads into rows for a decode step of under 8 rows, and
leaves larger decode steps to cuDNN inside a CUDA graph's capture.

    python3 bench/gpu/serve/attention_probe.py [--heads 32 --kv-heads 8]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# The worker's own folded path (native/stageml_torch/ops.py), not a copy of it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "native"))
from stageml_torch.ops import folded_gqa_decode  # noqa: E402


def timed(fn, n=50):
    s = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = (time.perf_counter() - s) * 1e3
    s = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return {"firstMs": round(first, 3), "ms": round((time.perf_counter() - s) / n * 1e3, 4)}


def case(b, tq, tk, d, hq, hkv):
    dev = "cuda"
    g = hq // hkv
    q = torch.randn(b, hq, tq, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(b, hkv, tk, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    m = torch.zeros(b, 1, tq, tk, device=dev, dtype=torch.bfloat16)
    m[..., tk // 2 : tk - tq] = float("-inf")
    am = m.expand(b, hq, tq, tk)
    ref = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1), attn_mask=am.float())
    paths = {
        "gqa (cuDNN)": ([SDPBackend.CUDNN_ATTENTION], lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=am, enable_gqa=True)),
        "gqa (math)": ([SDPBackend.MATH], lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=am, enable_gqa=True)),
        "repeated keys (efficient)": ([SDPBackend.EFFICIENT_ATTENTION], lambda: F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=am)),
    }
    if tq == 1:
        paths["folded queries (efficient)"] = ([SDPBackend.EFFICIENT_ATTENTION], lambda: folded_gqa_decode(q, k, v, am))
    out = {"rows": b, "queries": tq, "keys": tk, "headDim": d}
    for name, (backends, fn) in paths.items():
        try:
            with sdpa_kernel(backends):
                r = timed(fn)
                r["maxErr"] = float((fn().float() - ref).abs().max())
        except Exception as e:  # noqa: BLE001 - a backend that does not take the shape
            r = {"error": str(e)[:80]}
        out[name] = r
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    a = ap.parse_args()
    for d in (64, 128):
        for b, tq, tk in ((1, 1, 257), (8, 1, 193), (32, 1, 321), (64, 1, 257), (64, 1, 513), (64, 128, 256)):
            print(json.dumps(case(b, tq, tk, d, a.heads, a.kv_heads)), flush=True)


if __name__ == "__main__":
    main()
