import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { GraphBuilder, type HostTensor, graphToJson, hostTensor } from '@stageml/ir';
import { expect, it, vi } from 'vitest';
import { CacheLostError, RuntimeCode } from '../errors.js';
import type { CacheStream, PreparedGraph } from '../executor.js';
import { FrameDecoder, createTorchExecutor, encodeFrame } from './index.js';
import { describeWithTorch, useCpuTorchExecutor } from './test-support.js';

const NATIVE = fileURLToPath(new URL('../../../../native', import.meta.url));

/** A graph that shows what a cache holds: `all` is the cached positions then the run's own, `new` what a run appends. */
function echoGraph(): ReturnType<GraphBuilder['build']> {
  const b = new GraphBuilder('echo');
  const past = b.input('past', ['f32', ['batch', 'past', 2]]);
  const mask = b.input('mask', ['f32', ['batch', 'past + seq']]);
  const x = b.input('x', ['f32', ['batch', 'seq', 2]]);
  const fresh = b.mul(x, b.constant([1], 'f32', []));
  b.output('all', b.concat([past, fresh], 1));
  b.output('mask_seen', b.mul(mask, b.constant([1], 'f32', [])));
  b.output('new', fresh);
  return b.build();
}

const STREAMS: CacheStream[] = [
  { input: 'past', from: 'new', pad: -1 },
  { input: 'mask', from: undefined, pad: -9 },
];

/** Appends `values` (pairs) to cache `id`, which holds `length` positions; returns what the run read and appended. */
async function append(p: PreparedGraph, id: number, length: number, values: readonly number[]): Promise<{ all: number[]; mask: number[] }> {
  const n = values.length / 2;
  const out = await p.run({ x: hostTensor('f32', [1, n, 2], [...values]), mask: hostTensor('f32', [1, n], values.filter((_, i) => i % 2 === 0)) }, { caches: { streams: STREAMS, rows: [{ id, length, append: [0, n] }] } });
  return { all: Array.from(out['all']!.data), mask: Array.from(out['mask_seen']!.data) };
}

/** Sends raw frames to a fresh worker and collects its replies until it exits. */
async function talk(python: string, frames: Buffer[]): Promise<Record<string, unknown>[]> {
  const child = spawn(python, ['-m', 'stageml_torch.worker', '--device', 'cpu'], { env: { ...process.env, PYTHONPATH: NATIVE }, stdio: ['pipe', 'pipe', 'ignore'] });
  const d = new FrameDecoder();
  const replies: Record<string, unknown>[] = [];
  child.stdout.on('data', (c: Buffer) => {
    d.push(c);
    for (let f = d.next(); f !== undefined; f = d.next()) replies.push(f.header);
  });
  for (const f of frames) child.stdin.write(f);
  child.stdin.end();
  await new Promise<void>((r) => {
    child.on('exit', () => {
      r();
    });
  });
  return replies;
}

describeWithTorch('cache forks on the torch worker (CacheStore.fork, keep, holds)', () => {
  const torch = useCpuTorchExecutor();

  it('forks the first positions of a cache on the worker: the fork reads them, appends on its own, and leaves the source as it was', async () => {
    const p = await torch().prepare(echoGraph());
    const caches = torch().caches;
    const a = caches.open();
    await append(p, a, 0, [1, 1, 2, 2, 3, 3]);
    expect(caches.holds!(a, 3)).toBe(true);
    expect(caches.holds!(a, 4)).toBe(false);
    const f = caches.fork!(a, 2);
    // The fork is sent before the run below, which reads its two positions and appends a third.
    expect((await append(p, f, 2, [7, 7])).all).toEqual([1, 1, 2, 2, 7, 7]);
    expect(caches.holds!(f, 3)).toBe(true);
    // The source still holds its three positions (and the fork's append is not in it).
    const src = await append(p, a, 3, [4, 4]);
    expect(src.all).toEqual([1, 1, 2, 2, 3, 3, 4, 4]);
    expect(src.mask).toEqual([1, 2, 3, 4]);
    // Both in one batch: each row its own positions.
    const both = await p.run({ x: hostTensor('f32', [2, 1, 2], [5, 5, 8, 8]), mask: hostTensor('f32', [2, 1], [0, 0]) }, { caches: { streams: STREAMS, rows: [{ id: a, length: 4, append: [0, 1] }, { id: f, length: 3, append: [0, 1] }] } });
    expect(Array.from(both['all']!.data)).toEqual([1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 1, 1, 2, 2, 7, 7, -1, -1, 8, 8]);
    caches.release([a, f]);
    p.dispose();
  }, 60_000);

  it('keeps a cache at its first positions out of the batch, forks from it, and frees it on release (the worker\'s cache count returns)', async () => {
    const p = await torch().prepare(echoGraph());
    const caches = torch().caches;
    const a = caches.open();
    const b = caches.open();
    await append(p, a, 0, [1, 1, 2, 2, 3, 3, 4, 4]);
    await append(p, b, 0, [9, 9]);
    caches.release([b]);
    // The earlier tests released theirs: the worker holds `a` alone.
    await vi.waitFor(() => {
      expect(caches.stats!()['caches']).toBe(1);
    });
    caches.keep!(a, 3);
    expect(caches.holds!(a, 3)).toBe(true);
    expect(caches.holds!(a, 4)).toBe(false);
    const f = caches.fork!(a, 3);
    expect((await append(p, f, 3, [6, 6])).all).toEqual([1, 1, 2, 2, 3, 3, 6, 6]);
    expect(caches.stats!()['caches']).toBe(2);
    caches.release([a, f]);
    await vi.waitFor(() => {
      expect(caches.stats!()['caches']).toBe(0);
    });
    p.dispose();
  }, 60_000);

  it('refuses bad forks and keeps with coded errors; a fork of positions the worker lacks is lost, and its first run says so', async () => {
    const p = await torch().prepare(echoGraph());
    const caches = torch().caches;
    const a = caches.open();
    await append(p, a, 0, [1, 1, 2, 2]);
    expect(() => caches.fork!(999_999, 1)).toThrow(expect.objectContaining({ code: RuntimeCode.BAD_VALUE }));
    expect(() => caches.fork!(a, -1)).toThrow(expect.objectContaining({ code: RuntimeCode.BAD_VALUE }));
    expect(() => caches.fork!(a, 1.5)).toThrow(expect.objectContaining({ code: RuntimeCode.BAD_VALUE }));
    expect(() => { caches.keep!(999_999, 0); }).toThrow(expect.objectContaining({ code: RuntimeCode.BAD_VALUE }));
    // Three positions of a two-position cache: never sent; the fork is lost from the start.
    const f = caches.fork!(a, 3);
    expect(caches.holds!(f, 0)).toBe(false);
    const err: unknown = await append(p, f, 3, [5, 5]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CacheLostError);
    expect(err).toMatchObject({ code: RuntimeCode.CACHE_LOST, ids: [f] });
    caches.release([a, f]);
    p.dispose();
  }, 60_000);

  it('loses forks and kept caches with a restarted worker: holds says so, and a fork made after it is lost', async () => {
    const own = await createTorchExecutor({ device: 'cpu' });
    try {
      const p = await own.prepare(echoGraph());
      const a = own.caches.open();
      await append(p, a, 0, [1, 1, 2, 2]);
      own.caches.keep!(a, 2);
      expect(own.caches.holds!(a, 2)).toBe(true);
      process.kill(own.pid!, 'SIGKILL');
      await vi.waitFor(() => {
        expect(own.pid).toBeUndefined();
      });
      // The next run starts a new worker, which holds no caches.
      const b = own.caches.open();
      await append(p, b, 0, [3, 3]);
      expect(own.traffic().restarts).toBe(1);
      expect(own.caches.holds!(a, 2)).toBe(false);
      const f = own.caches.fork!(a, 2);
      await expect(append(p, f, 2, [5, 5])).rejects.toBeInstanceOf(CacheLostError);
      p.dispose();
    } finally {
      await own.close();
    }
  }, 120_000);

  it('answers cache_fork and cache_keep with coded errors on the wire, changing nothing', async () => {
    const g = graphToJson(echoGraph());
    const seed = (n: number): Record<string, HostTensor> => ({ x: hostTensor('f32', [1, n, 2], new Array<number>(2 * n).fill(1)), mask: hostTensor('f32', [1, n], new Array<number>(n).fill(0)) });
    const caches = { streams: STREAMS.map((s) => ({ input: s.input, from: s.from ?? null, pad: s.pad, store: null })), rows: [{ id: 1, append: [0, 2] }] };
    const frames = [
      encodeFrame({ op: 'prepare', id: 1, graph: g }),
      encodeFrame({ op: 'run', id: 2, handle: 1, caches }, seed(2)),
      encodeFrame({ op: 'cache_fork', id: 3, from: 7, to: 8, length: 1 }),
      encodeFrame({ op: 'cache_fork', id: 4, from: 1, to: 8, length: 3 }),
      encodeFrame({ op: 'cache_fork', id: 5, from: 1, to: 1, length: 1 }),
      encodeFrame({ op: 'cache_fork', id: 6, from: 1, to: -2, length: 1 }),
      encodeFrame({ op: 'cache_keep', id: 7, cache: 7, length: 1 }),
      encodeFrame({ op: 'cache_keep', id: 8, cache: 1, length: 2 }),
      encodeFrame({ op: 'cache_fork', id: 9, from: 1, to: 8, length: 2 }),
      encodeFrame({ op: 'cache_keep', id: 10, cache: 8, length: 1 }),
      encodeFrame({ op: 'cache_drop', id: 11, ids: [1, 8] }),
    ].flat();
    const replies = await talk(torch().info.python, frames);
    expect(replies.map((r) => r['ok'])).toEqual([true, true, false, false, false, false, false, true, true, true, true]);
    expect(replies[2]).toMatchObject({ code: RuntimeCode.CACHE_LOST, message: expect.stringContaining('cache 7') });
    expect(replies[3]).toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining('length 3') });
    expect(replies[4]).toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining('not a free id') });
    expect(replies[5]).toMatchObject({ code: RuntimeCode.BAD_VALUE });
    expect(replies[6]).toMatchObject({ code: RuntimeCode.CACHE_LOST });
    expect(replies.slice(7).map((r) => r['caches'])).toEqual([1, 2, 2, 0]);
  }, 60_000);
});
