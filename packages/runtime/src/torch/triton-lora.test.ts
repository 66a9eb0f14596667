// Host side of the one-launch split-K Triton kernel (native/stageml_torch/triton_lora.py) on CPU
// torch: Triton is not installed here, so a stand-in module raises what Triton raises when a
// compiled tile needs more shared memory than the GPU has; the entry point must then decline
// (return None, so the caller runs the unfused ops) and not try that tile again.
import { expect, it } from 'vitest';

import { describeWithTorch, runNativePython } from './test-support.js';

describeWithTorch('Triton LoRA kernel host side (stageml_torch.triton_lora)', () => {
  it('declines a tile the shared memory cannot hold instead of raising, and remembers it', () => {
    const out = runNativePython(`
import json, sys, types
import torch
tr, tl, rt, er = (types.ModuleType(n) for n in ("triton", "triton.language", "triton.runtime", "triton.runtime.errors"))
class OutOfResources(Exception):
    pass
er.OutOfResources = OutOfResources
launches = []
class Kernel:
    def __init__(self, f):
        self.f = f
    def __getitem__(self, grid):
        def launch(*args, **kw):
            launches.append((self.f.__name__, grid, args[15]))
            if args[15] > 16:  # the row tile (M_BUCKET): 64 does not fit, 16 does
                raise OutOfResources("out of resource: shared memory, Required: 262144, Hardware limit: 232448")
        return launch
tr.jit = lambda f=None, **kw: Kernel(f) if f is not None else Kernel
tr.next_power_of_2 = lambda n: 1 << (n - 1).bit_length()
tr.language, tr.runtime, rt.errors, tl.constexpr = tl, rt, er, object
sys.modules.update({"triton": tr, "triton.language": tl, "triton.runtime": rt, "triton.runtime.errors": er})
from stageml_torch import triton_lora as t
w = torch.zeros(256, 256, dtype=torch.bfloat16)
a = torch.zeros(64, 256, dtype=torch.bfloat16)
b = torch.zeros(256, 64, dtype=torch.bfloat16)
res = [t.lora_linear_triton(torch.zeros(m, 256, dtype=torch.bfloat16), w, a, b, 2.0) for m in (40, 64, 8)]
print(json.dumps({"none": [r is None for r in res], "shape": list(res[2].shape), "launches": [[l[0], list(l[1]), l[2]] for l in launches],
                  "too_big": sorted([list(k[:2]) for k in t._TOO_BIG])}))
`) as { none: boolean[]; shape: number[]; launches: [string, number[], number][]; too_big: number[][] };
    // 40 rows: the 64-row tile raises, so None; 64 rows: the same tile, not launched again; 8 rows: the 16-row tile runs.
    expect(out.none).toEqual([true, true, false]);
    expect(out.shape).toEqual([8, 256]);
    expect(out.launches.map((l) => l[2])).toEqual([64, 16]);
    expect(out.launches.every((l) => l[0] === '_kernel')).toBe(true);
    expect(out.too_big).toEqual([[64, 64]]);
  });
});
