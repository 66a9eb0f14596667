// Sampled picks made where the logits are (`RunOptions.sample`, `Engine.decodeSample`): the torch
// worker draws each row's token with the host sampler's arithmetic (`samplePick` of
// @stageml/models) from the host's draw, and one i64 per row crosses instead of the vocabulary's
// logits.
import { fileURLToPath } from 'node:url';
import { GraphBuilder, hostTensor, seededRandom } from '@stageml/ir';
import { argmaxOf, processLogits, samplePick } from '@stageml/models';
import { type RowSample, RuntimeCode, interpreterExecutor } from '@stageml/runtime';
import { expect, it } from 'vitest';
import { Engine, EngineCode, type Sequence } from './index.js';
import { describeWithTorch, useCpuTorchExecutor } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/', import.meta.url));

/** The host's pick of one row (what the engine does with values): greedy rows the argmax rule. */
function hostPick(raw: ArrayLike<number>, r: RowSample): number {
  const row = r.processing === undefined ? raw : processLogits(raw, r.processing);
  return r.temperature === 0 ? argmaxOf(row) : samplePick(row, r.temperature, r.topK, r.topP, r.u);
}

/** Row specs cycling through greedy, plain, top-k, top-p, both, and extreme temperatures. */
function specs(rows: number, seed: number): RowSample[] {
  const rand = seededRandom(seed);
  const kinds: Omit<RowSample, 'u'>[] = [
    { temperature: 0, topK: 0, topP: 1 },
    { temperature: 1, topK: 0, topP: 1 },
    { temperature: 0.7, topK: 5, topP: 1 },
    { temperature: 0.9, topK: 0, topP: 0.8 },
    { temperature: 1.3, topK: 20, topP: 0.95 },
    { temperature: 0.05, topK: 0, topP: 0.5 },
    { temperature: 40, topK: 1000000, topP: 1 },
    { temperature: 1, topK: 1, topP: 0.3 },
  ];
  return Array.from({ length: rows }, (_, i) => ({ ...kinds[i % kinds.length]!, u: i % 11 === 10 ? 0 : rand() }));
}

describeWithTorch('sampled picks on the torch worker (CPU torch)', () => {
  const torch = useCpuTorchExecutor();

  it('draws each row as samplePick does from the values the host would read, in f32 and bf16, with ties, -inf and a vocabulary drawn in row chunks (ops.SAMPLE_CHUNK_ELEMENTS)', async () => {
    for (const dtype of ['f32', 'bf16'] as const) {
      for (const vocab of [7, 300, 131072]) {
        const b = new GraphBuilder('pick');
        const x = b.input('x', ['f32', ['r', vocab]]);
        const scaled = b.mul(x, b.constant([1], 'f32', []));
        b.output('logits', dtype === 'f32' ? scaled : b.cast(scaled, 'bf16'));
        const g = b.build();
        const p = await torch().prepare(g);
        try {
          const rows = 48;
          const rand = seededRandom(vocab);
          const data = new Float32Array(rows * vocab);
          for (let r = 0; r < rows; r++) {
            for (let i = 0; i < vocab; i++) {
              // Coarse values make ties; some rows hold -inf tokens and one a single finite token.
              const v = r % 3 === 0 ? Math.round(rand() * 8) / 2 : (rand() - 0.5) * 12;
              data[r * vocab + i] = r % 5 === 4 && i % 3 === 0 ? -Infinity : r === 7 && i !== vocab - 1 ? -Infinity : v;
            }
          }
          const input = { x: hostTensor('f32', [rows, vocab], data) };
          const full = (await p.run(input))['logits']!;
          for (const seed of [1, 2]) {
            const spec = specs(rows, seed * 1000 + vocab);
            const got = (await p.run(input, { sample: { logits: spec } }))['logits']!;
            expect(got).toMatchObject({ dtype: 'i64', shape: [rows] });
            const want = spec.map((r, i) => hostPick(full.data.subarray(i * vocab, (i + 1) * vocab), r));
            expect(Array.from(got.data), `${dtype} vocab ${String(vocab)} seed ${String(seed)}`).toEqual(want);
          }
        } finally {
          p.dispose();
        }
      }
    }
  }, 120_000);

  it('draws top-k rows from candidates at or above each row\'s k-th value (ties at it, tied maxima) as samplePick does', async () => {
    const vocab = 50000;
    const b = new GraphBuilder('pick');
    const x = b.input('x', ['f32', ['r', vocab]]);
    b.output('logits', b.mul(x, b.constant([1], 'f32', [])));
    const p = await torch().prepare(b.build());
    try {
      const rows = 24;
      const rand = seededRandom(77);
      const data = Float32Array.from({ length: rows * vocab }, () => (rand() - 0.5) * 10);
      for (let r = 0; r < rows; r++) {
        const row = data.subarray(r * vocab, (r + 1) * vocab);
        if (r % 3 === 0) for (const j of [5, 17, 33, 40000]) row[j] = 30; // a tied maximum
        if (r % 3 === 1) for (let j = 100; j < 160; j += 3) row[j] = 12 + (j % 2); // ties around the k-th value
      }
      const input = { x: hostTensor('f32', [rows, vocab], data) };
      const full = (await p.run(input))['logits']!;
      for (const ks of [[1, 2, 3, 5], [8, 20, 40, 21], [64, 2, 7, 1]]) {
        const spec = specs(rows, ks[0]!).map((r, i) => ({ ...r, temperature: i % 6 === 5 ? 0 : [0.6, 1, 2.5][i % 3]!, topK: ks[i % 4]!, topP: [1, 0.9, 0.5][i % 3]! }));
        const got = (await p.run(input, { sample: { logits: spec } }))['logits']!;
        const want = spec.map((r, i) => hostPick(full.data.subarray(i * vocab, (i + 1) * vocab), r));
        expect(Array.from(got.data), JSON.stringify(ks)).toEqual(want);
      }
      // A NaN among a row's largest values (a failed model): a token in range, not an error.
      const nan = Float32Array.from(data.subarray(0, 2 * vocab));
      nan[3] = Number.NaN;
      nan[vocab + 9] = Number.NaN;
      const row: RowSample = { temperature: 1, topK: 3, topP: 1, u: 0.5 };
      const drawn = (await p.run({ x: hostTensor('f32', [2, vocab], nan) }, { sample: { logits: [row, { ...row, u: 0.99 }] } }))['logits']!;
      for (const id of Array.from(drawn.data)) expect(id >= 0 && id < vocab).toBe(true);
    } finally {
      p.dispose();
    }
  }, 120_000);

  it('applies each row\'s logits processing (bias, repetition, frequency and presence penalties) first, as processLogits does', async () => {
    for (const vocab of [300, 50000]) {
      const b = new GraphBuilder('pick');
      const x = b.input('x', ['f32', ['r', vocab]]);
      b.output('logits', b.cast(b.mul(x, b.constant([1], 'f32', [])), 'bf16'));
      const p = await torch().prepare(b.build());
      try {
        const rows = 20;
        const rand = seededRandom(vocab + 3);
        const data = Float32Array.from({ length: rows * vocab }, () => Math.round((rand() - 0.5) * 40) / 4);
        const input = { x: hostTensor('f32', [rows, vocab], data) };
        const full = (await p.run(input))['logits']!;
        const ids = (n: number, salt: number): number[] => [...new Set(Array.from({ length: n }, (_, i) => (i * 7919 + salt * 104729) % (vocab + 40)))];
        const spec: RowSample[] = specs(rows, vocab).map((r, i) => ({
          ...r,
          topK: [0, 3, 0, 50][i % 4]!,
          processing: i % 5 === 4 ? {} : {
            ...(i % 2 === 0 ? { logitBias: ids(6, i).map((id, j) => [id, j % 2 === 0 ? 7.5 : -100] as const) } : {}),
            ...(i % 3 !== 2 ? { repetitionPenalty: [1.5, 0.7][i % 2]!, seen: ids(40, i + 1) } : {}),
            ...(i % 4 !== 3 ? { frequencyPenalty: 0.75, presencePenalty: -1.25, counts: ids(25, i + 2).map((id, j) => [id, 1 + (j % 4)] as const) } : {}),
          },
        }));
        const got = (await p.run(input, { sample: { logits: spec } }))['logits']!;
        const want = spec.map((r, i) => hostPick(full.data.subarray(i * vocab, (i + 1) * vocab), r));
        expect(Array.from(got.data), `vocab ${String(vocab)}`).toEqual(want);
        // Processing moved picks (against the same draws without it).
        const plain = spec.map((r, i) => hostPick(full.data.subarray(i * vocab, (i + 1) * vocab), { ...r, processing: {} }));
        expect(want.filter((w, i) => w !== plain[i]).length).toBeGreaterThan(rows / 4);
      } finally {
        p.dispose();
      }
    }
  }, 120_000);

  it('refuses bad sample requests with RT_BAD_VALUE before running, and in-process executors return the values', async () => {
    const b = new GraphBuilder('pick');
    const x = b.input('x', ['f32', ['r', 4]]);
    b.output('logits', b.mul(x, b.constant([1], 'f32', [])));
    b.output('ids', b.cast(x, 'i64'));
    const g = b.build();
    const p = await torch().prepare(g);
    const input = { x: hostTensor('f32', [2, 4], [1, 2, 3, 4, 4, 3, 2, 1]) };
    const row: RowSample = { temperature: 1, topK: 0, topP: 1, u: 0.5 };
    const bad = async (sample: Record<string, readonly RowSample[]>, message: string, extra: { argmax?: string[]; omit?: string[] } = {}): Promise<void> => {
      await expect(p.run(input, { sample, ...extra })).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining(message) as string });
    };
    await bad({ ids: [row, row] }, "sample names 'ids'");
    await bad({ nope: [row, row] }, "sample names 'nope'");
    await bad({ logits: [row, { ...row, temperature: -1 }] }, 'row 1: temperature');
    await bad({ logits: [row, { ...row, temperature: Number.NaN }] }, 'row 1: temperature');
    await bad({ logits: [{ ...row, topK: 1.5 }, row] }, 'row 0: topK');
    await bad({ logits: [{ ...row, topP: 0 }, row] }, 'row 0: topP');
    await bad({ logits: [{ ...row, topP: 1.5 }, row] }, 'row 0: topP');
    await bad({ logits: [{ ...row, u: 1 }, row] }, 'row 0: u');
    await bad({ logits: [] }, "sample 'logits' needs one row spec per row");
    await bad({ logits: [row, row] }, 'both sample and argmax', { argmax: ['logits'] });
    await bad({ logits: [row, row] }, 'both omit and sample', { omit: ['logits'] });
    // The row count is the worker's to check (the output's rows are known once it ran).
    await bad({ logits: [row, row, row] }, "sample 'logits' gives 3 rows, the output has 2");
    await bad({ logits: [{ ...row, processing: { logitBias: [[1, Number.NaN]] } }, row] }, 'row 0: logitBias must be [id, value] pairs');
    await bad({ logits: [row, { ...row, processing: { seen: [1, 1] } }] }, 'row 1: seen ids must be distinct');
    await bad({ logits: [row, { ...row, processing: { counts: [[1, 0]] } }] }, 'row 1: counts must be [id, value] pairs');
    await bad({ logits: [row, { ...row, processing: { repetitionPenalty: 0 } }] }, 'row 1: repetitionPenalty');
    await bad({ logits: [row, { ...row, processing: { presencePenalty: Number.POSITIVE_INFINITY } }] }, 'row 1: presencePenalty');
    // NaN logits (a failed model) still give each row a token in range, on either path.
    const nan = { x: hostTensor('f32', [2, 4], [Number.NaN, 1, 2, 3, 4, Number.NaN, Number.NaN, 1]) };
    for (const topK of [0, 2]) {
      const drawn = await p.run(nan, { sample: { logits: [{ ...row, topK }, { ...row, topK, u: 0.9 }] } });
      expect(drawn['logits']).toMatchObject({ dtype: 'i64', shape: [2] });
      for (const id of Array.from(drawn['logits']!.data)) expect(id >= 0 && id < 4).toBe(true);
    }
    // (The worker's own checks, for frames from other clients: runtime's sample-check test.)
    const ok = await p.run(input, { sample: { logits: [row, { ...row, temperature: 0 }] } });
    expect(Array.from(ok['logits']!.data)).toEqual([hostPick([1, 2, 3, 4], row), 0]);
    const local = await interpreterExecutor.prepare(g);
    expect((await local.run(input, { sample: { logits: [row, row] } }))['logits']).toMatchObject({ dtype: 'f32', shape: [2, 4] });
    p.dispose();
  }, 60_000);

  it('decodeSample on resident KV gives the tokens of host picks over the logits, one id per row in the reply', async () => {
    for (const dtype of ['f32', 'bf16'] as const) {
      const load = async (residentKv: boolean, executorPicks?: boolean): Promise<Engine> => {
        const e = await Engine.load(`${root}base`, { maxLoras: 4, maxLoraRank: 16, executor: torch(), dtype, residentKv, ...(executorPicks === undefined ? {} : { executorPicks }) });
        await e.loadAdapter(`${root}adapters/all-r16`, 'a');
        return e;
      };
      // On CPU torch the engine picks on the host unless told otherwise (`devicePicks`: CUDA only).
      const host = await load(false);
      const resident = await load(true, true);
      try {
        const prompts: [string | undefined, number[]][] = [
          ['a', [1, 52, 317, 335, 262]],
          [undefined, [1, 500, 72, 283, 10, 90]],
          ['a', [1, 54, 264, 479]],
        ];
        const run = async (e: Engine, onWorker: boolean): Promise<number[][]> => {
          const seqs: Sequence[] = prompts.map(([a, p]) => e.open(a, p));
          for (const s of seqs) expect(await e.attach(s)).toBe(true);
          const spec = specs(3, 5).map((r, i) => ({ ...r, temperature: [0.8, 0, 1.2][i]!, topK: [0, 0, 40][i]!, topP: [0.9, 1, 1][i]! }));
          // Chunks of 2: the prompts finish in different runs; a finishing row's first token is
          // drawn in that run (prefillSample), a row the run does not finish ignores its spec.
          let next: number[] = [];
          while (seqs.some((s) => !s.ready)) {
            const todo = seqs.filter((s) => !s.ready);
            const finishing = todo.map((s) => e.finishesPrefill(s, 2));
            if (onWorker) {
              const ids = await e.prefillSample(todo, todo.map((s, j) => (finishing[j] ? spec[seqs.indexOf(s)]! : { temperature: 1, topK: 0, topP: 1, u: 0.999 })), { maxChunk: 2 });
              expect(ids.map((id) => id !== undefined)).toEqual(finishing);
              ids.forEach((id, j) => {
                if (id !== undefined) next[seqs.indexOf(todo[j]!)] = id;
              });
            } else {
              const out = await e.prefillMany(todo, { maxChunk: 2 });
              expect(out.map((l) => l !== undefined)).toEqual(finishing);
              out.forEach((l, j) => {
                if (l !== undefined) next[seqs.indexOf(todo[j]!)] = hostPick(l, spec[seqs.indexOf(todo[j]!)]!);
              });
            }
          }
          next = [...next];
          const tokens: number[][] = seqs.map((_, i) => [next[i]!]);
          const draws = seqs.map((_, i) => seededRandom(100 + i));
          for (let step = 0; step < 6; step++) {
            const rows = spec.map((r, i) => ({ ...r, u: draws[i]!() }));
            if (onWorker) next = await e.decodeSample(seqs, next, rows);
            else next = (await e.decode(seqs, next)).map((l, i) => hostPick(l, rows[i]!));
            next.forEach((t, i) => tokens[i]!.push(t));
          }
          for (const s of seqs) e.release(s);
          return tokens;
        };
        const want = await run(host, false);
        expect(await run(resident, true)).toEqual(want);
        expect(await run(host, true)).toEqual(want);
        const onHost = await load(true);
        try {
          expect(await run(onHost, true)).toEqual(want);
        } finally {
          onHost.dispose();
        }
        // The reply of a sampled step: one i64 per row, not rows × vocabulary f32.
        const seqs = [resident.open('a', prompts[0]![1]), resident.open(undefined, prompts[1]![1])];
        for (const q of seqs) await resident.attach(q);
        while (seqs.some((q) => !q.ready)) await resident.prefillMany(seqs.filter((q) => !q.ready));
        const received = async (f: () => Promise<unknown>): Promise<number> => {
          const before = torch().traffic().receivedBytes;
          await f();
          return torch().traffic().receivedBytes - before;
        };
        const full = await received(() => resident.decode(seqs, [5, 6]));
        const picks = await received(() => resident.decodeSample(seqs, [7, 8], specs(2, 9)));
        expect(full - picks).toBeGreaterThanOrEqual(2 * resident.config.vocabSize * 4 - 2 * 8 - 64);
        await expect(Engine.load(`${root}base`, { executor: torch(), executorPicks: 'yes' as unknown as boolean })).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS, message: expect.stringContaining('executorPicks') as string });
        await expect(resident.decodeSample(seqs, [7, 8], specs(1, 9))).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS });
        await expect(resident.prefillSample(seqs, specs(1, 9))).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS, message: expect.stringContaining('prefillSample needs one row spec per sequence') as string });
        await expect(resident.decodeSample(seqs, [7, 8], [{ temperature: 1, topK: 0, topP: 1, u: 2 }, specs(1, 9)[0]!])).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS, message: expect.stringContaining('u must be in [0, 1)') as string });
        for (const q of seqs) resident.release(q);
      } finally {
        host.dispose();
        resident.dispose();
      }
    }
  }, 180_000);
});
