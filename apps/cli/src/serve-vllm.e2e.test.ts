import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SafetensorsFile } from '@stageml/safetensors';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ExitCode } from './index.js';
import { runCaptured as run } from './test-fixtures.js';

// `stageml serve` with vLLM's command line, as a real process, on the v2 fixtures
// (tools/gen_fixtures_v2.py: transformers 5.17 + PEFT 0.21).
const repo = fileURLToPath(new URL('../../../', import.meta.url));
const v2 = `${repo}fixtures/hf-v2/`;
const golden = JSON.parse(readFileSync(`${v2}golden.json`, 'utf8')) as Record<string, any>;
const prompt = (model: string, i: number): { input_ids: number[]; greedy_new_ids: number[] } => golden[`mistral.${model}`].prompts[`prompt${String(i)}`];

describe('stageml generate on the sliding-window Mistral', () => {
  it('stageml run writes logits equal to the transformers golden (window 16, 30+ tokens), base and adapter', async () => {
    const tmp = mkdtempSync(join(tmpdir(), 'stageml-cli-v2-'));
    try {
      for (const [model, adapter] of [['base', []], ['b', ['--adapter', `${v2}mistral-sw/adapters/b`]]] as const) {
        const out = join(tmp, `${model}.safetensors`);
        const r = await run(['run', '--model', `${v2}mistral-sw`, ...adapter, '--ids', prompt(model, 3).input_ids.join(','), '--out', out]);
        expect(r.code, r.err).toBe(ExitCode.OK);
        const [a, g] = [await SafetensorsFile.open(out), await SafetensorsFile.open(`${v2}golden.safetensors`)];
        const [x, y] = [await a.readTensor('logits'), await g.readTensor(`mistral.${model}.prompt3.logits`)];
        await a.close();
        await g.close();
        expect(x.shape).toEqual(y.shape);
        expect(Math.max(...Array.from(x.data, (v, i) => Math.abs(v - y.data[i]!)))).toBeLessThanOrEqual(1e-4);
      }
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });

  it('greedy tokens from a text prompt equal transformers, base and adapter', async () => {
    for (const [model, adapter] of [['base', []], ['a', ['--adapter', `${v2}mistral-sw/adapters/a`]]] as const) {
      const r = await run(['generate', '--model', `${v2}mistral-sw`, ...adapter, '--prompt', golden['prompts'][1], '--max-new-tokens', '16', '--ignore-eos', '--json']);
      expect(r.code, r.err).toBe(ExitCode.OK);
      expect(JSON.parse(r.out).new_ids).toEqual(prompt(model, 1).greedy_new_ids);
    }
  });
});

describe('stageml serve MODEL --enable-lora --lora-modules a=DIR b=DIR --api-key K (vLLM flags)', () => {
  let child: ChildProcess;
  let base = '';
  const logs: string[] = [];
  beforeAll(async () => {
    child = spawn(
      process.execPath,
      ['--conditions=@stageml/source', '--import', 'tsx', 'apps/cli/src/bin.ts', 'serve', `${v2}mistral-sw`, '--enable-lora', '--lora-modules', `a=${v2}mistral-sw/adapters/a`, `{"name": "b", "path": "${v2}mistral-sw/adapters/b"}`, '--served-model-name', 'mistral', 'mistral-7b', '--max-model-len', '128', '--api-key', 'K', '--executor', 'interpreter', '--executor-picks', 'on', '--port', '0',
        // vLLM's serve flags that launch scripts carry: accepted (mapped to ours or noted).
        '--max-num-seqs', '8', '--max-num-batched-tokens', '64', '--no-enable-prefix-caching', '--dtype', 'float32', '--enable-auto-tool-choice', '--tool-call-parser', 'hermes', '--generation-config', 'vllm'],
      { cwd: repo, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    base = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new Error(`no ready line in 60 s: ${logs.join('')}`));
      }, 60_000);
      child.stdout!.on('data', (d: Buffer) => {
        logs.push(d.toString());
        const m = /ready on (http:\/\/[^\s]+)/.exec(logs.join(''));
        if (m !== null) {
          clearTimeout(timer);
          resolve(m[1]!);
        }
      });
      child.stderr!.on('data', (d: Buffer) => logs.push(d.toString()));
      child.on('exit', (code) => {
        reject(new Error(`serve exited with ${String(code)}: ${logs.join('')}`));
      });
    });
  }, 90_000);
  afterAll(async () => {
    if (child.exitCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    await exited;
  });

  const post = async (path: string, body: unknown, key = 'K') =>
    fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify(body) });

  it('lists the served names and the LoRA modules, needs the key, and serves goldens', async () => {
    const models = (await (await fetch(`${base}/v1/models`, { headers: { authorization: 'Bearer K' } })).json()) as { data: { id: string }[] };
    expect(models.data.map((m) => m.id)).toEqual(['mistral', 'mistral-7b', 'a', 'b']);
    expect((await fetch(`${base}/v1/models`)).status).toBe(401);
    for (const model of ['mistral-7b', 'a', 'b']) {
      const g = prompt(model === 'mistral-7b' ? 'base' : model, 2);
      const r = (await (await post('/v1/completions', { model, prompt: golden['prompts'][2], max_tokens: 16, temperature: 0, ignore_eos: true, return_token_ids: true })).json()) as any;
      expect(r.choices[0].token_ids, model).toEqual(g.greedy_new_ids);
    }
    const chat = golden['mistral.chat'][1];
    const c = (await (await post('/v1/chat/completions', { model: 'mistral', messages: chat.messages, max_tokens: 12, temperature: 0, ignore_eos: true, return_token_ids: true })).json()) as any;
    expect(c.usage.prompt_tokens).toBe(chat.input_ids.length);
    expect(c.choices[0].token_ids).toEqual(chat.greedy_new_ids);
    const t = (await (await post('/tokenize', { model: 'mistral', messages: chat.messages })).json()) as any;
    expect(t.tokens).toEqual(chat.input_ids);
  });

  it('rejects --lora-modules without --enable-lora, and bad module specs', async () => {
    const a = await run(['serve', `${v2}mistral-sw`, '--lora-modules', `a=${v2}mistral-sw/adapters/a`]);
    expect(a.code).toBe(ExitCode.USAGE);
    expect(a.err).toContain('--enable-lora');
    const b = await run(['serve', `${v2}mistral-sw`, '--enable-lora', '--lora-modules', 'nopath']);
    expect(b.code).toBe(ExitCode.USAGE);
    expect(b.err).toContain('name=path');
    const c = await run(['serve']);
    expect(c.code).toBe(ExitCode.USAGE);
  });
});
