// Issue 35 ("one runtime"): the engine is the only model runtime. `CausalLM`, the second runtime
// @stageml/models had, must not come back under that name in the TypeScript sources, and the
// deleted primitive-pattern recognisers must not either: the torch worker's (`fuse.py`,
// `bank_fuse.py`, `in_place_concats`, bank.py's base-linear check behind `bind_kernels`) and
// onnx-lower's `fuseSkipNorms`. (HF architecture names such as `LlamaForCausalLM` are data, not the runtime.)
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import * as models from '@stageml/models';

const root = fileURLToPath(new URL('../../..', import.meta.url));
const self = 'packages/engine/src/one-runtime.test.ts';

/** Tracked files under `dirs` whose names end with one of `exts` (deleted ones skipped). */
function tracked(dirs: readonly string[], exts: readonly string[]): { path: string; text: string }[] {
  const names = execFileSync('git', ['ls-files', '-z', '--', ...dirs], { cwd: root, encoding: 'utf8', maxBuffer: 64 * 2 ** 20 }).split('\0');
  return names.filter((f) => exts.some((e) => f.endsWith(e)) && f !== self).flatMap((path) => {
    try {
      return [{ path, text: readFileSync(join(root, path), 'utf8') }];
    } catch {
      return [];
    }
  });
}

/** `CausalLM` as an identifier of its own (not the tail of an HF architecture name). */
export function namesCausalLm(text: string): boolean {
  return /(?<![A-Za-z0-9_])CausalLM(?![A-Za-z0-9_])/.test(text);
}

describe('one runtime', () => {
  it('tells the runtime from HF architecture names', () => {
    expect(namesCausalLm("import { CausalLM } from '@stageml/models';")).toBe(true);
    expect(namesCausalLm('const lm = await CausalLM.load(dir);')).toBe(true);
    expect(namesCausalLm("architectures: ['LlamaForCausalLM', 'Qwen3MoeForCausalLM']")).toBe(false);
    expect(namesCausalLm('CausalLMOptions')).toBe(false);
  });

  it('no TypeScript source names CausalLM, and @stageml/models exports no model runtime', () => {
    const files = tracked(['packages', 'apps', 'bench'], ['.ts', '.mts']);
    expect(files.length).toBeGreaterThan(100);
    expect(files.filter((f) => namesCausalLm(f.text)).map((f) => f.path)).toEqual([]);
    expect(Object.keys(models)).not.toContain('CausalLM');
    expect(Object.keys(models)).not.toContain('generate');
  });

  it('the torch worker has none of its deleted pattern recognisers', () => {
    const files = tracked(['native'], ['.py']);
    expect(files.length).toBeGreaterThan(5);
    expect(files.map((f) => f.path).filter((p) => /(^|\/)(bank_)?fuse\.py$/.test(p))).toEqual([]);
    expect(files.filter((f) => f.text.includes('in_place_concats')).map((f) => f.path)).toEqual([]);
    // bank.py's `bind_kernels` once found a `loraBank` whose base was a `linear` read by it alone
    // (through `_uses_and_defs`); it binds the `loraBankLinear` op by name now.
    expect(files.filter((f) => f.text.includes('_uses_and_defs')).map((f) => f.path)).toEqual([]);
    const bank = files.find((f) => f.path === 'native/stageml_torch/bank.py')!.text;
    const bind = /\ndef bind_kernels\([\s\S]*?(?=\ndef )/.exec(bank)?.[0] ?? '';
    expect(bind).toContain('OP_KEY');
    expect(bind).not.toMatch(/"linear"|defs|uses/);
  });

  it('no backend fuses a residual add into an rmsNorm by matching them: onnx-lower lowers the skipRmsNorm op', () => {
    const files = tracked(['packages', 'native'], ['.ts', '.py']);
    expect(files.filter((f) => /fuseSkipNorms?\b/.test(f.text)).map((f) => f.path)).toEqual([]);
  });
});
