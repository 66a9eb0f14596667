"""Recognises LoRA linears in a prepared graph, `add(linear(x, W), mul(linear(linear(x, A), B), s))`
(either operand order, interior values read once, s a scalar literal, no bias), and runs each as one
step: on CUDA with f16/bf16 and at most 64 rows through a one-launch split-K Triton kernel that
streams W once (bench/results/gpu-kernels.md: 1.10-1.30x cuBLAS's base GEMM alone, against 1.4-1.5x
for a base GEMM plus shrink/expand pair), otherwise as the same five torch ops.

Which bundles it fuses: only LoRA linears whose factors are in the linear's own dtype, i.e.
bundles staged with `--adapter-dtype same` (and f32 ones). A bf16/f16 bundle staged with the
default `--adapter-dtype f32` (PEFT's numerics: x cast to f32, A, B and s in f32, added to the base
output in f32, rounded once) has casts in each LoRA chain, so the pattern does not match, and its
factors are f32, which the check below refuses too: that path always runs as the IR's torch ops,
the same calls PEFT makes, and is never replaced by the kernel.

For `same` bundles the kernel accumulates x·Wᵀ + s·(x·Aᵀ)·Bᵀ in f32 and rounds once, where the
IR's ops round after each op: not bit-equal to the IR (closer to f32; bench/results/gpu-e2e.md).
That is the documented meaning of `auto` for them; `STAGEML_TORCH_FUSE=0` gives the IR's op-by-op
rounding. The torch path on CUDA keeps the op-by-op rounding, on the CPU (f16/bf16 computed in
f32) it rounds once too. `STAGEML_TORCH_FUSE`: `auto` (default: fuse on CUDA), `0` (never fuse),
`1` (fuse also on the CPU, through the torch path; the tests use it).
"""

import os

import torch
import torch.nn.functional as F

_TRITON = None


def _triton_kernel():
    """The Triton module, or False when Triton does not import (CPU hosts, torch 1.13)."""
    global _TRITON
    if _TRITON is None:
        try:
            from . import triton_lora

            _TRITON = triton_lora
        except Exception:  # noqa: BLE001 - any import failure means: no kernel, torch path
            _TRITON = False
    return _TRITON


def mode():
    v = os.environ.get("STAGEML_TORCH_FUSE", "auto")
    return v if v in ("auto", "0", "1") else "auto"


def uses_and_defs(steps, outputs):
    """Of steps (key, fn, operands, attrs, ids) and the output value ids: how many times each value
    is read (an output counts as a read), and the index of the step defining each value."""
    uses = {}
    for _, _, operands, _, _ in steps:
        for v in operands:
            uses[v] = uses.get(v, 0) + 1
    for v in outputs:
        uses[v] = uses.get(v, 0) + 1
    defs = {}
    for i, (_, _, _, _, ids) in enumerate(steps):
        for v in ids:
            defs[v] = i
    return uses, defs


def fuse_lora(steps, value_types, consts, params, outputs, on_cuda):
    """Rewrites `steps` (key, fn, operands, attrs, ids), replacing each LoRA linear with one step.
    `consts` maps value ids of scalar literals to their float; returns (steps, count)."""
    m = mode()
    if m == "0" or (m == "auto" and not on_cuda):
        return steps, 0
    uses, defs = uses_and_defs(steps, outputs)

    def op(v, key):
        i = defs.get(v)
        if i is None or steps[i][0] != key or uses.get(v, 0) != 1:
            return None
        return i

    drop = set()
    out = list(steps)
    count = 0
    for i, (key, _, operands, _, ids) in enumerate(steps):
        if key != "add" or len(operands) != 2:
            continue
        for base_v, delta_v in ((operands[0], operands[1]), (operands[1], operands[0])):
            ib = op(base_v, "linear")
            im = op(delta_v, "mul")
            if ib is None or im is None or len(steps[ib][2]) != 2:
                continue
            ma, mb = steps[im][2]
            for expand_v, s_v in ((ma, mb), (mb, ma)):
                ie = op(expand_v, "linear")
                if ie is None or s_v not in consts or len(steps[ie][2]) != 2:
                    continue
                t_v, b_v = steps[ie][2]
                ish = op(t_v, "linear")
                if ish is None or len(steps[ish][2]) != 2:
                    continue
                x_v, a_v = steps[ish][2]
                x_b, w_v = steps[ib][2]
                if x_b != x_v or not all(p in params for p in (w_v, a_v, b_v)):
                    continue
                # Factors in another dtype than the linear (PEFT-exact f32 factors): never fused.
                if any(value_types[p][1] != value_types[ids[0]][1] for p in (w_v, a_v, b_v)):
                    continue
                fused = LoraStep(consts[s_v], value_types[ids[0]][1])
                out[i] = ("loraLinear", fused, [x_v, w_v, a_v, b_v], {}, ids)
                drop.update((ib, im, ie, ish))
                count += 1
                break
            else:
                continue
            break
    return [s for j, s in enumerate(out) if j not in drop], count


class LoraStep:
    """One LoRA linear: y = x·Wᵀ + s·((x·Aᵀ)·Bᵀ)."""

    def __init__(self, scale, dtype):
        self.scale = float(scale)
        self.dtype = dtype

    def __call__(self, args, attrs, ctx):
        x, w, a, b = args
        if x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
            k = _triton_kernel()
            if k:
                y = k.lora_linear(x, w, a, b, self.scale)
                if y is not None:
                    return [y]
        # The unfused ops, each rounded to the value's dtype (the IR's semantics).
        y0 = F.linear(x, w)
        t = F.linear(x, a)
        u = F.linear(t, b)
        # (a fill, not a host-to-device copy: nothing a CUDA graph capture cannot take)
        s = torch.full((), self.scale, dtype=u.dtype, device=u.device)
        return [y0 + u * s]
