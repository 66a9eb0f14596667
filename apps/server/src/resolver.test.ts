import { cpSync, mkdirSync, mkdtempSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { createServer } from './app.js';
import { AdapterResolver, adapterNameProblem } from './resolver.js';

/** Resolves once `cond` holds (polling; the resolver awaits real file-system calls first). */
async function until(cond: () => boolean): Promise<void> {
  for (let i = 0; !cond(); i++) {
    if (i > 2000) throw new Error('condition not reached');
    await new Promise((r) => setTimeout(r, 1));
  }
}

/** A model stand-in: loads finish at once, or (manual) when the test says so. */
class FakeHost {
  readonly loaded = new Set<string>();
  readonly loadCalls: string[] = [];
  readonly pending: { name: string; finish: () => void; fail: (e: Error) => void }[] = [];
  constructor(private readonly manual = false) {}
  get adapterNames(): string[] {
    return [...this.loaded];
  }
  loadAdapter(_dir: string, name: string): Promise<unknown> {
    this.loadCalls.push(name);
    return new Promise((resolve, reject) => {
      const finish = () => {
        this.loaded.add(name);
        resolve(undefined);
      };
      if (this.manual) this.pending.push({ name, finish, fail: reject });
      else setImmediate(finish);
    });
  }
  unloadAdapter(name: string): boolean {
    return this.loaded.delete(name);
  }
}

function rootWith(names: readonly string[]): string {
  const root = mkdtempSync(join(tmpdir(), 'stageml-resolver-'));
  for (const n of names) {
    mkdirSync(join(root, n));
    writeFileSync(join(root, n, 'adapter_config.json'), '{}');
  }
  return root;
}

describe('adapterNameProblem', () => {
  it('accepts one plain path segment and names what is wrong otherwise', () => {
    for (const ok of ['qv-r8', 'tenant_07', 'a.b', 'A1']) expect(adapterNameProblem(ok)).toBeUndefined();
    expect(adapterNameProblem('')).toBe('it is empty');
    expect(adapterNameProblem('.hidden')).toBe('it starts with a dot');
    expect(adapterNameProblem('a..b')).toBe("it contains '..'");
    expect(adapterNameProblem('a/b')).toBe('it contains a path separator or NUL');
    expect(adapterNameProblem('a\\b')).toBe('it contains a path separator or NUL');
    expect(adapterNameProblem('x'.repeat(256))).toBe('it is longer than 255 characters');
  });
});

describe('AdapterResolver', () => {
  it('shares one load among concurrent requests for the same adapter', async () => {
    const host = new FakeHost(true);
    const r = new AdapterResolver(host, { roots: [rootWith(['a'])], capacity: 4 });
    const leases = Promise.all([r.acquire('a'), r.acquire('a'), r.acquire('a')]);
    await until(() => host.pending.length > 0);
    await new Promise((res) => setTimeout(res, 20));
    host.pending.splice(0).forEach((p) => { p.finish(); });
    const releases = await leases;
    expect(host.loadCalls).toEqual(['a']);
    expect(r.loads).toBe(1);
    for (const release of releases) release();
    await r.acquire('a');
    expect(r.loads).toBe(1);
  });

  it('evicts the least recently used idle adapter when full, never a leased one', async () => {
    const host = new FakeHost();
    const r = new AdapterResolver(host, { roots: [rootWith(['a', 'b', 'c', 'd'])], capacity: 2 });
    const take = (name: string) => r.acquire(name);
    const ra = await take('a');
    (await take('b'))();
    ra(); // a is now idle too, but was used before b
    (await take('a'))(); // a becomes the most recently used
    const rc = await take('c'); // evicts b
    expect(host.adapterNames.sort()).toEqual(['a', 'c']);
    expect(r.evictions).toBe(1);
    const held = await take('a'); // leased: not evictable
    await expect(r.acquire('d')).rejects.toMatchObject({ code: 'PEFT_CACHE_FULL' });
    expect(host.adapterNames.sort()).toEqual(['a', 'c']);
    rc();
    const rd = await take('d'); // c was released: it goes
    expect(host.adapterNames.sort()).toEqual(['a', 'd']);
    held();
    rd();
    expect(r.loads).toBe(4);
  });

  it('never evicts adapters it did not load, and counts them against the capacity', async () => {
    const host = new FakeHost();
    host.loaded.add('static');
    const r = new AdapterResolver(host, { roots: [rootWith(['a', 'b'])], capacity: 2 });
    (await r.acquire('a'))();
    (await r.acquire('b'))();
    expect(host.adapterNames.sort()).toEqual(['b', 'static']);
  });

  it('treats requests the scheduler still holds as busy', async () => {
    const host = new FakeHost();
    const busy = new Set(['a']);
    const r = new AdapterResolver(host, { roots: [rootWith(['a', 'b'])], capacity: 1, isBusy: (n) => busy.has(n) });
    (await r.acquire('a'))();
    await expect(r.acquire('b')).rejects.toMatchObject({ code: 'PEFT_CACHE_FULL' });
    busy.clear();
    (await r.acquire('b'))();
    expect(host.adapterNames).toEqual(['b']);
  });

  it('searches the roots in order and rejects unknown or invalid names as unknown models', async () => {
    const host = new FakeHost();
    const first = rootWith(['x']);
    const second = rootWith(['x', 'y']);
    const dirs: string[] = [];
    const spy = {
      get adapterNames() {
        return host.adapterNames;
      },
      unloadAdapter: (n: string) => host.unloadAdapter(n),
      loadAdapter: (dir: string, name: string) => {
        dirs.push(dir);
        return host.loadAdapter(dir, name);
      },
    };
    const r = new AdapterResolver(spy, { roots: [first, second], capacity: 4 });
    await Promise.all([r.acquire('x'), r.acquire('y')]);
    expect(dirs.sort()).toEqual([join(first, 'x'), join(second, 'y')].sort());
    await expect(r.acquire('nope')).rejects.toMatchObject({ code: 'ROUTER_UNKNOWN_MODEL' });
    await expect(r.acquire('x/../y')).rejects.toMatchObject({ code: 'ROUTER_UNKNOWN_MODEL', message: expect.stringContaining("contains '..'") as unknown });
    await expect(r.acquire('.x')).rejects.toMatchObject({ code: 'ROUTER_UNKNOWN_MODEL' });
  });

  it('leaves the loaded set as it was when a load fails, and lets a later request retry', async () => {
    const host = new FakeHost(true);
    const r = new AdapterResolver(host, { roots: [rootWith(['a'])], capacity: 2 });
    const p = r.acquire('a');
    await until(() => host.pending.length > 0);
    host.pending.splice(0)[0]!.fail(new Error('bad weights'));
    await expect(p).rejects.toThrow('bad weights');
    expect(host.adapterNames).toEqual([]);
    expect(r.loads).toBe(0);
    const again = r.acquire('a');
    await until(() => host.pending.length > 0);
    host.pending.splice(0)[0]!.finish();
    (await again)();
    expect(r.loads).toBe(1);
  });

  it('rejects a capacity below one and an empty root list', () => {
    expect(() => new AdapterResolver(new FakeHost(), { roots: ['/tmp'], capacity: 0 })).toThrow(expect.objectContaining({ code: 'ROUTER_BAD_CONFIG' }));
    expect(() => new AdapterResolver(new FakeHost(), { roots: [], capacity: 1 })).toThrow(expect.objectContaining({ code: 'ROUTER_BAD_CONFIG' }));
  });
});

describe('server with --adapter-root', () => {
  const fixtures = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));

  it('loads an adapter on its first request, names the replica on every response and counts loads', async () => {
    const root = mkdtempSync(join(tmpdir(), 'stageml-root-'));
    // Copied, not linked: the adapter-path guard refuses links that leave the root.
    cpSync(join(fixtures, 'llama/adapters/qv-r8'), join(root, 'team-a'), { recursive: true });
    const server = await createServer({ modelDir: join(fixtures, 'llama/base'), modelName: 'llama', adapterRoots: [root], maxLoras: 3, replicaName: 'r-test', padTokenId: 0 });
    const base = await server.listen('127.0.0.1', 0);
    try {
      const health = await fetch(`${base}/health`);
      expect(health.headers.get('x-stageml-replica')).toBe('r-test');
      const body = { model: 'team-a', prompt: [0, 52, 317], max_tokens: 2, temperature: 0 };
      const rs = await Promise.all([1, 2, 3].map(() => fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })));
      expect(rs.map((r) => r.status)).toEqual([200, 200, 200]);
      expect(rs.map((r) => r.headers.get('x-stageml-replica'))).toEqual(['r-test', 'r-test', 'r-test']);
      const missing = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, model: 'team-b' }) });
      expect(missing.status).toBe(404);
      expect(((await missing.json()) as { error: { code: string } }).error.code).toBe('ROUTER_UNKNOWN_MODEL');
      const metrics = await (await fetch(`${base}/metrics`)).text();
      expect(metrics).toMatch(/^stageml_adapter_loads_total 1$/m);
      expect(metrics).toMatch(/^vllm:lora_requests_info\{running_lora_adapters="",waiting_lora_adapters="",max_lora="3"\} /m);
      expect(metrics).toMatch(/^vllm:num_requests_waiting\{model_name="llama"\} 0$/m);
      expect(metrics).toMatch(/^vllm:num_requests_running\{model_name="llama"\} 0$/m);
    } finally {
      await server.shutdown();
    }
  });

  it('puts on-demand loads through the adapter-path guard: a link leaving the root is refused', async () => {
    const root = mkdtempSync(join(tmpdir(), 'stageml-root-'));
    symlinkSync(join(fixtures, 'llama/adapters/qv-r8'), join(root, 'linked'), 'dir');
    const server = await createServer({ modelDir: join(fixtures, 'llama/base'), modelName: 'llama', adapterRoots: [root], padTokenId: 0 });
    const base = await server.listen('127.0.0.1', 0);
    try {
      const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'linked', prompt: [0, 52], max_tokens: 1 }) });
      expect(r.status).toBe(400);
      const err = ((await r.json()) as { error: { code: string; message: string } }).error;
      expect(err.code).toBe('SERVER_ADAPTER_PATH');
      expect(err.message).not.toContain(root);
      expect(server.lm.adapterNames).not.toContain('linked');
    } finally {
      await server.shutdown();
    }
  });

  it('defaults the replica name to hostname:port', async () => {
    const server = await createServer({ modelDir: join(fixtures, 'llama/base'), modelName: 'llama' });
    const base = await server.listen('127.0.0.1', 0);
    try {
      const r = await fetch(`${base}/health`);
      expect(r.headers.get('x-stageml-replica')).toMatch(new RegExp(`:${new URL(base).port}$`));
    } finally {
      await server.shutdown();
    }
  });
});
