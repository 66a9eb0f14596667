// Suite `models`: prefill and decode tokens/s of the fixture Llama (2 layers, hidden 64) and of a
// random-weight Llama-shaped model (12 layers, hidden 768, 12 heads, intermediate 3072, vocab
// 32000; weights made here, written to a temporary checkpoint), per executor, through the serving
// engine (one sequence). Baseline: the reference interpreter in the same run (ratio = its time /
// the executor's time, i.e. speed-up).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type HostTensor, graphParams } from '@stageml/ir';
import { Engine } from '@stageml/engine';
import { buildLlamaGraph } from '@stageml/models';
import { type Executor, createOrtExecutor, createTfjsExecutor, interpreterExecutor, isOrtAvailable } from '@stageml/runtime';
import { writeSafetensors } from '@stageml/safetensors';
import { type BenchCase, writeResults } from './lib/harness.js';

async function median(fn: () => Promise<unknown>, runs: number): Promise<number> {
  await fn();
  const t: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await fn();
    t.push(performance.now() - t0);
  }
  t.sort((a, b) => a - b);
  return t[t.length >> 1]!;
}

function rand(n: number, seed: number, scale: number): Float32Array {
  const out = new Float32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = ((s / 4294967296) * 2 - 1) * scale;
  }
  return out;
}

async function randomModel(dir: string): Promise<void> {
  const cfg = { model_type: 'llama', vocab_size: 32000, hidden_size: 768, intermediate_size: 3072, num_hidden_layers: 12, num_attention_heads: 12, num_key_value_heads: 12, rms_norm_eps: 1e-5, rope_theta: 10000, max_position_embeddings: 2048, tie_word_embeddings: false, eos_token_id: 2 };
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
  const g = buildLlamaGraph({ vocabSize: 32000, hiddenSize: 768, intermediateSize: 3072, numLayers: 12, numHeads: 12, numKvHeads: 12 });
  const tensors: Record<string, HostTensor> = {};
  graphParams(g).forEach((p, i) => {
    const shape = g.values[p.results[0]!]!.type.shape as number[];
    const n = shape.reduce((a, b) => a * b, 1);
    tensors[p.name] = { dtype: 'f32', shape, data: p.name.includes('norm') ? new Float32Array(n).fill(1) : rand(n, i + 1, 0.05) };
  });
  await writeSafetensors(join(dir, 'model.safetensors'), tensors);
}

interface Target {
  name: string;
  dir: string;
  prompt: number;
  decode: number;
  runs: Record<string, number>;
}

const tmp = mkdtempSync(join(tmpdir(), 'stageml-bench-models-'));
const big = join(tmp, 'llama-12x768');
const { mkdirSync } = await import('node:fs');
mkdirSync(big);
await randomModel(big);
const targets: Target[] = [
  { name: 'fixture llama (2×64)', dir: 'fixtures/peft-tiny/llama/base', prompt: 32, decode: 16, runs: { interpreter: 5, 'tfjs-wasm': 5, 'tfjs-cpu': 5, onnxruntime: 5 } },
  { name: 'random llama (12×768)', dir: big, prompt: 32, decode: 8, runs: { interpreter: 1, 'tfjs-wasm': 3, 'tfjs-cpu': 1, onnxruntime: 3 } },
];
const executors: [string, () => Promise<Executor>][] = [
  ['interpreter', () => Promise.resolve(interpreterExecutor)],
  ['tfjs-wasm', () => createTfjsExecutor({ backend: 'wasm' })],
  ['tfjs-cpu', () => createTfjsExecutor({ backend: 'cpu' })],
  ...((await isOrtAvailable()) ? [['onnxruntime', () => createOrtExecutor()] as [string, () => Promise<Executor>]] : []),
];

const cases: BenchCase[] = [];
for (const t of targets) {
  const base: Record<string, { prefill: number; decode: number }> = {};
  for (const [name, make] of executors) {
    const engine = await Engine.load(t.dir, { executor: await make(), maxLoras: 1, prefillChunk: t.prompt });
    const ids = Array.from({ length: t.prompt }, (_, i) => (i * 7 + 3) % engine.config.vocabSize);
    const runs = t.runs[name] ?? 1;
    // The whole prompt in one prefill run of a fresh sequence.
    const prefill = await median(async () => {
      const s = engine.open(undefined, ids, undefined, false);
      await engine.attach(s);
      await engine.prefill(s);
      engine.release(s);
    }, runs);
    // Decode steps of 1 new token each on the prompt's resident KV, timed directly.
    const seq = engine.open(undefined, ids, undefined, false);
    await engine.attach(seq);
    await engine.prefill(seq);
    const decodeRuns = Math.max(runs, t.decode);
    const decodePerToken = await median(() => engine.decode([seq], [7]), decodeRuns);
    engine.release(seq);
    engine.dispose();
    base[name] = { prefill, decode: decodePerToken };
    const ref = base['interpreter']!;
    cases.push({ name: `${t.name} · ${name} · prefill ${String(t.prompt)} tokens`, medianMs: prefill, runs, baseline: 'interpreter', ratio: ref.prefill / prefill, extra: { tokensPerSecond: Math.round((t.prompt / prefill) * 1000) } });
    cases.push({ name: `${t.name} · ${name} · decode (per token)`, medianMs: decodePerToken, runs: decodeRuns, baseline: 'interpreter', ratio: ref.decode / decodePerToken, extra: { tokensPerSecond: Math.round(1000 / decodePerToken) } });
  }
}
rmSync(tmp, { recursive: true, force: true });
writeResults('models', 'Prefill and decode per executor (batch 1). Ratio = interpreter time / executor time (higher is faster). Through the serving engine, one sequence. Decode = one step of 1 new token on the resident KV of the sequence (prompt and earlier steps), timed directly.', cases);
