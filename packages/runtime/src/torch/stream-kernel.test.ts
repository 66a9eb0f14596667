// Host-side logic of the streaming CUDA LoRA kernel (native/stageml_torch/stream.py) on CPU torch:
// its kernels cannot run here, but the names it looks up in a cubin, the shapes it accepts, the
// launch geometry and the configuration override can, and without a GPU every entry point must
// decline (return None) so callers fall back.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';

import { describeWithTorch, runNativePython } from './test-support.js';

const py = runNativePython;

describeWithTorch('stream kernel host side (stageml_torch.stream)', () => {
  it('names both kernel families as nvcc mangles them and instantiates each configuration once', () => {
    const out = py(`
import json
from stageml_torch import stream as st
cfgs = [(1, 1, 8, 1, 2, 0), ('cl', 2, 4, 8, 1, 8, 0), (1, 1, 8, 1, 2, 1)]
print(json.dumps({"m": [st.mangled(c) for c in cfgs], "i": st.explicit_instantiations(cfgs).strip().split("\\n")}))
`) as { m: string[]; i: string[] };
    expect(out.m).toEqual([
      '_Z11lora_streamILi1ELi1ELi8ELi1ELi2EEvPKtS1_S1_S1_PtPfPiPKiS6_PKfiiiiiiii',
      '_Z14lora_stream_clILi2ELi4ELi8ELi1ELi8EEvPKtS1_S1_S1_PtPfPiPKiS6_PKfiiiiiiii',
      '_Z11lora_streamILi1ELi1ELi8ELi1ELi2EEvPKtS1_S1_S1_PtPfPiPKiS6_PKfiiiiiiii',
    ]);
    expect(out.i).toHaveLength(2);
    expect(out.i[0]).toMatch(/^template __global__ void lora_stream<1,1,8,1,2>\(/);
    expect(out.i[1]).toMatch(/^template __global__ void lora_stream_cl<2,4,8,1,8>\(/);
  });

  it('accepts only shapes the kernel tiles exactly, and picks configurations per row bucket', () => {
    const out = py(`
import json
from stageml_torch import stream as st
cl = ('cl', 1, 4, 2, 4, 8, 0)
old = (1, 1, 8, 1, 2, 0)
print(json.dumps({
  "ok": [st.suits(old, 8, 4096, 4096, 16), st.suits(cl, 16, 1024, 14336, 64), st.suits(old, 1, 14336, 14336, 8)],
  "bad": [st.suits(old, 9, 4096, 4096, 16), st.suits(old, 1, 4100, 4096, 16), st.suits(old, 1, 4096, 4000, 16),
          st.suits(old, 1, 4096, 4096, 12), st.suits(cl, 1, 4096, 4096 + 512, 16)],
  "single": [st.config_for(m) for m in (1, 8, 9, 64, 65, 129, 4096)],
  "bank": [st.config_for(m, bank=True) for m in (1, 16, 17, 64, 65)],
  "bank_t": [st.config_for(m, True, r, True) for m, r in ((8, 64), (12, 64), (16, 16), (16, 64), (32, 64))],
  "kch": [st._kch(1, 4096, 8), st._kch(64, 4096, 8), st._kch(1, 14336, 8)],
}))
`) as { ok: boolean[]; bad: boolean[]; single: unknown[]; bank: unknown[]; bank_t: unknown[]; kch: number[] };
    expect(out.ok).toEqual([true, true, true]);
    expect(out.bad).toEqual([false, false, false, false, false]);
    // One adapter: the wgmma ring at 1-8 rows, the TMA ring to 32 (tma-kernel.test.ts covers their
    // host side), Triton at 33-64, cuBLAS + shrink + expand2 at 65-128, cuBLAS alone ("cx") beyond.
    expect(out.single).toEqual([
      ['wg', 64, 2, 8, 12, 0],
      ['wg', 64, 2, 8, 12, 0],
      ['tma', 64, 1, 2, 16, 12, 0, 1],
      null,
      ['sx', 32, 128, 0, 1],
      ['cx'],
      ['cx'],
    ]);
    // Banks: the stream kernels to 16 rows, cuBLAS + shrink + the expand beside it (EV 3) at 17-64, the caller's SGMV beyond.
    expect(out.bank).toEqual([[1, 1, 8, 1, 2, 0], ['cl', 1, 4, 2, 4, 8, 0], ['sx', 32, 128, 1, 3], ['sx', 32, 128, 1, 3], null]);
    // With b_bank_t and ranks above 16 the side-stream sx path also takes 9-16 rows; narrow banks and
    // 1-8 rows keep the stream kernels, 17-64 rows are the same either way.
    expect(out.bank_t).toEqual([[1, 1, 8, 1, 2, 0], ['sx', 32, 128, 1, 3], ['cl', 1, 4, 2, 4, 8, 0], ['sx', 32, 128, 1, 3], ['sx', 32, 128, 1, 3]]);
    // Producer K chunks: about 64-128 producer blocks, every warp's share a multiple of 64.
    expect(out.kch).toEqual([8, 2, 4]);
  });

  it('takes configurations from STAGEML_STREAM_CONFIGS (null turns a bucket off)', () => {
    const dir = mkdtempSync(join(tmpdir(), 'stream-cfg-'));
    const file = join(dir, 'cfg.json');
    writeFileSync(file, JSON.stringify({ single: { '8': null, '16': ['cl', 1, 4, 2, 4, 8, 0] }, bank: { '32': [1, 1, 8, 4, 4, 0] } }));
    const out = py(`
import json
from stageml_torch import stream as st
print(json.dumps([st.config_for(1), st.config_for(16), st.config_for(32, bank=True), st.config_for(1, bank=True)]))
`, { STAGEML_STREAM_CONFIGS: file }) as unknown[];
    expect(out).toEqual([null, ['cl', 1, 4, 2, 4, 8, 0], [1, 1, 8, 4, 4, 0], [1, 1, 8, 1, 2, 0]]);
  });

  it('declines on CPU tensors and on inputs it does not take, so callers fall back', () => {
    const out = py(`
import json, torch
from stageml_torch import stream as st
x = torch.randn(2, 4096, dtype=torch.bfloat16)
w = torch.randn(4096, 4096, dtype=torch.bfloat16)
a = torch.randn(16, 4096, dtype=torch.bfloat16)
b = torch.randn(4096, 16, dtype=torch.bfloat16)
ab = torch.randn(4, 16, 4096, dtype=torch.bfloat16)
bb = torch.randn(4, 4096, 16, dtype=torch.bfloat16)
slots = torch.zeros(2, dtype=torch.int32)
ranks = torch.full((4,), 16, dtype=torch.int32)
scales = torch.ones(4)
print(json.dumps([st.lora_linear(x, w, a, b, 2.0) is None, st.lora_linear(x.float(), w.float(), a.float(), b.float(), 2.0) is None,
                  st.lora_bank_linear(x, w, ab, bb, slots, ranks, scales) is None]))
`) as boolean[];
    expect(out).toEqual([true, true, true]);
  });
});
