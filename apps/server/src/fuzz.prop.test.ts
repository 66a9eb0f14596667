// Seeded, bounded fuzzing (issue 19): the HTTP schemas, adapter configs and safetensors headers.
// Every input ends in a success or a coded 4xx error, never an internal error or a hang.
// FUZZ_RUNS raises the count (CI runs the small default).
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import fc from 'fast-check';
import { StageError } from '@stageml/ir';
import { parseLoraConfig, rankFor, scalingFor, targetsModule } from '@stageml/peft';
import { parseRouterConfig } from '@stageml/router';
import { parseSafetensors } from '@stageml/safetensors';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type StageServer, createServer } from './index.js';

const RUNS = Number(process.env['FUZZ_RUNS'] ?? 40);
const SEED = 19;
const fixtures = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const MODULES = ['model.layers.0.self_attn.q_proj', 'model.layers.1.mlp.down_proj', 'lm_head', 'model.layers.10.self_attn.v_proj'];

/** Values that stress validators: wrong types, huge and tiny numbers, deep and odd strings. */
const nasty = fc.oneof(
  fc.constantFrom(null, true, false, 0, -1, 1e308, -1e308, 5e-324, Number.MAX_SAFE_INTEGER, 2 ** 53 + 2, '', 'llama', 'qv-r8', '../../etc/passwd', '\u0000', '(a+)+$', '.{7}(.*)*Z'),
  fc.string({ maxLength: 40 }),
  fc.double(),
  fc.integer(),
  fc.array(fc.integer({ min: -5, max: 600 }), { maxLength: 12 }),
  fc.jsonValue({ maxDepth: 4 }),
);
const completionBody = fc.record(
  { model: fc.oneof(fc.constantFrom('llama', 'qv-r8', 'nope'), nasty), prompt: fc.oneof(fc.array(fc.integer({ min: 0, max: 511 }), { minLength: 1, maxLength: 8 }), fc.string({ minLength: 1, maxLength: 30 }), nasty), max_tokens: fc.oneof(fc.integer({ min: 1, max: 6 }), nasty), temperature: nasty, top_p: nasty, top_k: nasty, seed: nasty, stream: fc.oneof(fc.boolean(), nasty), stop: nasty, n: nasty, logprobs: nasty, extra: nasty },
  { requiredKeys: [] },
);
const chatBody = fc.record({ model: fc.constantFrom('llama', 'o-r2'), messages: fc.oneof(fc.array(fc.record({ role: fc.oneof(fc.constantFrom('user', 'system', 'assistant'), nasty), content: fc.oneof(fc.string({ maxLength: 30 }), nasty) }), { maxLength: 3 }), nasty), max_tokens: fc.oneof(fc.integer({ min: 1, max: 4 }), nasty), stream: fc.oneof(fc.boolean(), nasty) }, { requiredKeys: [] });
const adminBody = fc.record({ lora_name: nasty, lora_path: fc.oneof(fc.constantFrom(`${fixtures}llama/adapters/qv-r8`, '/etc', '/dev/zero', '..'), nasty), tenants: nasty, lora_int_id: nasty }, { requiredKeys: [] });

describe('fuzz: HTTP schemas against the real server', () => {
  let server: StageServer;
  let base: string;
  beforeAll(async () => {
    server = await createServer({ modelDir: `${fixtures}llama/base`, modelName: 'llama', adaptersDir: `${fixtures}llama/adapters`, adapterRoots: [`${fixtures}llama/adapters`], maxNewTokens: 8, bodyTimeoutMs: 5000, loadTimeoutMs: 5000 });
    base = await server.listen('127.0.0.1', 0);
  });
  afterAll(async () => {
    await server.shutdown();
  });

  it('answers every body with a success or a coded 4xx, and keeps serving', async () => {
    const arb = fc.oneof(
      completionBody.map((b) => ['/v1/completions', JSON.stringify(b)] as const),
      chatBody.map((b) => ['/v1/chat/completions', JSON.stringify(b)] as const),
      fc.tuple(fc.constantFrom('/v1/load_lora_adapter', '/v1/unload_lora_adapter'), adminBody).map(([path, b]) => [path, JSON.stringify(b)] as const),
      fc.string({ maxLength: 60 }).map((s) => ['/v1/completions', s] as const),
    );
    await fc.assert(
      fc.asyncProperty(arb, async ([path, body]) => {
        const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, signal: AbortSignal.timeout(20_000) });
        const text = await r.text();
        expect(r.status, `${path} ${body} → ${text}`).toBeLessThan(500);
        if (r.status !== 200) expect((JSON.parse(text) as { error: { code: string } }).error.code, text).toMatch(/^[A-Z]+_[A-Z_]+$/);
        // Loaded adapters are unloaded again so that later runs see the same server.
        for (const n of server.lm.adapterNames) if (!['qv-r8', 'o-r2', 'all-r16', 'mlp-r4-rslora'].includes(n)) server.lm.unloadAdapter(n);
      }),
      { numRuns: RUNS, seed: SEED },
    );
    const health = await fetch(`${base}/health`);
    expect(health.status).toBe(200);
    expect(server.scheduler.snapshot()).toMatchObject({ running: 0, waiting: 0 });
  }, 60_000);
});

describe('fuzz: adapter configs', () => {
  const fixture = JSON.parse(readFileSync(`${fixtures}llama/adapters/qv-r8/adapter_config.json`, 'utf8')) as Record<string, unknown>;
  const field = fc.constantFrom('r', 'lora_alpha', 'rank_pattern', 'alpha_pattern', 'target_modules', 'exclude_modules', 'layers_to_transform', 'layers_pattern', 'use_rslora', 'modules_to_save', 'peft_type', 'use_dora', 'bias');
  const regex = fc.oneof(fc.constantFrom('.{7}(.*)*Z', '(a|aa)+$', '(?=x)y', '(\\w+\\s?)*$', '[', '\\1', 'q_proj', '.*', '(.*)*(.*)*(.*)*x'), fc.stringMatching(/^[a-z_.*+?()|[\]{}\\0-9]{0,24}$/));
  const value = fc.oneof(nasty, regex, fc.dictionary(regex, fc.oneof(fc.integer({ min: -2, max: 64 }), nasty), { maxKeys: 3 }), fc.array(regex, { maxLength: 3 }));

  it('parses or refuses with a coded error, and matches modules in bounded time', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(field, value), { maxLength: 4 }), (edits) => {
        const cfg: Record<string, unknown> = { ...fixture };
        for (const [k, v] of edits) cfg[k] = v;
        const t0 = performance.now();
        try {
          const c = parseLoraConfig(JSON.stringify(cfg));
          for (const m of MODULES) {
            targetsModule(c, m);
            rankFor(c, m);
            expect(Number.isFinite(scalingFor(c, m))).toBe(true);
          }
        } catch (e) {
          expect(e, String(e)).toBeInstanceOf(StageError);
        }
        expect(performance.now() - t0).toBeLessThan(500);
      }),
      { numRuns: RUNS * 10, seed: SEED },
    );
  });

  it('refuses deep JSON in adapter and router configs with a coded error', () => {
    const deep = `{"r": 8, "lora_alpha": 8, "target_modules": ${'['.repeat(20_000)}${']'.repeat(20_000)}}`;
    expect(() => parseLoraConfig(deep)).toThrow(expect.objectContaining({ code: 'PEFT_BAD_CONFIG' }) as Error);
    expect(() => parseRouterConfig(`{"version": 1, "tenants": ${'['.repeat(20_000)}${']'.repeat(20_000)}}`)).toThrow(expect.objectContaining({ code: 'ROUTER_BAD_CONFIG' }) as Error);
  });
});

describe('fuzz: safetensors headers', () => {
  const header = fc.oneof(
    fc.jsonValue({ maxDepth: 6 }).map((v) => JSON.stringify({ t: v })),
    fc.record({ dtype: nasty, shape: nasty, data_offsets: nasty }).map((t) => JSON.stringify({ w: t, __metadata__: { a: 'b' } })),
    fc.integer({ min: 1, max: 30_000 }).map((d) => `{"w":${'['.repeat(d)}${']'.repeat(d)}}`),
    fc.string({ maxLength: 80 }).map((s) => `{${s}`),
  );

  it('parses or refuses every header with a coded error', () => {
    fc.assert(
      fc.property(header, fc.integer({ min: 0, max: 64 }), (text, extra) => {
        const h = Buffer.from(text);
        const len = Buffer.alloc(8);
        len.writeUInt32LE(h.length, 0);
        try {
          parseSafetensors(new Uint8Array(Buffer.concat([len, h, Buffer.alloc(extra)])));
        } catch (e) {
          expect(e, String(e)).toBeInstanceOf(StageError);
        }
      }),
      { numRuns: RUNS * 10, seed: SEED },
    );
  });
});
