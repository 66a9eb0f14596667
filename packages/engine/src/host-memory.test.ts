// What the host keeps of the adapters (issues 38 and 41): on host slot tables an adapter's factors
// live once, in its slot (the host cache holds no parsed copy beside it); on device slot tables
// (the torch executor) the host keeps at most one adapter's parsed copy and one adapter's rows in
// flight to the worker, however many slots there are.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { DeviceWrite } from '@stageml/runtime';
import { beforeAll, describe, expect, it } from 'vitest';
import { Engine } from './engine.js';
import { writeRandomAdapter, writeRandomLlama } from './random-checkpoint.js';
import { describeWithTorch, useCpuTorchExecutor } from './test-support.js';

const SHAPE = { vocabSize: 64, hiddenSize: 32, intermediateSize: 64, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 8, tieWordEmbeddings: false, rmsNormEps: 1e-5, maxPositions: 128 };
const RANK = 8;
const ADAPTERS = 8;
const root = mkdtempSync(join(tmpdir(), 'stageml-host-memory-'));
const names = Array.from({ length: ADAPTERS }, (_, i) => `a${String(i)}`);

beforeAll(async () => {
  await writeRandomLlama(join(root, 'base'), SHAPE, 3);
  for (const [i, n] of names.entries()) await writeRandomAdapter(join(root, n), SHAPE, { rank: RANK, seed: 10 + i });
}, 60_000);

describe('host slot tables', () => {
  it('keep each resident adapter once, in its slot: the host cache holds no parsed copy beside it', async () => {
    // The default maxCpuLoras (maxLoras) would otherwise keep every adapter a second time.
    const e = await Engine.load(join(root, 'base'), { maxLoras: ADAPTERS, maxLoraRank: RANK });
    for (const n of names) await e.loadAdapter(join(root, n), n);
    const m = e.memory();
    expect(m.slotFactors).toBeGreaterThan(0);
    expect(m.hostAdapters).toBe(0);
    // The slots still serve the adapters: a row on an adapter differs from the base row.
    const on = e.open(names[3], [1, 2, 3]);
    const off = e.open(undefined, [1, 2, 3]);
    for (const s of [on, off]) expect(await e.attach(s)).toBe(true);
    const a = (await e.prefill(on))!;
    const b = (await e.prefill(off))!;
    expect(Array.from(a)).not.toEqual(Array.from(b));
    e.release(on);
    e.release(off);
  });

  it('read an adapter that lost its slot again from its directory, with the same factors', async () => {
    const e = await Engine.load(join(root, 'base'), { maxLoras: 2, maxLoraRank: RANK });
    for (const n of names.slice(0, 3)) await e.loadAdapter(join(root, n), n);
    const first = e.open(names[0], [5, 6, 7]);
    expect(await e.attach(first)).toBe(true);
    const before = Array.from((await e.prefill(first))!);
    e.release(first);
    // Two more adapters take both slots; the first comes back from its directory.
    for (const n of names.slice(1, 3)) {
      const s = e.open(n, [1]);
      expect(await e.attach(s)).toBe(true);
      e.release(s);
    }
    const again = e.open(names[0], [5, 6, 7]);
    expect(await e.attach(again)).toBe(true);
    expect(Array.from((await e.prefill(again))!)).toEqual(before);
    expect(e.memory().hostAdapters).toBe(0);
    e.release(again);
  });
});

describeWithTorch('device slot tables (torch executor)', () => {
  const torch = useCpuTorchExecutor();

  it('hold one adapter on the host however many slots: one parsed copy and one slot write in flight', async () => {
    const executor = torch();
    const device = executor.device;
    const send = device.write.bind(device);
    let inFlight = 0;
    let peak = 0;
    const bytesOf = (ws: readonly DeviceWrite[]): number => ws.reduce((a, w) => a + w.data.byteLength, 0);
    // A slow device: each write lands 30 ms after it was sent. Loads that did not wait for their
    // rows to land would pile one adapter's rows per slot onto the pipe.
    (device as { write: typeof device.write }).write = async (ws) => {
      const b = bytesOf(ws);
      inFlight += b;
      peak = Math.max(peak, inFlight);
      try {
        await new Promise((r) => setTimeout(r, 30));
        await send(ws);
      } finally {
        inFlight -= b;
      }
    };
    try {
      const e = await Engine.load(join(root, 'base'), { executor, maxLoras: ADAPTERS, maxLoraRank: RANK });
      expect(e.memory().onDevice).toBeGreaterThan(0);
      let oneAdapter = 0;
      for (const n of names) {
        const a = await e.loadAdapter(join(root, n), n);
        oneAdapter = Math.max(oneAdapter, a.bytes);
      }
      expect(e.memory().slotFactors).toBeGreaterThan(0);
      // The host keeps at most one parsed adapter (maxCpuLoras' default on device tables) …
      expect(e.memory().hostAdapters).toBeLessThanOrEqual(oneAdapter);
      // … and sends one adapter's rows at a time (f32 rows of rank r: the adapter's own bytes).
      expect(peak).toBeGreaterThan(0);
      expect(peak).toBeLessThanOrEqual(oneAdapter);
    } finally {
      (device as { write: typeof device.write }).write = send;
    }
  }, 120_000);
});
