import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseRouterConfig } from '@stageml/router';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type StageServer, createServer } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, unknown> & { families: { llama: { adapters: string[] } } };
const ADAPTERS = golden.families.llama.adapters;
const prompt = (model: string, p: number) => (golden[`llama.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;

async function post(base: string, path: string, body: unknown, key?: string): Promise<{ status: number; json: any; headers: Headers }> {
  const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { authorization: `Bearer ${key}` }) }, body: typeof body === 'string' ? body : JSON.stringify(body) });
  return { status: r.status, json: await r.json(), headers: r.headers };
}

function greedy(model: string, p: number, extra: Record<string, unknown> = {}) {
  return { model: model === 'base' ? 'llama' : model, prompt: prompt(model, p).input_ids, max_tokens: 12, temperature: 0, ignore_eos: true, return_token_ids: true, ...extra };
}

describe('reference server (open access)', () => {
  let server: StageServer;
  let base: string;
  beforeAll(async () => {
    server = await createServer({ modelDir: `${root}llama/base`, modelName: 'llama', adaptersDir: `${root}llama/adapters`, padTokenId: 0, maxBatch: 8 });
    base = await server.listen('127.0.0.1', 0);
  });
  afterAll(async () => {
    await server.shutdown();
  });

  it('returns the golden greedy tokens for every adapter and prompt', async () => {
    for (const model of ['base', ...ADAPTERS]) {
      for (let p = 0; p < 4; p++) {
        const r = await post(base, '/v1/completions', greedy(model, p));
        expect(r.status).toBe(200);
        expect(r.json.choices[0].token_ids, `${model} prompt${String(p)}`).toEqual(prompt(model, p).greedy_new_ids);
        expect(r.json.usage).toEqual({ prompt_tokens: prompt(model, p).input_ids.length, completion_tokens: 12, total_tokens: prompt(model, p).input_ids.length + 12, prompt_tokens_details: { cached_tokens: expect.any(Number) } });
      }
    }
  });

  it('serves a concurrent mixed load, each request getting its golden tokens', async () => {
    const jobs = ['base', ...ADAPTERS].flatMap((model) => [0, 1, 2, 3].map(async (p) => {
      const r = await post(base, '/v1/completions', greedy(model, p));
      expect(r.json.choices[0].token_ids, `${model} prompt${String(p)}`).toEqual(prompt(model, p).greedy_new_ids);
    }));
    await Promise.all(jobs);
  });

  it('streams server-sent events whose deltas add up to the full completion', async () => {
    const full = await post(base, '/v1/completions', greedy('qv-r8', 1));
    const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(greedy('qv-r8', 1, { stream: true })) });
    expect(r.headers.get('content-type')).toContain('text/event-stream');
    const text = await r.text();
    const events = text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    expect(chunks.map((c) => c.choices[0].text).join('')).toBe(full.json.choices[0].text);
    expect(chunks.flatMap((c) => c.choices[0].token_ids ?? [])).toEqual(full.json.choices[0].token_ids);
    expect(chunks.at(-1).choices[0].finish_reason).toBe('length');
  });

  it('answers chat completions and lists models', async () => {
    const r = await post(base, '/v1/chat/completions', { model: 'o-r2', messages: [{ role: 'user', content: 'Tenant 7 asked for adapter seven.' }], max_tokens: 4, temperature: 0 });
    expect(r.status).toBe(200);
    expect(r.json.object).toBe('chat.completion');
    expect(r.json.choices[0].message.role).toBe('assistant');
    const models = (await (await fetch(`${base}/v1/models`)).json()) as { data: { id: string; parent: string | null }[] };
    expect(models.data.map((m) => m.id)).toEqual(['llama', ...[...ADAPTERS].sort()]);
    expect(models.data[1]!.parent).toBe('llama');
  });

  it('loads and unloads adapters while serving, refusing to unload one in use', async () => {
    const long = post(base, '/v1/completions', greedy('qv-r8', 0, { max_tokens: 150 }));
    while ((server.scheduler.snapshot().runningByAdapter['qv-r8'] ?? 0) === 0) await new Promise((r) => setTimeout(r, 2));
    const busy = await post(base, '/v1/unload_lora_adapter', { lora_name: 'qv-r8' });
    expect(busy.status).toBe(409);
    const load = await post(base, '/v1/load_lora_adapter', { lora_name: 'qv-copy', lora_path: `${root}llama/adapters/qv-r8` });
    expect(load.status).toBe(200);
    const copy = await post(base, '/v1/completions', { ...greedy('qv-r8', 2), model: 'qv-copy' });
    expect(copy.json.choices[0].token_ids).toEqual(prompt('qv-r8', 2).greedy_new_ids);
    expect((await long).status).toBe(200);
    expect((await post(base, '/v1/unload_lora_adapter', { lora_name: 'qv-copy' })).status).toBe(200);
    expect((await post(base, '/v1/completions', { ...greedy('qv-r8', 2), model: 'qv-copy' })).status).toBe(404);
    expect((await post(base, '/v1/load_lora_adapter', { lora_name: 'qv-r8', lora_path: `${root}llama/adapters/qv-r8` })).status).toBe(409);
    expect((await post(base, '/v1/load_lora_adapter', { lora_name: 'bad', lora_path: `${root}nope` })).json.error.code).toBe('SERVER_ADAPTER_PATH');
  });

  it('validates requests with clear 4xx errors', async () => {
    const cases: [unknown, number, string][] = [
      [{ prompt: [1, 2] }, 400, 'model'],
      [{ model: 'llama', prompt: [1, 2], max_tokens: 0 }, 400, 'max_tokens'],
      [{ model: 'llama', prompt: [1, 2], temperature: 5 }, 400, 'temperature'],
      [{ model: 'llama', prompt: [1, 2], n: 17 }, 400, 'n'],
      [{ model: 'llama', prompt: [1, 2], tools: [{ type: 'function', function: { name: 'f' } }] }, 400, 'tools'],
      [{ model: 'llama', prompt: [1, 2], response_format: { type: 'xml' } }, 400, 'response_format'],
      [{ model: 'llama', prompt: [1, 999] }, 400, '999'],
      [{ model: 'llama', prompt: [1, 2], max_tokens: 100000 }, 400, 'max_tokens'],
      [{ model: 'gpt-4', prompt: [1, 2] }, 404, 'gpt-4'],
      ['{not json', 400, ''],
    ];
    for (const [body, status, fragment] of cases) {
      const r = await post(base, '/v1/completions', body);
      expect(r.status, JSON.stringify(body)).toBe(status);
      expect(r.json.error.message).toContain(fragment);
      expect(typeof r.json.error.code).toBe('string');
    }
    const big = await post(base, '/v1/completions', { model: 'llama', prompt: 'x'.repeat(2 * 1024 * 1024) });
    expect(big.status).toBe(413);
  });

  it('exports vLLM-compatible Prometheus metrics', async () => {
    const text = await (await fetch(`${base}/metrics`)).text();
    for (const name of ['vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:lora_requests_info', 'vllm:prompt_tokens_total', 'vllm:generation_tokens_total', 'vllm:e2e_request_latency_seconds_bucket', 'vllm:time_to_first_token_seconds_bucket']) {
      expect(text).toContain(name);
    }
    expect(text).toMatch(/vllm:lora_requests_info\{running_lora_adapters="[^"]*",waiting_lora_adapters="[^"]*",max_lora="\d+"\}/);
  });
});

describe('reference server with tenants', () => {
  let server: StageServer;
  let base: string;
  beforeAll(async () => {
    const config = parseRouterConfig(JSON.stringify({
      version: 1,
      tenants: [
        { name: 'acme', api_keys: ['acme-key-123'], adapters: ['qv-r8', 'all-r16'] },
        { name: 'globex', api_keys: ['globex-key-456'], adapters: ['o-r2'], base: false },
      ],
      staged: ['qv-r8', 'o-r2'],
    }));
    server = await createServer({ modelDir: `${root}llama/base`, modelName: 'llama', adaptersDir: `${root}llama/adapters`, config, padTokenId: 0, adminKey: 'admin-key-789', maxBatch: 1, maxQueue: 1 });
    base = await server.listen('127.0.0.1', 0);
  });
  afterAll(async () => {
    await server.shutdown().catch(() => undefined);
  });

  it('lets a tenant reach only its own adapters', async () => {
    expect((await post(base, '/v1/completions', greedy('qv-r8', 0))).status).toBe(401);
    expect((await post(base, '/v1/completions', greedy('qv-r8', 0), 'wrong-key-000')).status).toBe(401);
    expect((await post(base, '/v1/completions', greedy('o-r2', 0), 'acme-key-123')).status).toBe(404);
    expect((await post(base, '/v1/completions', greedy('base', 0), 'globex-key-456')).status).toBe(404);
    const ok = await post(base, '/v1/completions', greedy('all-r16', 3), 'acme-key-123');
    expect(ok.json.choices[0].token_ids).toEqual(prompt('all-r16', 3).greedy_new_ids);
    const models = (await (await fetch(`${base}/v1/models`, { headers: { authorization: 'Bearer globex-key-456' } })).json()) as { data: { id: string }[] };
    expect(models.data.map((m) => m.id)).toEqual(['o-r2']);
    expect((await post(base, '/v1/load_lora_adapter', { lora_name: 'x', lora_path: `${root}llama/adapters/o-r2` }, 'acme-key-123')).status).toBe(403);
  });

  it('answers 429 with Retry-After when the queue is full', async () => {
    const many = await Promise.all(Array.from({ length: 6 }, () => post(base, '/v1/completions', greedy('qv-r8', 1, { max_tokens: 8 }), 'acme-key-123')));
    const statuses = many.map((r) => r.status);
    expect(statuses).toContain(200);
    expect(statuses).toContain(429);
    const limited = many.find((r) => r.status === 429)!;
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(limited.json.error.type).toBe('rate_limit_error');
  });

  it('drains on shutdown: not ready, refuses new work, finishes in-flight requests', async () => {
    const inflight = post(base, '/v1/completions', greedy('qv-r8', 0), 'acme-key-123');
    await new Promise((r) => setTimeout(r, 20));
    const stopping = server.shutdown();
    const ready = await fetch(`${base}/ready`).then((r) => r.status).catch(() => 503);
    expect(ready).toBe(503);
    const late = await post(base, '/v1/completions', greedy('qv-r8', 1), 'acme-key-123').then((r) => r.status).catch(() => 503);
    expect(late).toBe(503);
    const done = await inflight;
    expect(done.status).toBe(200);
    expect(done.json.choices[0].token_ids).toEqual(prompt('qv-r8', 0).greedy_new_ids);
    await stopping;
  });
});
