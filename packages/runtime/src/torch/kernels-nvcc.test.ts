// The torch worker's hand-written CUDA kernels (native/stageml_torch/lora_tma.cu, lora_stream.cu)
// compiled with nvcc for sm_90a: every configuration the dispatch tables ship, and the sx path's
// shrink/expand/add kernels (one projection's and a set's), must build with no register spills
// and no stack frame. The GPU runs them (bench/gpu/*); this catches a source change that no longer builds, or that spills, before a
// device call does. CI has nvcc on this machine kind and must run it: there a missing nvcc fails
// the test; elsewhere it is skipped.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect, it } from 'vitest';

import { NATIVE_DIR, describeWithTorch, runNativePython } from './test-support.js';

const NVCC = spawnSync('nvcc', ['--version'], { encoding: 'utf8' }).status === 0;
const root = mkdtempSync(join(tmpdir(), 'stageml-kernels-'));
afterAll(() => {
  rmSync(root, { recursive: true, force: true });
});

interface Entry {
  readonly entry: string;
  readonly registers: number;
  readonly spill: number;
  readonly stack: number;
}

/** nvcc -cubin for sm_90a of `file` (which includes the kernel source and instantiates), its ptxas entries. */
function build(name: string, source: string, instantiations: string): Entry[] {
  const cu = join(root, `${name}.cu`);
  writeFileSync(cu, `#include "${join(NATIVE_DIR, 'stageml_torch', source)}"\n${instantiations}`);
  const r = spawnSync('nvcc', ['-gencode=arch=compute_90a,code=sm_90a', '-cubin', '-std=c++17', '-Xptxas', '-v', '-o', join(root, `${name}.cubin`), cu], {
    encoding: 'utf8',
    timeout: 240_000,
  });
  if (r.status !== 0) throw new Error(`nvcc failed for ${source} (${String(r.status)}): ${r.stderr.slice(0, 4000)}`);
  const entries: Entry[] = [];
  let current: { entry: string; stack?: number; spill?: number } | undefined;
  for (const line of r.stderr.split('\n')) {
    const fn = /Compiling entry function '([^']+)'/.exec(line) ?? /Function properties for (\S+)/.exec(line);
    if (fn !== null && (current === undefined || current.entry !== fn[1])) current = { entry: fn[1] ?? '' };
    const frame = /(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads/.exec(line);
    if (frame !== null && current !== undefined) {
      current.stack = Number(frame[1]);
      current.spill = Number(frame[2]) + Number(frame[3]);
    }
    const regs = /Used (\d+) registers/.exec(line);
    if (regs !== null && current?.stack !== undefined) {
      entries.push({ entry: current.entry, registers: Number(regs[1]), spill: current.spill ?? 0, stack: current.stack });
      current = undefined;
    }
  }
  return entries;
}

describeWithTorch('the torch worker CUDA kernels under nvcc (sm_90a)', () => {
  const needs = !NVCC && process.env['CI'] !== undefined;
  (needs ? it : it.skipIf(!NVCC))(
    'builds every shipped configuration and the sx kernels with no spills',
    () => {
      if (needs) throw new Error('nvcc is required for this test in CI but was not found on PATH');
      const src = runNativePython(`
import json
from stageml_torch import stream as st, tma
tables = [st.DEFAULT, st.DEFAULT_BANK, st.DEFAULT_HIGH_RANK, st.WGT_FALLBACK, st.DEFAULT_BANK_T_WIDE]
cfgs = [c for t in tables for c in t.values() if c is not None]
wg = [(c, r) for c in cfgs if tma.is_wg(c) for r in (16, 64)]
tm = [(c, 16) for c in cfgs if tma.is_tma(c)]
wgt = [c for c in cfgs if tma.is_wgt(c)]
stream = [c for c in cfgs if not isinstance(c[0], str) or c[0] == "cl"]
print(json.dumps({"tma": tma.wg_explicit_instantiations(wg) + tma.explicit_instantiations(tm) + tma.wgt_explicit_instantiations(wgt),
                  "stream": st.explicit_instantiations(stream), "counts": [len(wg), len(tm), len(wgt), len(stream)]}))
`) as { tma: string; stream: string; counts: number[] };
      // the tables name wgmma rings, TMA rings, lora_wgt and stream kernels
      expect(src.counts.every((n) => n > 0)).toBe(true);
      const entries = [...build('tma', 'lora_tma.cu', src.tma), ...build('stream', 'lora_stream.cu', src.stream)];
      const names = entries.map((e) => e.entry).join(' ');
      for (const k of ['lora_wg', 'lora_tma', 'lora_wgt', 'lora_shrink', 'lora_expand2', 'lora_expand3', 'lora_expand4', 'lora_add', 'lora_stream', 'lora_stream_cl', 'lora_shrink_set', 'lora_expand4_set', 'lora_add_set'])
        expect(names, k).toContain(`${String(k.length)}${k}`);
      for (const e of entries) expect(e.spill + e.stack, e.entry).toBe(0);
    },
    300_000,
  );
});
