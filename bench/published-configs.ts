// Suite `published-configs`: the published config.json fields of Qwen3-8B, Qwen3-30B-A3B,
// gemma-3-4b-it, Phi-4-mini-instruct and OLMo-2-1124-7B (as packages/models/src/family-config.test.ts
// holds them), each with only `num_hidden_layers` reduced (default 1; PUBLISHED_LAYERS), given a
// random bf16 checkpoint written here (every graph parameter under its Hugging Face name; uniform
// in ±0.02·√3, the configs' initializer_range as a standard deviation; norms 1), loaded by the
// serving `Engine` on cpu-native (2 threads) and served a short greedy completion: an 8-token
// prompt, then 8 decoded tokens. Each model runs in a child process of its own (its f32 weights
// are gigabytes: the vocabularies are 100k–262k rows wide), which reports load time, prefill and
// per-token decode time, the generated ids (every logit must be finite) and the peak RSS.
// Not a test: full-width embeddings do not fit the test budget (Qwen3-8B's untied 151936 × 4096
// embedding and head alone are 5 GB in f32).
//
// Usage: pnpm bench published-configs (PUBLISHED_MODELS=qwen3-8b,olmo2-7b PUBLISHED_LAYERS=2 to
// pick; writes bench/results/published-configs.{json,md}).
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Engine } from '@stageml/engine';
import { graphParams } from '@stageml/ir';
import { argmaxOf, buildLlamaGraph, familyGraphOptions, parseLlamaConfig } from '@stageml/models';
import { createCpuNativeExecutor } from '@stageml/runtime';
import { type RawTensor, f32BitsToBf16, writeSafetensors } from '@stageml/safetensors';
import { GEMMA3_4B, OLMO2_7B, PHI4_MINI, QWEN3_30B_A3B, QWEN3_8B } from '../packages/models/src/published-configs.test-data.js';
import { type BenchCase, writeResults } from './lib/harness.js';

// Published config.json fields, the ones family-config.test.ts parses.
const CONFIGS: Record<string, { readonly name: string; readonly config: Record<string, unknown> }> = {
  'qwen3-8b': { name: 'Qwen3-8B', config: QWEN3_8B },
  'qwen3-30b-a3b': { name: 'Qwen3-30B-A3B', config: QWEN3_30B_A3B },
  'gemma3-4b': { name: 'gemma-3-4b-it (text model)', config: GEMMA3_4B },
  'phi4-mini': { name: 'Phi-4-mini-instruct', config: PHI4_MINI },
  'olmo2-7b': { name: 'OLMo-2-1124-7B', config: OLMO2_7B },
};

const PROMPT = [17, 2025, 311, 4096, 99, 1234, 7, 42];
const NEW_TOKENS = 8;

/** The config with `num_hidden_layers` set to `layers` (Gemma 3's in its text_config). */
function reduced(config: Record<string, unknown>, layers: number): Record<string, unknown> {
  const text = config['text_config'] as Record<string, unknown> | undefined;
  return text === undefined ? { ...config, num_hidden_layers: layers } : { ...config, text_config: { ...text, num_hidden_layers: layers } };
}

/**
 * Writes config.json and a bf16 model.safetensors for `config` into `dir`: one shared block of
 * random bf16 bytes (sized for the largest tensor) viewed by every matrix, norms 1. Returns the
 * parameter count.
 */
async function writeCheckpoint(dir: string, config: Record<string, unknown>): Promise<number> {
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config, null, 2));
  const cfg = parseLlamaConfig(JSON.stringify(config), 'config.json');
  const g = buildLlamaGraph(cfg, familyGraphOptions(cfg));
  const params = graphParams(g).map((p) => ({ name: p.name, shape: g.values[p.results[0]!]!.type.shape as number[] }));
  const count = (s: readonly number[]): number => s.reduce((a, b) => a * b, 1);
  const largest = Math.max(...params.map((p) => count(p.shape)));
  // 1 Mi random values, tiled: the weights only need to be finite and of a plausible scale.
  const block = new Uint16Array(1 << 20);
  let state = 0x9e3779b9;
  const bits = new Uint32Array(1);
  const asFloat = new Float32Array(bits.buffer);
  for (let i = 0; i < block.length; i++) {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    asFloat[0] = (state / 2 ** 32 - 0.5) * 2 * 0.02 * Math.sqrt(3);
    block[i] = f32BitsToBf16(bits[0]!);
  }
  const random = new Uint16Array(largest);
  for (let at = 0; at < largest; at += block.length) random.set(block.subarray(0, Math.min(block.length, largest - at)), at);
  const one = f32BitsToBf16(0x3f800000);
  const tensors = new Map<string, RawTensor>();
  for (const p of params) {
    const n = count(p.shape);
    const data = p.shape.length === 1 ? new Uint16Array(n).fill(one) : random.subarray(0, n);
    tensors.set(p.name, { dtype: 'BF16', shape: p.shape, data: new Uint8Array(data.buffer, data.byteOffset, n * 2) });
  }
  await writeSafetensors(join(dir, 'model.safetensors'), tensors);
  return params.reduce((a, p) => a + count(p.shape), 0);
}

interface ModelResult {
  readonly key: string;
  readonly params: number;
  readonly writeS: number;
  readonly loadS: number;
  readonly prefillMs: number;
  readonly decodeMsPerToken: number;
  readonly ids: number[];
  readonly finite: boolean;
  readonly maxRssGiB: number;
}

/** One model, in this (child) process: write, load, serve; prints its result as one JSON line. */
async function runOne(key: string, layers: number): Promise<void> {
  const spec = CONFIGS[key]!;
  const dir = mkdtempSync(join(tmpdir(), `stageml-published-${key}-`));
  try {
    let t0 = performance.now();
    const params = await writeCheckpoint(dir, reduced(spec.config, layers));
    const writeS = (performance.now() - t0) / 1000;
    t0 = performance.now();
    const engine = await Engine.load(dir, { executor: createCpuNativeExecutor({ threads: 2 }), maxLoras: 1, maxLoraRank: 8 });
    const loadS = (performance.now() - t0) / 1000;
    const seq = engine.open(undefined, PROMPT);
    if (!(await engine.attach(seq))) throw new Error(`${key}: no KV room for an ${String(PROMPT.length)}-token prompt`);
    t0 = performance.now();
    let logits: Float32Array | undefined;
    while (!seq.ready) logits = await engine.prefill(seq);
    const prefillMs = performance.now() - t0;
    let finite = logits!.every(Number.isFinite);
    const ids = [argmaxOf(logits!)];
    t0 = performance.now();
    for (let k = 1; k < NEW_TOKENS; k++) {
      const [next] = await engine.decode([seq], [ids.at(-1)!]);
      finite &&= next!.every(Number.isFinite);
      ids.push(argmaxOf(next!));
    }
    const decodeMsPerToken = (performance.now() - t0) / (NEW_TOKENS - 1);
    engine.release(seq);
    engine.dispose();
    const result: ModelResult = { key, params, writeS, loadS, prefillMs, decodeMsPerToken, ids, finite, maxRssGiB: process.resourceUsage().maxRSS / 2 ** 20 };
    console.log(JSON.stringify(result));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const layers = Number(process.env['PUBLISHED_LAYERS'] ?? 1);
const child = process.argv.indexOf('--model');
if (child >= 0) await runOne(process.argv[child + 1]!, layers);
else {
  const keys = (process.env['PUBLISHED_MODELS'] ?? Object.keys(CONFIGS).join(',')).split(',');
  const cases: BenchCase[] = [];
  const notes: string[] = [
    'The random weights tile one block of 2^20 values, so embedding and head rows repeat every 2^20 / hidden rows: the greedy ids (small, often repeated) only show that every step ran and its logits were finite.',
    '',
  ];
  for (const key of keys) {
    if (CONFIGS[key] === undefined) throw new Error(`unknown model '${key}' (known: ${Object.keys(CONFIGS).join(', ')})`);
    const load = loadavg()[0]!.toFixed(1);
    const r = spawnSync(process.execPath, ['--conditions=@stageml/source', '--import', 'tsx', fileURLToPath(import.meta.url), '--model', key], { encoding: 'utf8', env: process.env, maxBuffer: 1 << 24 });
    const line = r.stdout.trim().split('\n').at(-1) ?? '';
    if (r.status !== 0 || !line.startsWith('{')) {
      notes.push(`- ${CONFIGS[key].name}: FAILED (exit ${String(r.status)}): ${(r.stderr || r.stdout).trim().split('\n').slice(-3).join(' / ')}`);
      continue;
    }
    const m = JSON.parse(line) as ModelResult;
    const name = `${CONFIGS[key].name}, ${String(layers)} layer${layers === 1 ? '' : 's'}`;
    const extra = { params: m.params, loadS: Number(m.loadS.toFixed(1)), writeS: Number(m.writeS.toFixed(1)), maxRssGiB: Number(m.maxRssGiB.toFixed(2)), ids: m.ids.join(' '), finite: String(m.finite), loadAverage: load };
    cases.push({ name: `${name}: prefill ${String(PROMPT.length)} tokens`, medianMs: m.prefillMs, runs: 1, extra });
    cases.push({ name: `${name}: decode, per token`, medianMs: m.decodeMsPerToken, runs: NEW_TOKENS - 1, extra });
    notes.push(`- ${name}: ${(m.params / 1e9).toFixed(2)}B parameters, loaded in ${m.loadS.toFixed(1)} s (checkpoint written in ${m.writeS.toFixed(1)} s), peak RSS ${m.maxRssGiB.toFixed(2)} GiB, greedy ids ${m.ids.join(' ')}, logits finite: ${String(m.finite)} (load average ${load})`);
    if (!m.finite) process.exitCode = 1;
  }
  mkdirSync(join(fileURLToPath(new URL('.', import.meta.url)), 'results'), { recursive: true });
  writeResults(
    'published-configs',
    `Published config.json fields of five families at reduced depth (${String(layers)} layer${layers === 1 ? '' : 's'}), random bf16 checkpoints, loaded by the Engine on cpu-native (2 threads) and served ${String(NEW_TOKENS)} greedy tokens after an ${String(PROMPT.length)}-token prompt; one child process per model. Times are single runs on a shared machine: they show the models load and serve, not speed.`,
    cases,
    notes,
  );
  if (notes.some((n) => n.includes('FAILED'))) process.exitCode = 1;
}
