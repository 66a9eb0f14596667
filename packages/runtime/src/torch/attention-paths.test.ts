// The torch worker's folded grouped-query decode attention (native/stageml_torch/ops.py
// `folded_gqa_decode`, taken on CUDA for decode steps of under 8 rows): the query heads of each key
// head as that head's query rows must give what attention over repeated key heads gives, head for
// head. CPU torch in CI may lack SDPA (Debian's 1.13), so SDPA is stood in for by its definition;
// the folding around it is the worker's own code. bench/gpu/serve/attention_probe.py checks the
// real kernels on the GPU.
import { expect, it } from 'vitest';

import { describeWithTorch, runNativePython } from './test-support.js';

describeWithTorch('folded grouped-query decode attention (stageml_torch.ops)', () => {
  it('equals attention over repeated key heads, per query head, with a mask and a scale', () => {
    const out = runNativePython(`
import json, math, torch
from stageml_torch import ops

def sdpa(q, k, v, attn_mask=None, scale=None):
    s = scale if scale is not None else q.shape[-1] ** -0.5
    w = q @ k.transpose(-1, -2) * s
    if attn_mask is not None:
        w = w + attn_mask
    return torch.softmax(w, dim=-1) @ v

ops.F.scaled_dot_product_attention = sdpa
g = torch.Generator().manual_seed(7)
res = []
for b, hq, hkv, tk, d in ((1, 8, 2, 9, 4), (5, 12, 3, 17, 8), (3, 4, 4, 6, 2)):
    q = torch.randn(b, hq, 1, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, hkv, tk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, hkv, tk, d, generator=g, dtype=torch.float64)
    m = torch.zeros(b, 1, 1, tk, dtype=torch.float64)
    for r in range(b):
        m[r, ..., (r + 2) % tk :] = -math.inf  # each row sees its own prefix
    am = m.expand(b, hq, 1, tk)
    group = hq // hkv
    want = sdpa(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), attn_mask=am, scale=0.3)
    got = ops.folded_gqa_decode(q, k, v, am, 0.3)
    res.append([list(got.shape) == list(q.shape), float((got - want).abs().max())])
print(json.dumps(res))
`) as [boolean, number][];
    for (const [shapeOk, err] of out) {
      expect(shapeOk).toBe(true);
      expect(err).toBeLessThan(1e-12);
    }
  }, 60_000);
});
