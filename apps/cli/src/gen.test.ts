import { mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { ExitCode } from './index.js';
import { fixture, runCaptured as run } from './test-fixtures.js';

describe('stageml gen --out', () => {
  let dir: string;
  let bundle: string;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'stageml-gen-'));
    bundle = join(dir, 'bundle');
    const staged = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture('peft-tiny/llama/adapters/qv-r8'), '--cutoff', 'adapter', '--out', bundle]);
    expect(staged.code).toBe(ExitCode.OK);
  });

  for (const target of ['triton', 'cuda'] as const) {
    it(`${target}: refuses an existing non-empty directory without --force and keeps its files`, async () => {
      const out = join(dir, `out-${target}`);
      mkdirSync(out);
      writeFileSync(join(out, 'unrelated.txt'), 'keep me');
      const refused = await run(['gen', target, bundle, '--out', out]);
      expect(refused.code).toBe(ExitCode.IO);
      expect(refused.err).toMatch(/exists and is not empty/);
      expect(refused.err).toContain('--force');
      expect(readFileSync(join(out, 'unrelated.txt'), 'utf8')).toBe('keep me');
      // The fixture is f32: CUDA generation (f16/bf16 only) refuses it after the directory check.
      if (target === 'cuda') return;
      const forced = await run(['gen', target, bundle, '--out', out, '--force']);
      expect(forced.err).toBe('');
      expect(forced.code).toBe(ExitCode.OK);
      expect(readdirSync(out)).not.toContain('unrelated.txt');
      // An empty directory (or none) needs no --force.
      const empty = join(dir, `empty-${target}`);
      mkdirSync(empty);
      expect((await run(['gen', target, bundle, '--out', empty])).code).toBe(ExitCode.OK);
    });
  }
});
