import { fileURLToPath } from 'node:url';
import { StageError } from '@stageml/ir';
import { SafetensorsFile } from '@stageml/safetensors';
import { expectCode } from '@stageml/testkit';
import { describe, expect, it } from 'vitest';
import { AdapterCache, type CacheLoad, PeftCode, checkAdapterAgainstBase, loraDirectoryLoader } from './index.js';

const llama = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/', import.meta.url));

interface Deferred<V> {
  readonly promise: Promise<V>;
  resolve(v: V): void;
  reject(e: unknown): void;
}

function deferred<V>(): Deferred<V> {
  let resolve!: (v: V) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<V>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** A cache of strings whose loads resolve when the test says so. */
function manual(budgetBytes: number) {
  const pending = new Map<string, Deferred<CacheLoad<string>>[]>();
  const disposed: string[] = [];
  const signals: AbortSignal[] = [];
  const cache = new AdapterCache<string>({
    budgetBytes,
    load: (name, signal) => {
      signals.push(signal);
      const d = deferred<CacheLoad<string>>();
      pending.set(name, [...(pending.get(name) ?? []), d]);
      return d.promise;
    },
    dispose: (name) => disposed.push(name),
  });
  const finish = async (name: string, bytes: number): Promise<void> => {
    const d = pending.get(name)?.shift();
    if (d === undefined) throw new StageError('TEST', `no load of ${name} pending`);
    d.resolve({ value: `v:${name}`, bytes });
    await flush();
  };
  const fail = async (name: string, error: unknown): Promise<void> => {
    pending.get(name)?.shift()?.reject(error);
    await flush();
  };
  return { cache, pending, disposed, signals, finish, fail };
}

async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) await Promise.resolve();
}

/** A cache whose loads resolve at once with the given sizes. */
function instant(budgetBytes: number, sizes: Record<string, number>) {
  const loaded: string[] = [];
  const disposed: string[] = [];
  const cache = new AdapterCache<string>({
    budgetBytes,
    load: (name) => {
      loaded.push(name);
      return Promise.resolve({ value: `v:${name}`, bytes: sizes[name] ?? 10 });
    },
    dispose: (name) => disposed.push(name),
  });
  const use = async (name: string): Promise<void> => {
    (await cache.acquire(name)).release();
  };
  return { cache, loaded, disposed, use };
}

describe('AdapterCache.acquire', () => {
  it('loads a cold adapter once, then serves hits', async () => {
    const { cache, loaded, use } = instant(100, { a: 10 });
    await use('a');
    await use('a');
    const lease = await cache.acquire('a');
    expect(lease.value).toBe('v:a');
    expect(loaded).toEqual(['a']);
    expect(cache.stats()).toMatchObject({ hits: 2, misses: 1, loads: 1, failedLoads: 0, bytes: 10, entries: 1, loading: 0 });
    expect(cache.entries()).toEqual([{ name: 'a', bytes: 10, pinned: false, leases: 1 }]);
  });

  it('shares one load among concurrent acquires of a cold adapter', async () => {
    const m = manual(100);
    const leases = Promise.all([m.cache.acquire('a'), m.cache.acquire('a'), m.cache.acquire('a')]);
    expect(m.pending.get('a')).toHaveLength(1);
    expect(m.cache.has('a')).toBe(false);
    expect(m.cache.stats().loading).toBe(1);
    await m.finish('a', 5);
    const got = await leases;
    expect(got.map((l) => l.value)).toEqual(['v:a', 'v:a', 'v:a']);
    expect(m.cache.entries()).toEqual([{ name: 'a', bytes: 5, pinned: false, leases: 3 }]);
    expect(m.cache.stats()).toMatchObject({ misses: 3, loads: 1 });
  });

  it('counts a loader that throws synchronously as a failed load', async () => {
    const cache = new AdapterCache<string>({
      budgetBytes: 10,
      load: () => {
        throw new StageError('TEST_SYNC', 'boom');
      },
    });
    await expect(cache.acquire('a')).rejects.toMatchObject({ code: 'TEST_SYNC' });
    expect(cache.stats()).toMatchObject({ loads: 1, failedLoads: 1, loading: 0, entries: 0 });
  });

  it('refuses a load that resolves to invalid bytes with PEFT_BAD_ARGUMENT and disposes its value', async () => {
    for (const bytes of [-1, Number.NaN, 1.5, Infinity]) {
      const m = manual(100);
      const p = m.cache.acquire('a');
      m.pending.get('a')![0]!.resolve({ value: 'x', bytes });
      await expect(p).rejects.toMatchObject({ code: PeftCode.BAD_ARGUMENT });
      expect(m.disposed).toEqual(['a']);
      expect(m.cache.stats()).toMatchObject({ bytes: 0, entries: 0, failedLoads: 1 });
    }
  });
});

describe('AdapterCache eviction', () => {
  it('evicts least recently used entries first, only as many as needed', async () => {
    const { cache, disposed, use } = instant(30, { a: 10, b: 10, c: 10, d: 10, e: 20 });
    await use('a');
    await use('b');
    await use('c');
    await use('a'); // a is now the most recently used
    await use('d');
    expect(disposed).toEqual(['b']);
    expect(cache.entries().map((e) => e.name)).toEqual(['c', 'a', 'd']);
    await use('e');
    expect(disposed).toEqual(['b', 'c', 'a']);
    expect(cache.entries().map((e) => e.name)).toEqual(['d', 'e']);
    expect(cache.stats()).toMatchObject({ evictions: 3, bytes: 30, entries: 2 });
  });

  it('marks an entry most recently used when it is acquired', async () => {
    const { cache, use } = instant(100, { a: 10, b: 10 });
    await use('a');
    await use('b');
    const a = await cache.acquire('a');
    expect(cache.entries().map((e) => e.name)).toEqual(['b', 'a']);
    a.release();
  });

  it('marks an entry most recently used when its lease is released', async () => {
    const { cache, disposed, use } = instant(20, { a: 10, b: 10, c: 10 });
    const a = await cache.acquire('a');
    await use('b');
    a.release();
    await use('c');
    expect(disposed).toEqual(['b']);
  });

  it('never evicts an entry in use, and releasing twice is a no-op', async () => {
    const { cache, use } = instant(20, { a: 10, b: 10, c: 10 });
    const a = await cache.acquire('a');
    const b = await cache.acquire('b');
    await expect(use('c')).rejects.toMatchObject({ code: PeftCode.CACHE_FULL });
    expect(cache.entries().map((e) => e.name)).toEqual(['a', 'b']);
    b.release();
    b.release();
    expect(b.released).toBe(true);
    expect(cache.entries().find((e) => e.name === 'b')?.leases).toBe(0);
    expect(a.released).toBe(false);
    await use('c');
    expect(cache.entries().map((e) => e.name)).toEqual(['a', 'c']);
  });

  it('refuses an adapter that cannot fit without evicting anything (admission before eviction)', async () => {
    const { cache, disposed, use } = instant(100, { a: 30, b: 30, pinned: 40, big: 61 });
    await cache.pin('pinned');
    await use('a');
    await use('b');
    const before = cache.entries();
    const err = await cache.acquire('big').catch((e: unknown) => e);
    expect(err).toMatchObject({ code: PeftCode.CACHE_FULL });
    expect((err as Error).message).toContain('40 bytes are pinned or in use');
    expect(cache.entries()).toEqual(before);
    expect(disposed).toEqual(['big']);
    expect(cache.stats()).toMatchObject({ evictions: 0, bytes: 100, failedLoads: 1 });
  });

  it('admits an adapter exactly as large as the budget once everything else is evictable', async () => {
    const { cache, use } = instant(100, { a: 50, b: 50, all: 100 });
    await use('a');
    await use('b');
    await use('all');
    expect(cache.entries().map((e) => e.name)).toEqual(['all']);
  });
});

describe('AdapterCache.pin / unpin / evict', () => {
  it('keeps pinned entries through pressure until unpinned', async () => {
    const { cache, disposed, use } = instant(20, { p: 10, a: 10, b: 10 });
    await cache.pin('p');
    await use('a');
    await use('b');
    expect(disposed).toEqual(['a']);
    expect(cache.entries()).toContainEqual({ name: 'p', bytes: 10, pinned: true, leases: 0 });
    cache.unpin('p');
    cache.unpin('p');
    await use('a');
    expect(disposed).toEqual(['a', 'p']);
  });

  it('unpin of an absent adapter is PEFT_UNKNOWN_ADAPTER', () => {
    const { cache } = instant(20, {});
    expectCode(() => {
      cache.unpin('nope');
    }, PeftCode.UNKNOWN_ADAPTER);
  });

  it('evict refuses pinned and in-use entries and removes idle ones', async () => {
    const { cache, disposed, use } = instant(100, { p: 10, u: 10, i: 10 });
    await cache.pin('p');
    const u = await cache.acquire('u');
    await use('i');
    expect(expectCode(() => cache.evict('p'), PeftCode.IN_USE).hint).toBe('unpin it first');
    expect(expectCode(() => cache.evict('u'), PeftCode.IN_USE).message).toContain('in use');
    expect(cache.evict('i')).toBe(true);
    expect(cache.evict('i')).toBe(false);
    expect(cache.has('i')).toBe(false);
    expect(disposed).toEqual(['i']);
    u.release();
    expect(cache.evict('u')).toBe(true);
    expect(cache.stats()).toMatchObject({ evictions: 2, bytes: 10, entries: 1 });
  });
});

describe('AdapterCache load failures', () => {
  it('rejects every waiter with the same error, changes nothing, and retries on the next acquire', async () => {
    const m = manual(100);
    const waiters = [m.cache.acquire('a'), m.cache.acquire('a')].map((p) => p.catch((e: unknown) => e));
    const boom = new StageError('TEST_LOAD', 'disk on fire');
    await m.fail('a', boom);
    expect(await Promise.all(waiters)).toEqual([boom, boom]);
    expect(m.cache.stats()).toMatchObject({ bytes: 0, entries: 0, loads: 1, failedLoads: 1, loading: 0 });
    const retry = m.cache.acquire('a');
    await m.finish('a', 7);
    expect((await retry).value).toBe('v:a');
    expect(m.cache.stats()).toMatchObject({ loads: 2, failedLoads: 1, bytes: 7 });
  });

  it('counts dispose errors without changing the cache', async () => {
    const cache = new AdapterCache<string>({
      budgetBytes: 10,
      load: (name) => Promise.resolve({ value: name, bytes: 10 }),
      dispose: () => {
        throw new StageError('TEST_DISPOSE', 'dispose failed');
      },
    });
    (await cache.acquire('a')).release();
    const b = await cache.acquire('b');
    expect(b.value).toBe('b');
    expect(cache.stats()).toMatchObject({ disposeErrors: 1, evictions: 1, entries: 1, bytes: 10 });
  });

  it('rejects a budget that is not a number ≥ 0', () => {
    for (const budgetBytes of [-1, Number.NaN]) {
      expectCode(() => new AdapterCache({ budgetBytes, load: () => Promise.resolve({ value: 0, bytes: 0 }) }), PeftCode.BAD_ARGUMENT);
    }
  });
});

describe('AdapterCache abort signals', () => {
  it('rejects an aborted waiter and aborts the load only when no waiter is left', async () => {
    const m = manual(100);
    const c1 = new AbortController();
    const c2 = new AbortController();
    const p1 = m.cache.acquire('a', { signal: c1.signal }).catch((e: unknown) => e);
    const p2 = m.cache.acquire('a', { signal: c2.signal }).catch((e: unknown) => e);
    c1.abort(new StageError('TEST_ABORT', 'first gave up'));
    expect(await p1).toMatchObject({ code: 'TEST_ABORT' });
    expect(m.signals[0]!.aborted).toBe(false);
    c2.abort(new StageError('TEST_ABORT', 'second gave up'));
    expect(await p2).toMatchObject({ code: 'TEST_ABORT' });
    expect(m.signals[0]!.aborted).toBe(true);
    // A new acquire starts a fresh load; the abandoned one's value is disposed, never admitted.
    const p3 = m.cache.acquire('a');
    expect(m.pending.get('a')).toHaveLength(2);
    await m.finish('a', 50);
    expect(m.disposed).toEqual(['a']);
    expect(m.cache.has('a')).toBe(false);
    await m.finish('a', 5);
    expect((await p3).value).toBe('v:a');
    expect(m.cache.stats()).toMatchObject({ loads: 2, failedLoads: 1, bytes: 5, entries: 1 });
  });

  it('rejects at once when the signal is already aborted, but serves hits', async () => {
    const { cache, use } = instant(100, {});
    const c = new AbortController();
    c.abort(new StageError('TEST_ABORT', 'already'));
    await expect(cache.acquire('a', { signal: c.signal })).rejects.toMatchObject({ code: 'TEST_ABORT' });
    expect(cache.stats().loads).toBe(0);
    await use('a');
    expect((await cache.acquire('a', { signal: c.signal })).value).toBe('v:a');
  });
});

describe('loraDirectoryLoader', () => {
  it('caches real PEFT adapters at their tensor bytes and evicts by LRU', async () => {
    const disposed: string[] = [];
    // qv-r8 14336 B + mlp-r4-rslora 15360 B + o-r2 2048 B fit; all-r16 (149504 B) needs them gone.
    const cache = new AdapterCache({ budgetBytes: 164_000, load: loraDirectoryLoader(`${llama}adapters`), dispose: (n) => disposed.push(n) });
    const leases = await Promise.all(['qv-r8', 'mlp-r4-rslora', 'o-r2', 'qv-r8'].map((n) => cache.acquire(n)));
    expect(cache.stats()).toMatchObject({ loads: 3, bytes: 14336 + 15360 + 2048, entries: 3 });
    const base = await SafetensorsFile.open(`${llama}base/model.safetensors`);
    for (const l of leases) {
      expect(l.value.name).toBe(l.name);
      checkAdapterAgainstBase(l.value, (p) => (base.has(p) ? base.info(p).shape : undefined));
    }
    await base.close();
    expect(leases[0]!.value.modules.get('model.layers.1.self_attn.v_proj')?.scale).toBe(2);
    await expect(cache.acquire('all-r16')).rejects.toMatchObject({ code: PeftCode.CACHE_FULL });
    for (const l of leases) l.release();
    const all = await cache.acquire('all-r16');
    expect(all.value.bytes).toBe(149_504);
    // The refused first load of all-r16 was disposed; the second evicted the two LRU entries.
    expect(disposed).toEqual(['all-r16', 'mlp-r4-rslora', 'o-r2']);
    expect(cache.entries().map((e) => e.name)).toEqual(['qv-r8', 'all-r16']);
    expect(cache.stats().bytes).toBeLessThanOrEqual(164_000);
  });

  it('reports a missing adapter as PEFT_IO and a path-like name as PEFT_UNKNOWN_ADAPTER', async () => {
    const cache = new AdapterCache({ budgetBytes: 1e6, load: loraDirectoryLoader(`${llama}adapters`) });
    const missing = [cache.acquire('nope'), cache.acquire('nope')].map((p) => p.catch((e: unknown) => e));
    const [e1, e2] = await Promise.all(missing);
    expect(e1).toMatchObject({ code: PeftCode.IO });
    expect(e2).toBe(e1);
    for (const bad of ['../adapters/qv-r8', '..', '']) await expect(cache.acquire(bad)).rejects.toMatchObject({ code: PeftCode.UNKNOWN_ADAPTER });
    expect(cache.stats()).toMatchObject({ entries: 0, bytes: 0, failedLoads: 4 });
  });
});
