// Host side of the compute-bound fused base + LoRA paths (native/stageml_torch/big.py, lora_big.cu)
// on CPU torch: the kernels cannot run here, but the configuration checks, the chunking, the names
// looked up in a cubin, the dispatch's choice per row count and rank, and the cuBLAS-only ("cx")
// composition's arithmetic (plain torch ops, so CPU float32 computes the same function) can.
import { expect, it } from 'vitest';

import { describeWithTorch, runNativePython } from './test-support.js';

const py = runNativePython;

describeWithTorch('compute-bound LoRA host side (stageml_torch.big)', () => {
  it('rejects malformed configurations with RT_BAD_VALUE and accepts the documented ones', () => {
    const out = py(`
import json
from stageml_torch import big, errors
bad = [("big", 3, 2, 8, 8, 1, 4, 1), ("big", 0, 0, 8, 8, 1, 4, 1), ("big", 0, 2, 8, 6, 1, 4, 1), ("big", 0, 2, 8, 8, 3, 4, 1),
       ("big", 0, 2, 8, 4, 8, 1, 0), ("big", 0, 2, 8, 8, 1, 3, 1), ("big", 0, 2, 8, 8, 1, 4, 2), ("big", 0, 2, 8, 8, 1, 4), ("cx", 1), ("sx",)]
res = []
for c in bad:
    try:
        (big.check_cx if c[0] == "cx" else big.check_big)(c)
        res.append("accepted")
    except errors.WorkerError as e:
        res.append(e.code)
print(json.dumps({"bad": res, "ok": [list(big.check_big(("big", 2, 4, 16, 16, 2, 2, 1))), list(big.check_cx(("cx",)))]}))
`) as { bad: string[]; ok: unknown[][] };
    expect(out.bad).toEqual(Array(10).fill('RT_BAD_VALUE'));
    expect(out.ok).toEqual([['big', 2, 4, 16, 16, 2, 2, 1], ['cx']]);
  });

  it('cuts rows and columns into chunks that cover them once, tiles matching cuBLAS where the size allows', () => {
    const out = py(`
import json
from stageml_torch import big
print(json.dumps({"rows": [big.chunks(4096, 4), big.chunks(1000, 4), big.chunks(300, 2), big.chunks(77, 1)],
                  "cols": [big.col_chunks(4096, 4), big.col_chunks(1024, 3)],
                  "rp": [big.rank_pad(r) for r in (8, 16, 24, 32, 64, 12, 72, 0)]}))
`) as { rows: number[][][]; cols: number[][][]; rp: (number | null)[] };
    expect(out.rows[0]).toEqual([[0, 1024], [1024, 2048], [2048, 3072], [3072, 4096]]);
    expect(out.rows[1]).toEqual([[0, 256], [256, 512], [512, 768], [768, 1000]]);
    expect(out.rows[2]).toEqual([[0, 256], [256, 300]]);
    expect(out.rows[3]).toEqual([[0, 77]]);
    expect(out.cols).toEqual([[[0, 1024], [1024, 2048], [2048, 3072], [3072, 4096]], [[0, 384], [384, 768], [768, 1024]]]);
    expect(out.rp).toEqual([16, 16, 32, 32, 64, null, null, null]);
  });

  it('names lora_lowrank instantiations as nvcc mangles them and checks the shapes each one tiles', () => {
    const out = py(`
import json
from stageml_torch import big
c = ("big", 0, 2, 16, 8, 1, 4, 1)
print(json.dumps({"m": big.mangled(16, 8, 1, 4, 0, 1), "i": big.explicit_instantiations([(16, 8, 1, 4, 0, 1), (16, 8, 1, 4, 0, 1), (64, 4, 1, 2, 1, 0)]).strip().split("\\n"),
                  "suits": [big.suits(c, 4096, 4096, 4096, 16), big.suits(c, 5, 4096, 4096, 8), big.suits(c, 4096, 4096, 4096, 32),
                            big.suits(c, 4096, 4096 + 512, 4096, 16), big.suits(c, 4096, 4096, 4096 + 64, 16), big.suits(("big", 0, 2, 16, 8, 1, 4, 0), 4096, 4096, 4096, 64)]}))
`) as { m: string; i: string[]; suits: boolean[] };
    expect(out.m).toBe('_Z12lora_lowrankILi16ELi8ELi1ELi4ELi0ELi1EEvPKtS1_S1_Ptfiiiii');
    expect(out.i).toHaveLength(2);
    expect(out.i[0]).toMatch(/^template __global__ void lora_lowrank<16, 8, 1, 4, 0, 1>\(/);
    // B in shared memory only up to rank 16; N a multiple of 128·NW, K of 64·U·NW/MG
    expect(out.suits).toEqual([true, true, false, false, false, true]);
  });

  it('picks cuBLAS alone ("cx") beyond 128 rows and above rank 16 at 65-128 rows, sx up to rank 16', () => {
    const out = py(`
import json
from stageml_torch import stream as st
print(json.dumps([st._pick(m, 4096, 4096, r, False, None) for m, r in ((100, 16), (100, 8), (100, 32), (128, 64), (129, 16), (4096, 64))]
                 + [st._pick(4096, 4096, 4096, 16, False, ("sx", 32, 128))]))
`) as unknown[];
    // sx needs the GPU family (unavailable on CPU): its rows come back None here; cx needs nothing.
    expect(out).toEqual([null, null, ['cx'], ['cx'], ['cx'], ['cx'], ['sx', 32, 128]]);
  });

  it('computes y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ in the cx composition (writing every element of y)', () => {
    const out = py(`
import json, torch
from stageml_torch import big
torch.manual_seed(5)
m, n, k, r = 37, 48, 64, 8
x, w, a, b = torch.randn(m, k), torch.randn(n, k), torch.randn(r, k), torch.randn(n, r)
y = torch.full((m, n), float("nan"))
got = big.cx_launch(x, w, a, b, y, 1.5)
ref = x.double() @ w.double().t() + 1.5 * (x.double() @ a.double().t()) @ b.double().t()
print(json.dumps({"same": got.data_ptr() == y.data_ptr(), "finite": bool(torch.isfinite(y).all()), "rel": float((y.double() - ref).norm() / ref.norm())}))
`) as { same: boolean; finite: boolean; rel: number };
    expect(out.same).toBe(true);
    expect(out.finite).toBe(true);
    expect(out.rel).toBeLessThan(1e-5);
  });
});
