import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { interpret } from '@stageml/ir';
import { parsePlan, validatePlanDocument } from '@stageml/planner';
import { loadBundle } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { createServer } from '@stageml/server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ExitCode, runCli } from './index.js';
import { prefillInputs } from './test-fixtures.js';

const fixture = (p: string): string => fileURLToPath(new URL(`../../../fixtures/${p}`, import.meta.url));
const golden = JSON.parse(readFileSync(fixture('peft-tiny/golden.json'), 'utf8')) as Record<string, unknown> & { families: { llama: { adapters: string[] } } };
const ADAPTERS = golden.families.llama.adapters;
const prompt = (model: string, p: number) => (golden[`llama.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;

async function run(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runCli(args, { out: (l) => out.push(l), err: (l) => err.push(l) });
  return { code, out: out.join('\n'), err: err.join('\n') };
}

/** Inputs of one prefill of `ids` through a staged Llama residual with an empty KV cache. */

describe('stageml stage writes plan.json; serve --bundle applies it', () => {
  let dir: string;
  let bundle: string;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'stageml-stage-bundle-'));
    bundle = join(dir, 'llama');
    const staged = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture('peft-tiny/llama/adapters/qv-r8'), '--adapters', fixture('peft-tiny/llama/adapters'), '--budget', '64KiB', '--cutoff', 'adapter', '--out', bundle]);
    expect(staged.err).toBe('');
    expect(staged.code).toBe(ExitCode.OK);
  }, 120_000);
  afterAll(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  it('writes a versioned plan.json the planner validates, a rewrite log and the source, and the bundle still loads and runs', async () => {
    const manifest = JSON.parse(readFileSync(join(bundle, 'manifest.json'), 'utf8')) as { plan: string; rewrite: string; source: { model: string; adapters: Record<string, string> } };
    expect(manifest.plan).toBe('plan.json');
    expect(manifest.source.model).toBe(fixture('peft-tiny/llama/base').replace(/\/$/, ''));
    expect(Object.keys(manifest.source.adapters).sort()).toEqual([...ADAPTERS].sort());
    const plan = parsePlan(readFileSync(join(bundle, 'plan.json'), 'utf8'));
    validatePlanDocument(plan);
    expect(plan.format).toBe('stageml.plan');
    expect(plan.version).toBe(1);
    expect(plan.budgetBytes).toBe(64 * 1024);
    expect(plan.budgetCovers).toBe('materialized');
    expect(plan.adapters.map((a) => a.name).sort()).toEqual([...ADAPTERS].sort());
    const kinds = new Set(plan.units.map((u) => u.kind));
    expect(kinds).toEqual(new Set(['materialize', 'residual'])); // 64 KiB merges some projections, not all
    const rewrite = JSON.parse(readFileSync(join(bundle, manifest.rewrite), 'utf8')) as { format: string; version: number; cutoff: string; log: unknown[]; applied: Record<string, number> };
    expect(rewrite.format).toBe('stageml.rewrite');
    expect(rewrite.version).toBe(1);
    expect(rewrite.cutoff).toBe('adapter');
    expect(Array.isArray(rewrite.log)).toBe(true);

    const b = await loadBundle(bundle);
    expect(b.plan).toEqual(JSON.parse(readFileSync(join(bundle, 'plan.json'), 'utf8')));
    const f = await SafetensorsFile.open(fixture('peft-tiny/golden.safetensors'));
    const want = await f.readTensor('llama.qv-r8.prompt0.logits');
    await f.close();
    const logits = interpret(b.residual, { inputs: prefillInputs(prompt('qv-r8', 0).input_ids, 2, 2, 16), weights: b.constants })['logits']!;
    let worst = 0;
    for (let i = 0; i < want.data.length; i++) worst = Math.max(worst, Math.abs(logits.data[i]! - want.data[i]!));
    expect(worst).toBeLessThan(1e-3);
  }, 120_000);

  it('serves the bundle over HTTP: every adapter greedy-equal to the goldens, GET /v1/plan shows the bundle plan', async () => {
    const server = await createServer({ bundle, modelName: 'llama', padTokenId: 0, maxLoras: 4, maxLoraRank: 16 });
    const base = await server.listen('127.0.0.1', 0);
    try {
      const shown = (await (await fetch(`${base}/v1/plan`)).json()) as { memoryBudget?: number; plan: unknown; merged: Record<string, string[]>; applied: number };
      expect(shown.plan).toEqual(JSON.parse(readFileSync(join(bundle, 'plan.json'), 'utf8')));
      expect(shown.memoryBudget).toBeUndefined();
      for (const m of ['base', ...ADAPTERS]) {
        for (const p of [0, 1]) {
          const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: m === 'base' ? 'llama' : m, prompt: prompt(m, p).input_ids, max_tokens: 12, temperature: 0, ignore_eos: true, return_token_ids: true }) });
          expect(r.status).toBe(200);
          expect(((await r.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids, `${m} prompt${String(p)}`).toEqual(prompt(m, p).greedy_new_ids);
        }
      }
      // Applied as written: still the bundle's plan after serving traffic.
      const after = (await (await fetch(`${base}/v1/plan`)).json()) as { plan: unknown; merged: Record<string, string[]> };
      expect(after.plan).toEqual(shown.plan);
      const plan = parsePlan(readFileSync(join(bundle, 'plan.json'), 'utf8'));
      const merged = Object.entries(after.merged).flatMap(([a, ms]) => ms.map((m) => `${a}|${m}`)).sort();
      const want = plan.units.filter((u) => u.kind === 'materialize').map((u) => `${u.adapter}|model.layers.${String(u.layer)}.${u.projection.endsWith('_proj') && ['q_proj', 'k_proj', 'v_proj', 'o_proj'].includes(u.projection) ? 'self_attn' : 'mlp'}.${u.projection}`).sort();
      expect(merged).toEqual(want);
    } finally {
      await server.shutdown();
    }
  }, 180_000);

  it('refuses a missing bundle, a malformed plan and a plan naming adapters not loaded, with coded errors', async () => {
    await expect(createServer({ bundle: join(dir, 'nope') })).rejects.toMatchObject({ code: 'BUNDLE_INVALID', message: expect.stringContaining('manifest.json is missing') as unknown });
    const broken = join(dir, 'broken');
    cpSync(bundle, broken, { recursive: true });
    writeFileSync(join(broken, 'plan.json'), JSON.stringify({ format: 'stageml.plan', version: 1 }));
    await expect(createServer({ bundle: broken })).rejects.toMatchObject({ code: 'PLAN_BAD_DOCUMENT' });
    writeFileSync(join(broken, 'plan.json'), '{ not json');
    await expect(createServer({ bundle: broken })).rejects.toMatchObject({ code: 'BUNDLE_INVALID', message: expect.stringContaining('plan.json is not JSON') as unknown });
    const fewer = join(dir, 'fewer');
    cpSync(bundle, fewer, { recursive: true });
    const manifest = JSON.parse(readFileSync(join(fewer, 'manifest.json'), 'utf8')) as { source: { adapters: Record<string, string> } };
    delete manifest.source.adapters['o-r2'];
    writeFileSync(join(fewer, 'manifest.json'), JSON.stringify(manifest));
    await expect(createServer({ bundle: fewer, padTokenId: 0 })).rejects.toMatchObject({ code: 'BUNDLE_INVALID', message: expect.stringContaining("'o-r2' that are not loaded") as unknown });
    const cli = await run(['serve', '--bundle', bundle, '--memory-budget', '1MiB']);
    expect(cli.code).toBe(ExitCode.USAGE);
  }, 120_000);
});
