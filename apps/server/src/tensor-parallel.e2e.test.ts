// `--tensor-parallel-size 2` on CPU torch (gloo): the reference server on a two-rank torch worker
// gives the greedy tokens of the one-rank worker for the base model, one adapter and a mixed batch
// of eight adapters, and a killed rank takes its group down, which the executor starts again.
// CI must run it (Debian's python3-torch); elsewhere it is skipped when Python 3 with torch is missing.
import { cpSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeRandomAdapter } from '@stageml/engine';
import { RuntimeCode, RuntimeError, type TorchExecutor, createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { describeNeeding } from '@stageml/testkit';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { type StageServer, createServer } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, unknown> & { families: { llama: { adapters: string[] } } };
const FIXTURE_ADAPTERS = golden.families.llama.adapters;
const prompt = (p: number): number[] => (golden['llama.base'] as Record<string, { input_ids: number[] }>)[`prompt${String(p % 4)}`]!.input_ids;
// The fixture model's shape (fixtures/peft-tiny/llama/base/config.json): 4 query and 2 key/value heads.
const SHAPE = { vocabSize: 512, hiddenSize: 64, intermediateSize: 176, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 16 };

async function greedy(base: string, model: string, p: number): Promise<number[]> {
  const body = { model, prompt: prompt(p), max_tokens: 10, temperature: 0, ignore_eos: true, return_token_ids: true };
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const json = (await r.json()) as { choices: { token_ids: number[] }[] };
  expect(r.status, JSON.stringify(json)).toBe(200);
  return json.choices[0]!.token_ids;
}

describeNeeding(
  'tensor parallelism through the server (2 gloo ranks on the CPU)',
  isTorchAvailable(),
  () => new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'the torch executor tests need Python 3 with torch in CI: apt-get install python3-torch'),
  () => {
    let dir: string;
    let adapters: string[];
    let one: TorchExecutor;
    let two: TorchExecutor;
    let serverOne: StageServer;
    let serverTwo: StageServer;
    let urlOne: string;
    let urlTwo: string;
    beforeAll(async () => {
      // The fixture's four adapters and four random ones (every projection, ranks 2 to 16).
      dir = mkdtempSync(join(tmpdir(), 'stageml-tp-'));
      for (const a of FIXTURE_ADAPTERS) cpSync(`${root}llama/adapters/${a}`, join(dir, a), { recursive: true });
      const extra = [2, 4, 8, 16].map((rank, i) => ({ name: `rand-r${String(rank)}`, rank, seed: 11 + i }));
      for (const e of extra) await writeRandomAdapter(join(dir, e.name), SHAPE, { rank: e.rank, seed: e.seed });
      adapters = [...FIXTURE_ADAPTERS, ...extra.map((e) => e.name)];
      [one, two] = await Promise.all([createTorchExecutor({ device: 'cpu' }), createTorchExecutor({ device: 'cpu', tensorParallelSize: 2 })]);
      const opts = { modelDir: `${root}llama/base`, modelName: 'llama', adaptersDir: dir, padTokenId: 0, maxBatch: 8 };
      serverOne = await createServer({ ...opts, executor: one });
      serverTwo = await createServer({ ...opts, executor: two });
      urlOne = await serverOne.listen('127.0.0.1', 0);
      urlTwo = await serverTwo.listen('127.0.0.1', 0);
    }, 180_000);
    afterAll(async () => {
      await serverOne.shutdown();
      await serverTwo.shutdown();
      await one.close();
      await two.close();
      rmSync(dir, { recursive: true, force: true });
    });

    it('starts two ranks, each on the CPU', () => {
      expect(two.info.tensorParallelSize).toBe(2);
      expect(two.info.rankDevices).toEqual(['cpu', 'cpu']);
      expect(two.rankPids).toHaveLength(2);
      expect(one.info.tensorParallelSize).toBe(1);
    });

    it('gives the one-rank greedy tokens for the base model, one adapter and a mixed batch of eight adapters', async () => {
      expect(await greedy(urlTwo, 'llama', 0)).toEqual(await greedy(urlOne, 'llama', 0));
      expect(await greedy(urlTwo, 'all-r16', 1)).toEqual(await greedy(urlOne, 'all-r16', 1));
      const want = await Promise.all(adapters.map((a, i) => greedy(urlOne, a, i)));
      const got = await Promise.all(adapters.map((a, i) => greedy(urlTwo, a, i)));
      expect(got).toEqual(want);
      // The adapters matter (not eight copies of the base model's tokens).
      expect(new Set(want.map((ids) => ids.join(','))).size).toBeGreaterThan(4);
    }, 120_000);

    it('gives the one-rank log-probabilities to 1e-5 (f32)', async () => {
      const logprobs = async (url: string, model: string): Promise<number[]> => {
        const body = { model, prompt: prompt(3), max_tokens: 4, temperature: 0, ignore_eos: true, logprobs: 5 };
        const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
        expect(r.status).toBe(200);
        const json = (await r.json()) as { choices: { logprobs: { top_logprobs: Record<string, number>[] } }[] };
        return json.choices[0]!.logprobs.top_logprobs.flatMap((top) => Object.values(top));
      };
      for (const model of ['llama', 'all-r16', 'rand-r8']) {
        const want = await logprobs(urlOne, model);
        const got = await logprobs(urlTwo, model);
        expect(got).toHaveLength(want.length);
        expect(want.length).toBeGreaterThan(0);
        for (let i = 0; i < want.length; i++) expect(Math.abs(got[i]! - want[i]!), `${model} #${String(i)}`).toBeLessThan(1e-5);
      }
    }, 60_000);

    it('with 4 ranks over the 2 key/value heads (each rank slicing the head its queries read) gives the one-rank tokens too', async () => {
      const four = await createTorchExecutor({ device: 'cpu', tensorParallelSize: 4 });
      const server = await createServer({ modelDir: `${root}llama/base`, modelName: 'llama', adaptersDir: dir, padTokenId: 0, maxBatch: 8, executor: four });
      try {
        const url = await server.listen('127.0.0.1', 0);
        const models = ['llama', 'o-r2', 'rand-r16'];
        const want = await Promise.all(models.map((m, i) => greedy(urlOne, m, i)));
        expect(await Promise.all(models.map((m, i) => greedy(url, m, i)))).toEqual(want);
      } finally {
        await server.shutdown();
        await four.close();
      }
    }, 120_000);

    it('refuses bad sizes with RT_TENSOR_PARALLEL', async () => {
      await expect(createTorchExecutor({ device: 'cpu', tensorParallelSize: 0 })).rejects.toMatchObject({ code: 'RT_TENSOR_PARALLEL' });
      await expect(createTorchExecutor({ device: 'cpu', tensorParallelSize: -1 })).rejects.toMatchObject({ code: 'RT_TENSOR_PARALLEL' });
      await expect(createTorchExecutor({ device: 'cpu', tensorParallelSize: 1.5 })).rejects.toMatchObject({ code: 'RT_TENSOR_PARALLEL' });
      // Three ranks do not divide the model's 4 heads: refused when the engine prepares its programs.
      const three = await createTorchExecutor({ device: 'cpu', tensorParallelSize: 3 });
      try {
        await expect(createServer({ modelDir: `${root}llama/base`, modelName: 'llama', padTokenId: 0, maxBatch: 2, executor: three })).rejects.toMatchObject({
          code: 'RT_TENSOR_PARALLEL',
          message: expect.stringContaining('4 attention heads') as string,
        });
      } finally {
        await three.close();
      }
      if (!one.info.cuda) {
        // More CUDA ranks than devices (none here).
        await expect(createTorchExecutor({ device: 'cuda', tensorParallelSize: 2 })).rejects.toMatchObject({ code: 'RT_TENSOR_PARALLEL' });
      }
    }, 120_000);

    it('restarts the whole group when one rank dies, and serves the same tokens again', async () => {
      const before = two.rankPids;
      const want = await greedy(urlOne, 'qv-r8', 2);
      process.kill(before[1]!, 'SIGKILL');
      expect(await greedy(urlTwo, 'qv-r8', 2)).toEqual(want);
      expect(two.traffic().restarts).toBeGreaterThanOrEqual(1);
      expect(two.rankPids).toHaveLength(2);
      expect(two.rankPids.some((p) => before.includes(p))).toBe(false);
    }, 120_000);
  },
);
