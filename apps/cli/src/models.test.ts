import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SafetensorsFile } from '@stageml/safetensors';
import { afterAll, describe, expect, it } from 'vitest';
import { ExitCode } from './index.js';
import { runCaptured as run } from './test-fixtures.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, unknown>;
const tmp = mkdtempSync(join(tmpdir(), 'stageml-cli-models-'));
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
});

async function maxDiff(file: string, key: string, goldenKey: string): Promise<number> {
  const a = await SafetensorsFile.open(file);
  const g = await SafetensorsFile.open(`${root}golden.safetensors`);
  const x = await a.readTensor(key);
  const y = await g.readTensor(goldenKey);
  await a.close();
  await g.close();
  expect(x.shape).toEqual(y.shape);
  let m = 0;
  for (let i = 0; i < x.data.length; i++) m = Math.max(m, Math.abs(x.data[i]! - y.data[i]!));
  return m;
}

describe('stageml run', () => {
  it('writes logits [T, vocab] equal to the golden for an adapter', async () => {
    const p = (golden['llama.qv-r8'] as Record<string, { input_ids: number[] }>)['prompt1']!;
    const out = join(tmp, 'qv.safetensors');
    const r = await run(['run', '--model', `${root}llama/base`, '--adapter', `${root}llama/adapters/qv-r8`, '--ids', p.input_ids.join(','), '--out', out]);
    expect(r.code, r.err).toBe(ExitCode.OK);
    expect(await maxDiff(out, 'logits', 'llama.qv-r8.prompt1.logits')).toBeLessThanOrEqual(1e-4);
  });

  it('writes a mixed batch [rows, T, vocab] equal to the golden', async () => {
    const mixed = golden['llama.mixed'] as { adapter_names: string[]; input_ids: number[] };
    const out = join(tmp, 'mixed.safetensors');
    const r = await run(['run', '--model', `${root}llama/base`, '--adapters', `${root}llama/adapters`, '--mixed', mixed.adapter_names.join(','), '--ids', mixed.input_ids.join(','), '--out', out]);
    expect(r.code, r.err).toBe(ExitCode.OK);
    expect(await maxDiff(out, 'logits', 'llama.mixed.logits')).toBeLessThanOrEqual(1e-4);
  });

  it('rejects bad flags and bad input with coded errors', async () => {
    expect((await run(['run', '--model', `${root}llama/base`, '--ids', '1,x', '--out', join(tmp, 'x.safetensors')])).code).toBe(ExitCode.USAGE);
    const bad = await run(['run', '--model', `${root}llama/base`, '--ids', '1,999', '--out', join(tmp, 'x.safetensors')]);
    expect(bad.code).toBe(ExitCode.INVALID_INPUT);
    expect(bad.err).toContain('error[MODEL_BAD_TOKEN]');
    const missing = await run(['run', '--model', join(tmp, 'nope'), '--ids', '1', '--out', join(tmp, 'x.safetensors')]);
    expect(missing.code).toBe(ExitCode.IO);
    expect(missing.err).toContain('error[MODEL_IO]');
  });
});

describe('stageml run: every adapter kind the server takes (fixtures/peft-kinds, PEFT 0.21 logits)', () => {
  const kinds = fileURLToPath(new URL('../../../fixtures/peft-kinds/', import.meta.url));
  const kindsGolden = JSON.parse(readFileSync(`${kinds}golden.json`, 'utf8')) as { prompt_ids: number[][] };
  const ids = kindsGolden.prompt_ids[0]!;
  async function diffTo(file: string, row: number | undefined, key: string): Promise<number> {
    const a = await SafetensorsFile.open(file);
    const g = await SafetensorsFile.open(`${kinds}golden.safetensors`);
    const x = await a.readTensor('logits');
    const y = await g.readTensor(key);
    await a.close();
    await g.close();
    const n = y.data.length;
    const off = row === undefined ? 0 : row * n;
    expect(row === undefined ? x.data.length : x.data.length / x.shape[0]!).toBe(n);
    let m = 0;
    for (let i = 0; i < n; i++) m = Math.max(m, Math.abs(x.data[off + i]! - y.data[i]!));
    return m;
  }
  for (const kind of ['lora-bias', 'dora', 'tokens', 'head']) {
    it(`${kind} (tied Qwen2): logits at every position within 1e-4 of PEFT's`, async () => {
      const out = join(tmp, `kind-${kind}.safetensors`);
      const r = await run(['run', '--model', `${kinds}qwen2`, '--adapter', `${kinds}qwen2/adapters/${kind}`, '--ids', ids.join(','), '--out', out]);
      expect(r.code, r.err).toBe(ExitCode.OK);
      expect(await diffTo(out, undefined, `qwen2.${kind}.prompt0`)).toBeLessThanOrEqual(1e-4);
    });
  }
  it('a mixed batch of every kind and a base row: each row equals PEFT run alone', async () => {
    const out = join(tmp, 'kinds-mixed.safetensors');
    const rows = ['lora', 'lora-bias', 'dora', 'tokens', 'head', '__base__'];
    const r = await run(['run', '--model', `${kinds}qwen2`, '--adapters', `${kinds}qwen2/adapters`, '--mixed', rows.join(','), '--ids', ids.join(','), '--out', out]);
    expect(r.code, r.err).toBe(ExitCode.OK);
    for (const [i, row] of rows.entries()) expect(await diffTo(out, i, `qwen2.${row === '__base__' ? 'base' : row}.prompt0`), row).toBeLessThanOrEqual(1e-4);
  });
  it('expert LoRA on cpu-native and with --executor auto (its MoE kernels): within 1e-4 of PEFT', async () => {
    for (const executor of ['cpu-native', 'auto']) {
      const out = join(tmp, `kind-experts-${executor}.safetensors`);
      const r = await run(['run', '--model', `${kinds}qwen3_moe`, '--adapter', `${kinds}qwen3_moe/adapters/experts`, '--executor', executor, '--ids', ids.join(','), '--out', out]);
      expect(r.code, r.err).toBe(ExitCode.OK);
      expect(await diffTo(out, undefined, 'qwen3_moe.experts.prompt0'), executor).toBeLessThanOrEqual(1e-4);
    }
  });
  it('generate runs the engine too: DoRA and trainable tokens pick PEFT\'s argmax first', async () => {
    const g = await SafetensorsFile.open(`${kinds}golden.safetensors`);
    try {
      for (const kind of ['dora', 'tokens']) {
        const r = await run(['generate', '--model', `${kinds}qwen2`, '--adapter', `${kinds}qwen2/adapters/${kind}`, '--ids', ids.join(','), '--max-new-tokens', '1', '--ignore-eos', '--json']);
        expect(r.code, r.err).toBe(ExitCode.OK);
        const want = (await g.readTensor(`qwen2.${kind}.prompt0`)).data;
        const V = want.length / ids.length;
        let best = 0;
        for (let v = 1; v < V; v++) if (want[(ids.length - 1) * V + v]! > want[(ids.length - 1) * V + best]!) best = v;
        expect((JSON.parse(r.out) as { new_ids: number[] }).new_ids, kind).toEqual([best]);
      }
    } finally {
      await g.close();
    }
  });
  for (const kind of ['experts', 'router']) {
    it(`${kind} LoRA (Qwen3-MoE target_parameters): logits at every position within 1e-4 of PEFT's`, async () => {
      const out = join(tmp, `kind-${kind}.safetensors`);
      const r = await run(['run', '--model', `${kinds}qwen3_moe`, '--adapter', `${kinds}qwen3_moe/adapters/${kind}`, '--ids', ids.join(','), '--out', out]);
      expect(r.code, r.err).toBe(ExitCode.OK);
      expect(await diffTo(out, undefined, `qwen3_moe.${kind}.prompt0`)).toBeLessThanOrEqual(1e-4);
    });
  }
  it('a Qwen3-MoE mixed batch of router, expert and plain LoRA and a base row: each row equals PEFT run alone', async () => {
    const out = join(tmp, 'moe-kinds-mixed.safetensors');
    const rows = ['router', 'experts', 'lora', '__base__'];
    const r = await run(['run', '--model', `${kinds}qwen3_moe`, '--adapters', `${kinds}qwen3_moe/adapters`, '--mixed', rows.join(','), '--ids', ids.join(','), '--out', out]);
    expect(r.code, r.err).toBe(ExitCode.OK);
    for (const [i, row] of rows.entries()) expect(await diffTo(out, i, `qwen3_moe.${row === '__base__' ? 'base' : row}.prompt0`), row).toBeLessThanOrEqual(1e-4);
  });
});

describe('stageml generate', () => {
  for (const model of ['base', 'all-r16']) {
    it(`prints the 12 golden greedy tokens as JSON (${model})`, async () => {
      const p = (golden[`llama.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)['prompt0']!;
      const adapter = model === 'base' ? [] : ['--adapter', `${root}llama/adapters/${model}`];
      const r = await run(['generate', '--model', `${root}llama/base`, ...adapter, '--ids', p.input_ids.join(','), '--max-new-tokens', '12', '--greedy', '--pad-token-id', '0', '--ignore-eos', '--json']);
      expect(r.code, r.err).toBe(ExitCode.OK);
      const out = JSON.parse(r.out) as { new_ids: number[]; text: string };
      expect(out.new_ids).toEqual(p.greedy_new_ids);
      expect(typeof out.text).toBe('string');
    });
  }

  it('tokenizes a text prompt and samples reproducibly with a seed', async () => {
    const args = ['generate', '--model', `${root}llama/base`, '--prompt', 'The staged program', '--max-new-tokens', '5', '--temperature', '0.8', '--top-p', '0.9', '--top-k', '50', '--seed', '7', '--json'];
    const a = await run(args);
    const b = await run(args);
    expect(a.code, a.err).toBe(ExitCode.OK);
    expect(a.out).toBe(b.out);
  });

  it('rejects conflicting or invalid flags', async () => {
    expect((await run(['generate', '--model', `${root}llama/base`, '--max-new-tokens', '3'])).code).toBe(ExitCode.USAGE);
    expect((await run(['generate', '--model', `${root}llama/base`, '--ids', '1', '--max-new-tokens', '0'])).code).toBe(ExitCode.USAGE);
    expect((await run(['generate', '--model', `${root}llama/base`, '--ids', '1', '--max-new-tokens', '2', '--greedy', '--temperature', '0.5'])).code).toBe(ExitCode.USAGE);
    const t = await run(['generate', '--model', `${root}llama/base`, '--ids', '1', '--max-new-tokens', '2', '--temperature', '-1']);
    expect(t.code).toBe(ExitCode.INVALID_INPUT);
    expect(t.err).toContain('MODEL_BAD_OPTIONS');
  });
});

describe('stageml run and generate on Mixtral', () => {
  for (const model of ['base', 'attn-r8', 'experts-r4']) {
    it(`matches the golden logits and greedy tokens (${model})`, async () => {
      const p = (golden[`mixtral.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)['prompt3']!;
      const adapter = model === 'base' ? [] : ['--adapter', `${root}mixtral/adapters/${model}`];
      const out = join(tmp, `mixtral-${model}.safetensors`);
      const r = await run(['run', '--model', `${root}mixtral/base`, ...adapter, '--ids', p.input_ids.join(','), '--out', out]);
      expect(r.code, r.err).toBe(ExitCode.OK);
      expect(await maxDiff(out, 'logits', `mixtral.${model}.prompt3.logits`)).toBeLessThanOrEqual(1e-4);
      const g = await run(['generate', '--model', `${root}mixtral/base`, ...adapter, '--ids', p.input_ids.join(','), '--max-new-tokens', '12', '--pad-token-id', '0', '--ignore-eos', '--json']);
      expect(g.code, g.err).toBe(ExitCode.OK);
      expect((JSON.parse(g.out) as { new_ids: number[] }).new_ids).toEqual(p.greedy_new_ids);
    });
  }
});
