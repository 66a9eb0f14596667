// `pnpm bench host-step`: what Node and the scheduler add to each step (issue 41). The reference
// server (bench/lib/host-step-server.ts: createServer, its engine and scheduler, in a process of
// its own) serves a Llama-3.2-1B-shaped bf16 model (vocab 128,256, 16 layers; a sparse checkpoint:
// the worker never reads it) through the torch executor, whose worker is a stub speaking the real
// protocol that answers each run at once with one token per row (bench/lib/torch-stub). Clients
// stream SSE completions at 1 / 8 / 64 concurrent streams, on the base model and on 64 adapters
// (one per stream), 128-token prompts, 128 new tokens, greedy, ignore_eos. Per step: wall ms
// (from the first to the last token, over the steps taken meanwhile) and its split: scheduling,
// the engine's input building, the executor's round trip (of which the stub's own time), readback,
// token emission (pickers, detokenizing, SSE writes) and the event loop between steps. With
// `--kernel-ms K` the stub sleeps K ms per run (a device's step time): the host's part then shows
// as wall − K (results then in bench/results/host-step-kernel.{json,md}). Options: `--streams 1,8,64`, `--tokens 128`, `--layers 16`, `--no-adapters`,
// `--cpu-prof` (a .cpuprofile of the server process under $TMPDIR/stageml-host-step-prof/).
import { spawn } from 'node:child_process';
import { cpSync, mkdtempSync, mkdirSync, openSync, closeSync, rmSync, writeSync, ftruncateSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeRandomAdapter } from '@stageml/engine';
import { graphParams } from '@stageml/ir';
import { type LlamaShape, buildLlamaGraph } from '@stageml/models';
import { type BenchCase, writeResults } from './lib/harness.js';

const argv = process.argv.slice(2);
const flag = (name: string): string | undefined => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : undefined;
};
const STREAMS = (flag('streams') ?? '1,8,64').split(',').map(Number);
const TOKENS = Number(flag('tokens') ?? 128);
const PROMPT = 128;
const KERNEL_MS = Number(flag('kernel-ms') ?? 0);
const ADAPTERS = argv.includes('--no-adapters') ? 0 : Math.max(...STREAMS);
const PROFILE = argv.includes('--cpu-prof');
/** Tokens the stub picks from (the fixture tokenizer's vocabulary), so every token detokenizes. */
const TOKENIZER_VOCAB = 512;
const shape: LlamaShape & { maxPositions: number } = {
  vocabSize: 128_256,
  hiddenSize: 2048,
  intermediateSize: 8192,
  numLayers: Number(flag('layers') ?? 16),
  numHeads: 32,
  numKvHeads: 8,
  headDim: 64,
  maxPositions: 4096,
};

/** A checkpoint of `shape`'s parameter names and shapes whose data is a hole (a sparse file). */
function writeSparseLlama(dir: string): void {
  mkdirSync(dir, { recursive: true });
  const graph = buildLlamaGraph(shape);
  const header: Record<string, unknown> = {};
  let at = 0;
  for (const p of graphParams(graph)) {
    const s = graph.values[p.results[0]!]!.type.shape as number[];
    const bytes = s.reduce((a, b) => a * b, 1) * 2;
    header[p.name] = { dtype: 'BF16', shape: s, data_offsets: [at, at + bytes] };
    at += bytes;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - ((json.length + 8) % 8)) % 8);
  const head = Buffer.alloc(8 + json.length);
  head.writeBigUInt64LE(BigInt(json.length), 0);
  head.write(json, 8, 'utf8');
  const fd = openSync(join(dir, 'model.safetensors'), 'w');
  writeSync(fd, head);
  ftruncateSync(fd, head.length + at);
  closeSync(fd);
  writeFileSync(join(dir, 'config.json'), JSON.stringify({
    architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: shape.hiddenSize, intermediate_size: shape.intermediateSize,
    num_hidden_layers: shape.numLayers, num_attention_heads: shape.numHeads, num_key_value_heads: shape.numKvHeads, head_dim: shape.headDim,
    vocab_size: shape.vocabSize, rms_norm_eps: 1e-5, rope_theta: 500000, tie_word_embeddings: false, max_position_embeddings: shape.maxPositions,
    bos_token_id: 1, eos_token_id: 2, torch_dtype: 'bfloat16',
  }));
  cpSync(new URL('../fixtures/peft-tiny/llama/base/tokenizer.json', import.meta.url), join(dir, 'tokenizer.json'));
}

interface Stats {
  cpuMs: number;
  scheduler: { steps: number; mergedSteps: number; engineRuns: number; hostMs: Record<string, number> };
  engine: { steps: number; runs: number; inputsMs: number; runMs: number; readbackMs: number };
  worker: Record<string, number>;
  traffic: { requests: number; sentBytes: number; receivedBytes: number };
}

/** One streamed completion: resolves to the arrival times of its token events. */
async function stream(base: string, model: string, seed: number): Promise<number[]> {
  const prompt = Array.from({ length: PROMPT }, (_, j) => 3 + ((seed * 131 + j * 17) % (TOKENIZER_VOCAB - 3)));
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, prompt, max_tokens: TOKENS, temperature: 0, ignore_eos: true, stream: true, return_token_ids: true }),
  });
  if (res.status !== 200 || res.body === null) throw new Error(`HTTP ${String(res.status)}: ${await res.text()}`);
  const times: number[] = [];
  const decoder = new TextDecoder();
  let buf = '';
  let tokens = 0;
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk as Uint8Array, { stream: true });
    let i: number;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
      const ids = (JSON.parse(event.slice(6)) as { choices: { token_ids?: number[] }[] }).choices[0]?.token_ids ?? [];
      const now = performance.now();
      times.push(...ids.map(() => now));
      tokens += ids.length;
    }
  }
  if (tokens !== TOKENS) throw new Error(`a stream got ${String(tokens)} tokens, not ${String(TOKENS)}`);
  return times;
}

const dir = mkdtempSync(join(tmpdir(), 'stageml-bench-host-step-'));
const loadBefore = loadavg()[0]!;
let child: ReturnType<typeof spawn> | undefined;
try {
  const model = join(dir, 'model');
  writeSparseLlama(model);
  const adaptersDir = join(dir, 'adapters');
  for (let a = 0; a < ADAPTERS; a++) await writeRandomAdapter(join(adaptersDir, `a${String(a)}`), shape, { rank: 8, targets: ['q_proj', 'v_proj'], seed: a + 1 });
  const profDir = join(tmpdir(), 'stageml-host-step-prof');
  if (PROFILE) mkdirSync(profDir, { recursive: true });
  child = spawn(process.execPath, ['--conditions=@stageml/source', '--import', 'tsx', ...(PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${profDir}`] : []), 'bench/lib/host-step-server.ts'], {
    env: { ...process.env, STAGEML_BENCH_HOST_STEP: JSON.stringify({ modelDir: model, ...(ADAPTERS > 0 ? { adaptersDir } : {}), maxLoras: Math.max(1, ADAPTERS), maxLoraRank: 8, kernelMs: KERNEL_MS, vocab: TOKENIZER_VOCAB }) },
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const base = await new Promise<string>((resolve, reject) => {
    let out = '';
    child!.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /listening (\S+)/.exec(out);
      if (m !== null) resolve(m[1]!);
    });
    child!.on('exit', (code) => {
      reject(new Error(`the server exited (${String(code)}) before listening`));
    });
  });
  const stats = async (): Promise<Stats> => (await (await fetch(`${base}/bench/host-step`)).json()) as Stats;
  // Warm-up: every program's first runs.
  await Promise.all([stream(base, 'llama', 0), ...(ADAPTERS > 0 ? [stream(base, 'a0', 1)] : [])]);
  const cases: BenchCase[] = [];
  for (const adapters of ADAPTERS > 0 ? [false, true] : [false]) {
    for (const n of STREAMS) {
      const before = await stats();
      const t0 = performance.now();
      const all = await Promise.all(Array.from({ length: n }, (_, i) => stream(base, adapters ? `a${String(i % ADAPTERS)}` : 'llama', i + 2)));
      const wall = performance.now() - t0;
      const after = await stats();
      const d = (f: (s: Stats) => number): number => f(after) - f(before);
      const steps = d((s) => s.scheduler.steps);
      const first = Math.max(...all.map((t) => t[0]!));
      const last = Math.max(...all.map((t) => t[t.length - 1]!));
      // Decode steps between the last stream's first token and the last token: the steady state.
      const itl = all.flatMap((t) => t.slice(1).map((x, k) => x - t[k]!)).sort((a, b) => a - b);
      const perStep = (k: string): number => d((s) => s.scheduler.hostMs[k] ?? 0) / steps;
      const stepMs = (perStep('schedule') + perStep('engine') + perStep('emit') + perStep('yield'));
      const runMs = d((s) => s.engine.runMs) / steps;
      const stubMs = d((s) => s.worker['stubMs'] ?? 0) / steps;
      cases.push({
        name: `${String(n)} stream${n === 1 ? '' : 's'}, ${adapters ? `${String(Math.min(n, ADAPTERS))} adapters` : 'base'}${KERNEL_MS > 0 ? `, kernel ${String(KERNEL_MS)} ms` : ''}`,
        medianMs: stepMs,
        runs: steps,
        extra: {
          wallMs: Math.round(wall),
          tokensPerSecond: Math.round((n * TOKENS) / (wall / 1000)),
          decodeMsPerStep: Number(((last - first) / Math.max(1, TOKENS - 1)).toFixed(3)),
          itlP50Ms: Number(itl[itl.length >> 1]!.toFixed(3)),
          scheduleMs: Number(perStep('schedule').toFixed(3)),
          inputsMs: Number((d((s) => s.engine.inputsMs) / steps).toFixed(3)),
          roundTripMs: Number(runMs.toFixed(3)),
          stubMs: Number(stubMs.toFixed(3)),
          nodeCpuMsPerStep: Number((d((s) => s.cpuMs) / steps).toFixed(3)),
          stubCpuMsPerStep: Number((d((s) => s.worker['stubCpuMs'] ?? 0) / steps).toFixed(3)),
          readbackMs: Number((d((s) => s.engine.readbackMs) / steps).toFixed(3)),
          emitMs: Number(perStep('emit').toFixed(3)),
          yieldMs: Number(perStep('yield').toFixed(3)),
          runsPerStep: Number((d((s) => s.engine.runs) / steps).toFixed(2)),
          sentBytesPerStep: Math.round(d((s) => s.traffic.sentBytes) / steps),
          receivedBytesPerStep: Math.round(d((s) => s.traffic.receivedBytes) / steps),
        },
      });
      console.log(JSON.stringify(cases[cases.length - 1]));
    }
  }
  writeResults(
    KERNEL_MS > 0 ? 'host-step-kernel' : 'host-step',
    `Host time per step of the reference server (issue 41): stageml serve's path (createServer → Scheduler → Engine.step → torch executor → worker protocol) with a stub worker that answers each run at once${KERNEL_MS > 0 ? ` after ${String(KERNEL_MS)} ms` : ''}; Llama-3.2-1B shape bf16 (vocab 128,256, ${String(shape.numLayers)} layers), ${String(PROMPT)}-token prompts, ${String(TOKENS)} new tokens per SSE stream, greedy. "median ms" is the step loop's ms per step (schedule + engine + emit + yield); the split is in the JSON's extra (per step).`,
    cases,
    [
      '| case | ms/step | schedule | inputs | round trip (stub) | readback | emit (detok+SSE) | yield | server CPU ms/step | stub CPU ms/step | decode ms/step seen by clients | tok/s |',
      '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
      ...cases.map((c) => {
        const e = c.extra!;
        return `| ${c.name} | ${c.medianMs.toFixed(3)} | ${String(e['scheduleMs'])} | ${String(e['inputsMs'])} | ${String(e['roundTripMs'])} (${String(e['stubMs'])}) | ${String(e['readbackMs'])} | ${String(e['emitMs'])} | ${String(e['yieldMs'])} | ${String(e['nodeCpuMsPerStep'])} | ${String(e['stubCpuMsPerStep'])} | ${String(e['decodeMsPerStep'])} | ${String(e['tokensPerSecond'])} |`;
      }),
      '',
      `Load average ${loadBefore.toFixed(1)} before, ${loadavg()[0]!.toFixed(1)} after (2 shared cores: compare cases of one run).`,
    ],
  );
} finally {
  child?.kill('SIGTERM');
  rmSync(dir, { recursive: true, force: true });
}
