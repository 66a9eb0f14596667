// Issue 19, one test per attack row: each ran against the real server on loopback and broke it
// before the fix. Rows 12 and 13 (CLI) live in apps/cli/src/serve-errors.test.ts.
import { execFileSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RouterCode, RouterError, parseRouterConfig } from '@stageml/router';
import { SafetensorsFile, serializeSafetensors } from '@stageml/safetensors';
import type { HostTensor } from '@stageml/ir';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type StageServer, createServer } from './index.js';

const fixtures = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${fixtures}golden.json`, 'utf8')) as Record<string, unknown>;
const prompt = (model: string, p: number) => (golden[`llama.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;
const A = 'tenant-a-key-0001';
const B = 'tenant-b-key-0002';
const ADMIN = 'admin-key-000003';

interface Res { status: number; json: any; headers: Headers; text: string }
async function call(base: string, path: string, body?: unknown, key?: string, method = 'POST'): Promise<Res> {
  const r = await fetch(`${base}${path}`, {
    method,
    headers: { ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...(key === undefined ? {} : { authorization: `Bearer ${key}` }) },
    ...(body === undefined ? {} : { body: typeof body === 'string' ? body : JSON.stringify(body) }),
  });
  const text = await r.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, json, headers: r.headers, text };
}
const greedy = (model: string, p: number, extra: Record<string, unknown> = {}) => ({ model, prompt: prompt(model === 'llama' ? 'base' : model, p).input_ids, max_tokens: 12, temperature: 0, ignore_eos: true, return_token_ids: true, ...extra });

/** A raw request with an exact Authorization header (fetch would normalize it). */
function rawAuth(base: string, auth: string, body: unknown): Promise<number> {
  const u = new URL(`${base}/v1/completions`);
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const r = request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data), authorization: auth } }, (res) => {
      res.resume();
      res.on('end', () => { resolve(res.statusCode ?? 0); });
    });
    r.on('error', reject);
    r.end(data);
  });
}

let root: string;
function adapterCopy(name: string, from = 'qv-r8', config: (c: Record<string, unknown>) => void = () => undefined): string {
  const dir = join(root, name);
  cpSync(`${fixtures}llama/adapters/${from}`, dir, { recursive: true });
  const cfg = JSON.parse(readFileSync(join(dir, 'adapter_config.json'), 'utf8')) as Record<string, unknown>;
  config(cfg);
  writeFileSync(join(dir, 'adapter_config.json'), JSON.stringify(cfg));
  return dir;
}
async function rewriteTensors(dir: string, f: (t: HostTensor, name: string) => HostTensor): Promise<void> {
  const file = join(dir, 'adapter_model.safetensors');
  const st = await SafetensorsFile.open(file);
  const out: Record<string, HostTensor> = {};
  for (const n of st.names()) out[n] = f(await st.readTensor(n), n);
  await st.close();
  writeFileSync(file, serializeSafetensors(out));
}

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), 'stageml-tenancy-'));
});
afterAll(() => {
  rmSync(root, { recursive: true, force: true });
});

describe('tenancy and robustness (issue 19), server with tenants', () => {
  let server: StageServer;
  let base: string;
  let encodes = 0;
  beforeAll(async () => {
    const config = parseRouterConfig(JSON.stringify({
      version: 1,
      tenants: [
        { name: 'a', api_keys: [A], adapters: ['qv-r8'], max_running: 2, max_queue: 4 },
        { name: 'b', api_keys: [B], adapters: ['o-r2'], base: false },
      ],
    }));
    server = await createServer({ modelDir: `${fixtures}llama/base`, modelName: 'llama', adaptersDir: `${fixtures}llama/adapters`, config, padTokenId: 0, adminKey: ADMIN, adapterRoots: [root], maxBatch: 8, maxQueue: 4, loadTimeoutMs: 5000 });
    const tok = server.lm.tokenizer!;
    const encode = tok.encode.bind(tok);
    tok.encode = (text: string) => {
      encodes++;
      return encode(text);
    };
    base = await server.listen('127.0.0.1', 0);
  });
  afterAll(async () => {
    await server.shutdown();
  });
  const queueFull = async (tenant: string): Promise<void> => {
    for (let i = 0; i < 2000 && !server.scheduler.isFull(tenant); i++) await new Promise((r) => setTimeout(r, 2));
  };

  it('row 1: a tenant flooding its own queue never causes 429s for another tenant', async () => {
    const flood = Array.from({ length: 30 }, () => call(base, '/v1/completions', greedy('qv-r8', 0, { max_tokens: 30 }), A));
    await queueFull('a');
    const other = await Promise.all(Array.from({ length: 4 }, (_, i) => call(base, '/v1/completions', greedy('o-r2', i), B)));
    expect(other.map((r) => r.status)).toEqual([200, 200, 200, 200]);
    for (const [i, r] of other.entries()) expect(r.json.choices[0].token_ids).toEqual(prompt('o-r2', i).greedy_new_ids);
    const statuses = (await Promise.all(flood)).map((r) => r.status);
    expect(statuses).toContain(429);
    expect(statuses).toContain(200);
    expect(server.scheduler.snapshot()).toMatchObject({ running: 0, waiting: 0 });
  });

  it('row 2: an unauthenticated request is refused before its body is read or tokenized', async () => {
    const before = encodes;
    const big = { model: 'qv-r8', prompt: 'tenant '.repeat(100_000) };
    const rs = await Promise.all(Array.from({ length: 8 }, () => call(base, '/v1/completions', big)));
    expect(rs.map((r) => r.status)).toEqual(Array(8).fill(401));
    expect(encodes - before).toBe(0);
  });

  it('row 3: a catastrophic-backtracking rank_pattern loads in linear time; unsupported regex syntax is refused', async () => {
    const dir = adapterCopy('redos', 'qv-r8', (c) => {
      c['rank_pattern'] = { '.{7}(.*)*Z': 8 };
    });
    const t0 = performance.now();
    const load = call(base, '/v1/load_lora_adapter', { lora_name: 'redos', lora_path: dir }, ADMIN);
    const health = await call(base, '/health', undefined, undefined, 'GET');
    const healthMs = performance.now() - t0;
    expect(health.status).toBe(200);
    expect((await load).status).toBe(200);
    expect(healthMs).toBeLessThan(1500);
    const look = adapterCopy('lookahead', 'qv-r8', (c) => {
      c['target_modules'] = '(?=.*q_proj).*';
    });
    const r = await call(base, '/v1/load_lora_adapter', { lora_name: 'lookahead', lora_path: look }, ADMIN);
    expect(r.status).toBe(400);
    expect(r.json.error.code).toBe('PEFT_UNSUPPORTED');
    expect((await call(base, '/v1/unload_lora_adapter', { lora_name: 'redos' }, ADMIN)).status).toBe(200);
  }, 20_000);

  it('row 4: concurrent loads of one new name: one succeeds, the rest 409', async () => {
    const p1 = adapterCopy('race-1', 'qv-r8');
    const p2 = adapterCopy('race-2', 'o-r2');
    const rs = await Promise.all(Array.from({ length: 6 }, (_, i) => call(base, '/v1/load_lora_adapter', { lora_name: 'race', lora_path: i % 2 === 0 ? p1 : p2 }, ADMIN)));
    const statuses = rs.map((r) => r.status).sort();
    expect(statuses).toEqual([200, 409, 409, 409, 409, 409]);
    expect(rs.filter((r) => r.status === 409).every((r) => r.json.error.code === 'SERVER_ADAPTER_EXISTS')).toBe(true);
    expect((await call(base, '/v1/unload_lora_adapter', { lora_name: 'race' }, ADMIN)).status).toBe(200);
  });

  it('row 6: a FIFO adapter_config.json is refused at once, never opened; other loads go on', async () => {
    const dir = adapterCopy('fifo', 'qv-r8');
    rmSync(join(dir, 'adapter_config.json'));
    execFileSync('mkfifo', [join(dir, 'adapter_config.json')]);
    const t0 = performance.now();
    const r = await call(base, '/v1/load_lora_adapter', { lora_name: 'fifo', lora_path: dir }, ADMIN);
    expect(r.status).toBe(400);
    expect(r.json.error.code).toBe('SERVER_ADAPTER_PATH');
    expect(performance.now() - t0).toBeLessThan(2000);
    expect(server.lm.adapterNames).not.toContain('fifo');
    const ok = await call(base, '/v1/load_lora_adapter', { lora_name: 'after-fifo', lora_path: adapterCopy('after-fifo') }, ADMIN);
    expect(ok.status).toBe(200);
    expect((await call(base, '/v1/unload_lora_adapter', { lora_name: 'after-fifo' }, ADMIN)).status).toBe(200);
  }, 10_000);

  it('row 8: a streaming request that fails validation or admission gets its 4xx/429, not 200 + an error event', async () => {
    const bad = await call(base, '/v1/completions', greedy('qv-r8', 0, { stream: true, max_tokens: 100_000 }), A);
    expect(bad.status).toBe(400);
    expect(bad.json.error.code).toBe('SERVER_TOO_MANY_TOKENS');
    // A full queue, seen before the body is read (the cheap path) and at submission (a race
    // between the two): both answer 429 with Retry-After, never a 200 stream.
    const sched = server.scheduler as unknown as { isFull: (t: string) => boolean; submit: (...a: unknown[]) => unknown };
    const [isFull, submit] = [sched.isFull, sched.submit];
    try {
      sched.isFull = () => true;
      const full = await call(base, '/v1/completions', greedy('qv-r8', 1, { stream: true }), A);
      expect(full.status).toBe(429);
      expect(Number(full.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      sched.isFull = isFull;
      sched.submit = () => {
        throw new RouterError(RouterCode.QUEUE_FULL, "this tenant's queue is full");
      };
      const raced = await call(base, '/v1/chat/completions', { model: 'qv-r8', messages: [{ role: 'user', content: 'hi' }], stream: true }, A);
      expect(raced.status).toBe(429);
      expect(raced.json.error.code).toBe('ROUTER_QUEUE_FULL');
      expect(Number(raced.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    } finally {
      [sched.isFull, sched.submit] = [isFull, submit];
    }
    const ok = await call(base, '/v1/completions', greedy('qv-r8', 1, { stream: true }), A);
    expect(ok.status).toBe(200);
    expect(ok.text.trim().endsWith('data: [DONE]')).toBe(true);
  });

  it('row 9: errors and public endpoints reveal no other tenant\'s adapters and no paths', async () => {
    const unknown = await call(base, '/v1/completions', { model: 'nope', prompt: [1, 2] });
    expect(unknown.status).toBe(401);
    const asA = await call(base, '/v1/completions', { model: 'nope', prompt: [1, 2] }, A);
    expect(asA.status).toBe(404);
    const other = await call(base, '/v1/completions', { model: 'o-r2', prompt: [1, 2] }, A);
    expect(other.status).toBe(404);
    expect(other.json.error.message.replace(/'o-r2'/, '')).toEqual(asA.json.error.message.replace(/'nope'/, ''));
    for (const r of [unknown, asA, other]) for (const name of ['all-r16', 'mlp-r4-rslora', 'qv-r8']) expect(r.text).not.toContain(name);
    const ready = await call(base, '/ready', undefined, undefined, 'GET');
    expect(ready.json).toEqual({ status: 'ready' });
    expect((await call(base, '/ready', undefined, ADMIN, 'GET')).json.adapters).toContain('o-r2');
    expect((await call(base, '/metrics', undefined, undefined, 'GET')).status).toBe(401);
    expect((await call(base, '/metrics', undefined, A, 'GET')).status).toBe(403);
    expect((await call(base, '/metrics', undefined, ADMIN, 'GET')).status).toBe(200);
    const models = await call(base, '/v1/models', undefined, A, 'GET');
    expect(models.text).not.toContain(fixtures);
  });

  it('row 10: lora_path outside every adapter root, via .. or a symlink, is refused revealing no path or contents', async () => {
    const link = adapterCopy('link', 'qv-r8');
    rmSync(join(link, 'adapter_config.json'));
    symlinkSync('/etc/passwd', join(link, 'adapter_config.json'));
    const escape = join(root, 'escape');
    symlinkSync('/etc', escape);
    for (const p of ['/etc', `${root}/../../etc`, '/nonexistent/dir', link, escape, `${fixtures}llama/adapters/qv-r8`]) {
      const r = await call(base, '/v1/load_lora_adapter', { lora_name: 'evil', lora_path: p }, ADMIN);
      expect(r.status, p).toBe(400);
      expect(r.json.error.code, p).toBe('SERVER_ADAPTER_PATH');
      expect(r.text, p).not.toMatch(/root:|\/etc|nonexistent|stageml-tenancy/);
    }
    // Outside paths get one answer whether or not they exist.
    const a = await call(base, '/v1/load_lora_adapter', { lora_name: 'evil', lora_path: '/etc' }, ADMIN);
    const b = await call(base, '/v1/load_lora_adapter', { lora_name: 'evil', lora_path: '/nonexistent/dir' }, ADMIN);
    expect(a.json.error.message).toBe(b.json.error.message);
    // A config that is not JSON: the error does not echo the file.
    const junk = adapterCopy('junk', 'qv-r8');
    writeFileSync(join(junk, 'adapter_config.json'), 'secret-token-123 = hunter2');
    const j = await call(base, '/v1/load_lora_adapter', { lora_name: 'junk', lora_path: junk }, ADMIN);
    expect(j.status).toBe(400);
    expect(j.text).not.toMatch(/hunter2|secret-token|stageml-tenancy/);
    expect(server.lm.adapterNames).not.toContain('evil');
  });

  it('row 11: f16 adapters are converted at load; NaN, Inf, huge weights and absurd lora_alpha are refused at load', async () => {
    const f16 = adapterCopy('half', 'qv-r8');
    await rewriteTensors(f16, (t) => ({ ...t, dtype: 'f16' }));
    expect((await call(base, '/v1/load_lora_adapter', { lora_name: 'half', lora_path: f16, tenants: ['a'] }, ADMIN)).status).toBe(200);
    const served = await call(base, '/v1/completions', { ...greedy('qv-r8', 0), model: 'half' }, A);
    expect(served.status).toBe(200);
    expect(served.json.choices[0].token_ids).toHaveLength(12);
    expect((await call(base, '/v1/unload_lora_adapter', { lora_name: 'half' }, ADMIN)).status).toBe(200);
    for (const [name, v] of [['nan', Number.NaN], ['inf', Number.POSITIVE_INFINITY], ['huge', 3e38]] as const) {
      const dir = adapterCopy(name, 'qv-r8');
      await rewriteTensors(dir, (t) => {
        const data = Float32Array.from(t.data as Float32Array);
        data[1] = v;
        return { ...t, data };
      });
      const bad = await call(base, '/v1/load_lora_adapter', { lora_name: name, lora_path: dir }, ADMIN);
      expect(bad.status, name).toBe(400);
      expect(bad.json.error.code, name).toBe('PEFT_BAD_TENSORS');
    }
    const alpha = adapterCopy('alpha', 'qv-r8', (c) => {
      c['lora_alpha'] = 1e308;
    });
    const bad = await call(base, '/v1/load_lora_adapter', { lora_name: 'alpha', lora_path: alpha }, ADMIN);
    expect(bad.status).toBe(400);
    expect(bad.json.error.code).toBe('PEFT_BAD_CONFIG');
    expect(server.lm.adapterNames.filter((n) => ['nan', 'inf', 'huge', 'alpha'].includes(n))).toEqual([]);
  });

  it('row 14: a full tenant queue is refused before its prompt is tokenized (the cheap 429 path)', async () => {
    const before = encodes;
    const body = { model: 'qv-r8', prompt: 'The staged program', max_tokens: 30, ignore_eos: true, temperature: 0 };
    const rs = await Promise.all(Array.from({ length: 40 }, () => call(base, '/v1/completions', body, A)));
    const ok = rs.filter((r) => r.status === 200).length;
    expect(rs.filter((r) => r.status === 429).length).toBeGreaterThan(0);
    expect(encodes - before).toBe(ok);
  });

  it('row 15: grants are cleared on unload; unknown tenants are refused', async () => {
    expect((await call(base, '/v1/unload_lora_adapter', { lora_name: 'o-r2' }, ADMIN)).status).toBe(200);
    const other = adapterCopy('other', 'qv-r8');
    expect((await call(base, '/v1/load_lora_adapter', { lora_name: 'o-r2', lora_path: other }, ADMIN)).status).toBe(200);
    expect((await call(base, '/v1/completions', greedy('o-r2', 0), B)).status).toBe(404);
    const nosuch = await call(base, '/v1/load_lora_adapter', { lora_name: 'x2', lora_path: other, tenants: ['nosuchtenant'] }, ADMIN);
    expect(nosuch.status).toBe(400);
    expect(server.lm.adapterNames).not.toContain('x2');
  });

  it('row 16: a tiny positive temperature is greedy', async () => {
    const r = await call(base, '/v1/completions', greedy('qv-r8', 2, { temperature: 5e-324 }), A);
    expect(r.status).toBe(200);
    expect(r.json.choices[0].token_ids).toEqual(prompt('qv-r8', 2).greedy_new_ids);
  });

  it('row 17: Authorization must be exactly "Bearer <key>"', async () => {
    const body = greedy('qv-r8', 0, { max_tokens: 1 });
    expect(await rawAuth(base, A, body)).toBe(401);
    expect(await rawAuth(base, `Bearer  ${A}`, body)).toBe(401);
    expect(await rawAuth(base, `Bearer ${A} x`, body)).toBe(401);
    expect(await rawAuth(base, `Basic ${A}`, body)).toBe(401);
    expect(await rawAuth(base, `Bearer ${A}`, body)).toBe(200);
  });
});

describe('tenancy and robustness (issue 19), server without tenants', () => {
  it('row 5: --admin-key guards load/unload even without a tenants config', async () => {
    const server = await createServer({ modelDir: `${fixtures}llama/base`, modelName: 'llama', adminKey: ADMIN, adapterRoots: [`${fixtures}llama/adapters`] });
    const base = await server.listen('127.0.0.1', 0);
    try {
      const body = { lora_name: 'qv', lora_path: `${fixtures}llama/adapters/qv-r8` };
      expect((await call(base, '/v1/load_lora_adapter', body)).status).toBe(401);
      expect((await call(base, '/v1/load_lora_adapter', body, 'wrong-key-0000')).status).toBe(403);
      expect(server.lm.adapterNames).toEqual([]);
      expect((await call(base, '/v1/load_lora_adapter', body, ADMIN)).status).toBe(200);
      expect((await call(base, '/v1/unload_lora_adapter', { lora_name: 'qv' })).status).toBe(401);
      expect((await call(base, '/v1/unload_lora_adapter', { lora_name: 'qv' }, ADMIN)).status).toBe(200);
    } finally {
      await server.shutdown();
    }
  });

  it('row 6: a load past its timeout is answered 504 and undone; its name stays reserved until then', async () => {
    const server = await createServer({ modelDir: `${fixtures}llama/base`, modelName: 'llama', adapterRoots: [`${fixtures}llama/adapters`], loadTimeoutMs: 1 });
    const base = await server.listen('127.0.0.1', 0);
    try {
      const body = { lora_name: 'slow', lora_path: `${fixtures}llama/adapters/all-r16` };
      const r = await call(base, '/v1/load_lora_adapter', body);
      expect(r.status).toBe(504);
      expect(r.json.error.code).toBe('SERVER_ADAPTER_TIMEOUT');
      for (let i = 0; i < 500 && (await call(base, '/v1/unload_lora_adapter', { lora_name: 'slow' })).status === 409; i++) await new Promise((res) => setTimeout(res, 5));
      expect(server.lm.adapterNames).not.toContain('slow');
    } finally {
      await server.shutdown();
    }
  });

  it('row 7: shutdown ends within its timeout while a client holds a half-sent body; a slow body gets 408', async () => {
    const server = await createServer({ modelDir: `${fixtures}llama/base`, modelName: 'llama', shutdownTimeoutMs: 800, bodyTimeoutMs: 400 });
    const base = await server.listen('127.0.0.1', 0);
    const port = Number(new URL(base).port);
    const slow = connect(port, '127.0.0.1');
    let reply = '';
    slow.on('data', (d: Buffer) => (reply += d.toString()));
    const closed = new Promise<void>((resolve) => slow.on('close', () => { resolve(); }));
    slow.write('POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"model":');
    await closed;
    expect(reply).toContain('408');
    expect(reply).toContain('SERVER_BODY_TIMEOUT');
    const held = connect(port, '127.0.0.1');
    held.on('error', () => undefined);
    await new Promise<void>((resolve) => held.on('connect', () => { resolve(); }));
    held.write('POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"model":');
    await new Promise((r) => setTimeout(r, 50));
    const t0 = performance.now();
    await server.shutdown();
    expect(performance.now() - t0).toBeLessThan(3000);
    held.destroy();
  }, 10_000);
});
