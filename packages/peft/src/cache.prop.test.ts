import { fc, test } from '@fast-check/vitest';
import { StageError } from '@stageml/ir';
import { expectCode } from '@stageml/testkit';
import { describe, expect } from 'vitest';
import { AdapterCache, type CacheLease, PeftCode } from './index.js';

const NAMES = ['a', 'b', 'c', 'd', 'e', 'f'] as const;
type Name = (typeof NAMES)[number];
const arbName = fc.constantFrom(...NAMES);

/** Checks what must hold of every cache at every observable point. */
function checkConsistent(cache: AdapterCache<string>, acquires: number): void {
  const s = cache.stats();
  const entries = cache.entries();
  expect(s.bytes).toBeLessThanOrEqual(cache.budgetBytes);
  expect(s.bytes).toBe(entries.reduce((a, e) => a + e.bytes, 0));
  expect(s.entries).toBe(entries.length);
  expect(s.entries).toBe(s.loads - s.failedLoads - s.loading - s.evictions);
  expect(s.hits + s.misses).toBe(acquires);
  expect(new Set(entries.map((e) => e.name)).size).toBe(entries.length);
  for (const e of entries) expect(e.leases).toBeGreaterThanOrEqual(0);
}

describe('AdapterCache under random interleavings', () => {
  test.prop([fc.scheduler(), fc.array(arbName, { minLength: 1, maxLength: 40 })])('concurrent cold acquires load each adapter exactly once', async (s, order) => {
    const calls = new Map<string, number>();
    const cache = new AdapterCache<string>({
      budgetBytes: Infinity,
      load: (name) => {
        calls.set(name, (calls.get(name) ?? 0) + 1);
        return s.schedule(Promise.resolve({ value: `v:${name}`, bytes: 1 }), `load ${name}`);
      },
    });
    const leases: Promise<CacheLease<string>>[] = [];
    for (const name of order) {
      void s.schedule(Promise.resolve(), `acquire ${name}`).then(() => leases.push(cache.acquire(name)));
    }
    await s.waitIdle();
    for (const l of await Promise.all(leases)) expect(l.value).toBe(`v:${l.name}`);
    expect(leases).toHaveLength(order.length);
    for (const n of new Set(order)) expect(calls.get(n)).toBe(1);
    const st = cache.stats();
    expect(st).toMatchObject({ loads: new Set(order).size, failedLoads: 0, loading: 0, evictions: 0 });
    expect(st.hits + st.misses).toBe(order.length);
    expect(st.misses).toBeGreaterThanOrEqual(new Set(order).size);
    for (const e of cache.entries()) expect(e.leases).toBe(order.filter((n) => n === e.name).length);
  });

  const arbOp = fc.oneof(
    fc.record({ kind: fc.constant('acquire' as const), name: arbName }),
    fc.record({ kind: fc.constant('release' as const), index: fc.nat() }),
    fc.record({ kind: fc.constant('pin' as const), name: arbName }),
    fc.record({ kind: fc.constant('unpin' as const), name: arbName }),
    fc.record({ kind: fc.constant('evict' as const), name: arbName }),
    fc.record({ kind: fc.constant('step' as const), count: fc.integer({ min: 1, max: 3 }) }),
  );
  const arbSizes = fc.record(Object.fromEntries(NAMES.map((n) => [n, fc.integer({ min: 30, max: 140 })])) as Record<Name, fc.Arbitrary<number>>);

  test.prop([fc.scheduler(), arbSizes, fc.array(arbOp, { maxLength: 60 })])('never exceeds the budget and never evicts a pinned or in-use adapter', async (s, sizes, ops) => {
    const budget = 300; // room for about three adapters
    const held: CacheLease<string>[] = [];
    const pinned = new Set<string>(); // a subset of the cache's pinned entries (the cache sets its flag first)
    const unpinEpoch = new Map<string, number>();
    const failures: unknown[] = [];
    let acquires = 0;
    const cache: AdapterCache<string> = new AdapterCache<string>({
      budgetBytes: budget,
      load: (name) => s.schedule(Promise.resolve({ value: `v:${name}`, bytes: sizes[name as Name] }), `load ${name}`),
      dispose: (name) => {
        // Disposal of an evicted entry, or of a refused load: never one the test holds or pinned.
        expect(held.some((l) => l.name === name && !l.released)).toBe(false);
        expect(pinned.has(name)).toBe(false);
        expect(cache.has(name)).toBe(false);
      },
    });
    const check = (): void => {
      checkConsistent(cache, acquires);
      const entries = new Map(cache.entries().map((e) => [e.name, e]));
      for (const l of held) expect(entries.get(l.name)?.leases).toBeGreaterThanOrEqual(held.filter((h) => h.name === l.name).length);
      for (const n of pinned) expect(entries.get(n)?.pinned).toBe(true);
    };
    const onFail = (e: unknown): void => {
      failures.push(e);
    };
    for (const op of ops) {
      switch (op.kind) {
        case 'acquire':
          acquires++;
          cache.acquire(op.name).then((l) => held.push(l), onFail);
          break;
        case 'release': {
          const l = held.splice(op.index % Math.max(1, held.length), 1)[0];
          l?.release();
          break;
        }
        case 'pin': {
          acquires++;
          const epoch = unpinEpoch.get(op.name) ?? 0;
          cache.pin(op.name).then(() => {
            if ((unpinEpoch.get(op.name) ?? 0) === epoch) pinned.add(op.name);
          }, onFail);
          break;
        }
        case 'unpin':
          pinned.delete(op.name);
          unpinEpoch.set(op.name, (unpinEpoch.get(op.name) ?? 0) + 1);
          if (cache.has(op.name)) cache.unpin(op.name);
          else
            expectCode(() => {
              cache.unpin(op.name);
            }, PeftCode.UNKNOWN_ADAPTER);
          break;
        case 'evict': {
          const e = cache.entries().find((x) => x.name === op.name);
          if (e === undefined) expect(cache.evict(op.name)).toBe(false);
          else if (e.pinned || e.leases > 0) expectCode(() => cache.evict(op.name), PeftCode.IN_USE);
          else expect(cache.evict(op.name)).toBe(true);
          expect(cache.has(op.name)).toBe(e !== undefined && (e.pinned || e.leases > 0));
          break;
        }
        case 'step':
          if (s.count() > 0) await s.waitNext(Math.min(op.count, s.count()));
          break;
      }
      check();
    }
    await s.waitIdle();
    check();
    // The only way a load fails here is not fitting beside the pinned and in-use adapters.
    for (const f of failures) expect(f).toMatchObject({ code: PeftCode.CACHE_FULL });
    for (const l of held) l.release();
    for (const e of cache.entries()) if (e.pinned) cache.unpin(e.name);
    for (const e of cache.entries()) expect(cache.evict(e.name)).toBe(true);
    expect(cache.stats()).toMatchObject({ bytes: 0, entries: 0, loading: 0 });
  });

  const arbFailure = fc.record({ mode: fc.constantFrom('throw' as const, 'oversized' as const), waiters: fc.integer({ min: 1, max: 4 }) });
  const arbWarm = fc.record({ size: fc.integer({ min: 10, max: 60 }), state: fc.constantFrom('idle' as const, 'held' as const, 'pinned' as const) });

  test.prop([fc.scheduler(), fc.array(arbWarm, { minLength: 0, maxLength: 3 }), fc.array(arbFailure, { minLength: 1, maxLength: 3 })])(
    'a failed load leaves the cache exactly as it was, fails every waiter, and a retry loads',
    async (s, warm, failing) => {
      const budget = 200;
      const warmNames = warm.map((_, i) => `warm${String(i)}`);
      const failNames = failing.map((_, i) => `cold${String(i)}`);
      const mode = new Map<string, 'ok' | 'throw' | 'oversized'>(warmNames.map((n) => [n, 'ok']));
      const thrown = new Map<string, StageError[]>();
      const disposed: string[] = [];
      let heldBytes = 0;
      let scheduled = false;
      const cache = new AdapterCache<string>({
        budgetBytes: budget,
        load: (name) => {
          const i = warmNames.indexOf(name);
          const m = mode.get(name)!;
          let result: Promise<{ value: string; bytes: number }>;
          if (m === 'throw') {
            const err = new StageError('TEST_LOAD', `load ${name} #${String((thrown.get(name) ?? []).length)} failed`);
            thrown.set(name, [...(thrown.get(name) ?? []), err]);
            result = Promise.reject(err);
          } else {
            const bytes = m === 'oversized' ? budget - heldBytes + 1 : i >= 0 ? warm[i]!.size : 1;
            result = Promise.resolve({ value: `v:${name}`, bytes });
          }
          return scheduled ? s.schedule(result, `load ${name}`) : result;
        },
        dispose: (name) => disposed.push(name),
      });
      // Phase 1: a warm cache (entries idle, held or pinned), built without interleaving.
      const leases: CacheLease<string>[] = [];
      for (const [i, w] of warm.entries()) {
        const name = warmNames[i]!;
        if (w.state === 'pinned') await cache.pin(name);
        else {
          const l = await cache.acquire(name);
          if (w.state === 'held') leases.push(l);
          else l.release();
        }
        if (w.state !== 'idle') heldBytes += w.size;
      }
      const before = { entries: cache.entries(), stats: cache.stats() };
      disposed.length = 0;
      // Phase 2: cold loads that fail, issued and settled in a random order.
      scheduled = true;
      for (const [i, f] of failing.entries()) mode.set(failNames[i]!, f.mode);
      const outcomes: Promise<{ name: string; error: unknown }>[] = [];
      for (const [i, f] of failing.entries()) {
        const name = failNames[i]!;
        for (let k = 0; k < f.waiters; k++) {
          void s.schedule(Promise.resolve(), `acquire ${name}`).then(() => {
            outcomes.push(
              cache.acquire(name).then(
                () => ({ name, error: undefined }),
                (error: unknown) => ({ name, error }),
              ),
            );
          });
        }
      }
      await s.waitIdle();
      const results = await Promise.all(outcomes);
      expect(cache.entries()).toEqual(before.entries);
      const after = cache.stats();
      expect(after).toMatchObject({ bytes: before.stats.bytes, entries: before.stats.entries, evictions: before.stats.evictions, loading: 0 });
      expect(after.failedLoads - before.stats.failedLoads).toBe(after.loads - before.stats.loads);
      for (const [i, f] of failing.entries()) {
        const name = failNames[i]!;
        const errors = results.filter((r) => r.name === name).map((r) => r.error);
        expect(errors).toHaveLength(f.waiters);
        // Waiters that shared a load share its error: one distinct error per load made.
        const distinct = new Set(errors);
        if (f.mode === 'throw') {
          for (const e of errors) expect(thrown.get(name)).toContain(e);
          expect(distinct.size).toBe(thrown.get(name)!.length);
        } else {
          for (const e of errors) expect(e).toMatchObject({ code: PeftCode.CACHE_FULL });
          expect(disposed.filter((n) => n === name)).toHaveLength(distinct.size);
        }
      }
      expect(disposed.every((n) => failNames.includes(n))).toBe(true);
      // Phase 3: the same adapters load once their loader works.
      for (const n of failNames) mode.set(n, 'ok');
      const retried = failNames.map((n) => cache.acquire(n));
      await s.waitIdle();
      expect((await Promise.all(retried)).map((l) => l.value)).toEqual(failNames.map((n) => `v:${n}`));
      checkConsistent(cache, after.hits + after.misses + failNames.length);
      for (const l of leases) expect(cache.has(l.name)).toBe(true);
    },
  );
});
