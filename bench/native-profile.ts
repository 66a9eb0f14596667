// Suite `native-profile`: where the cpu-native runner spends a 128-token prefill, instruction by
// instruction (the addon's `profile`), on the Qwen3 shape of `bench/llamacpp` (Qwen3-0.6B's widths
// at 8 layers: hidden 1024, intermediate 3072, 16/8 heads of head_dim 128, per-head q/k RMSNorm,
// vocab 151936 tied) and, to tell Qwen3's own costs from its widths', a Llama shape with the same
// hidden and MLP widths but head_dim 64 (16/8 heads of 64, no q/k norms). The engine and prefill
// runs are those of `bench/llamacpp` (one run of up to 512 tokens, nothing decoding); 2 threads.
// Each GEMM entry carries its multiply-adds per second, so a shape the kernels tile badly shows.
//
// Usage: pnpm bench native-profile (PROFILE_QUANT=int8|int4|f32, default int8; PROFILE_REPS=5).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Engine } from '@stageml/engine';
import { type HostTensor, graphParams, seededRandom } from '@stageml/ir';
import { buildLlamaGraph, familyGraphOptions, parseLlamaConfig } from '@stageml/models';
import { createCpuNativeExecutor, loadCpuAddon, parseWeightQuantSpec } from '@stageml/runtime';
import { writeSafetensors } from '@stageml/safetensors';
import { type BenchCase, writeResults } from './lib/harness.js';

const QUANT = process.env['PROFILE_QUANT'] ?? 'int8';
const REPS = Number(process.env['PROFILE_REPS'] ?? 5);
const PREFILL = 128;

const SHAPES = {
  qwen3: { model_type: 'qwen3', architectures: ['Qwen3ForCausalLM'], head_dim: 128, num_attention_heads: 16, num_key_value_heads: 8, rms_norm_eps: 1e-6, rope_theta: 1000000 },
  'llama-hd64': { model_type: 'llama', architectures: ['LlamaForCausalLM'], head_dim: 64, num_attention_heads: 16, num_key_value_heads: 8, rms_norm_eps: 1e-5, rope_theta: 10000 },
} as const;

async function checkpoint(dir: string, fields: Record<string, unknown>): Promise<void> {
  const config = { ...fields, vocab_size: 151936, hidden_size: 1024, intermediate_size: 3072, num_hidden_layers: 8, max_position_embeddings: 2048, tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2 };
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
  const cfg = parseLlamaConfig(JSON.stringify(config));
  const g = buildLlamaGraph(cfg, familyGraphOptions(cfg));
  const rnd = seededRandom(3);
  const tensors: Record<string, HostTensor> = {};
  for (const p of graphParams(g)) {
    const shape = g.values[p.results[0]!]!.type.shape as number[];
    const n = shape.reduce((a, b) => a * b, 1);
    const scale = p.name.includes('norm') ? 0 : Math.sqrt(3 / shape[shape.length - 1]!);
    const data = new Float32Array(n);
    if (scale === 0) data.fill(1);
    else for (let i = 0; i < n; i++) data[i] = (rnd() * 2 - 1) * scale;
    tensors[p.name] = { dtype: 'f32', shape, data };
  }
  await writeSafetensors(join(dir, 'model.safetensors'), tensors);
}

/** `kind [rows, in] -> [rows, out]` → multiply-adds of one run, for the GEMM entries. */
function macs(key: string): number | undefined {
  const m = /^(?:q?linear|lora_linear) \[([\d, ]+)\] -> \[([\d, ]+)\]/.exec(key);
  if (m === null) return undefined;
  const a = m[1]!.split(',').map(Number);
  const y = m[2]!.split(',').map(Number);
  return (a.reduce((p, d) => p * d, 1) * y.at(-1)!);
}

const addon = loadCpuAddon();
if (addon.profile === undefined) throw new Error('the loaded cpu-native addon has no profile() (an older build)');
const cases: BenchCase[] = [];
const notes: string[] = [`Load average at start: ${loadavg().map((l) => l.toFixed(1)).join(' ')} (a shared 2-core machine: compare shares within a shape, not times across runs).`, ''];
for (const [key, fields] of Object.entries(SHAPES)) {
  const dir = mkdtempSync(join(tmpdir(), `stageml-profile-${key}-`));
  try {
    await checkpoint(dir, fields);
    const engine = await Engine.load(dir, { executor: createCpuNativeExecutor({ threads: 2 }), maxLoras: 8, maxLoraRank: 16, ...(QUANT === 'f32' ? {} : { quantize: parseWeightQuantSpec(QUANT) }) });
    const prompt = Array.from({ length: PREFILL }, (_, i) => (i * 7919) % 151936);
    const prefill = async (): Promise<number> => {
      const seq = engine.open(undefined, prompt);
      await engine.attach(seq);
      const t0 = performance.now();
      while (!seq.ready) await engine.prefill(seq, { maxChunk: 512 });
      const ms = performance.now() - t0;
      engine.release(seq);
      return ms;
    };
    await prefill();
    addon.profile(true);
    const times: number[] = [];
    for (let r = 0; r < REPS; r++) times.push(await prefill());
    const stats = JSON.parse(addon.profile(false)) as Record<string, [number, number]>;
    engine.dispose();
    times.sort((a, b) => a - b);
    const median = times[times.length >> 1]!;
    const total = Object.values(stats).reduce((s, [, ns]) => s + ns, 0);
    cases.push({ name: `${key} ${QUANT}: prefill ${String(PREFILL)}`, medianMs: median, runs: REPS, extra: { tokensPerS: Math.round((PREFILL / median) * 1000) } });
    notes.push(`### ${key} (${QUANT}): prefill ${String(PREFILL)} tokens, median ${median.toFixed(1)} ms (${String(Math.round((PREFILL / median) * 1000))} tok/s); instructions ${(total / 1e6 / REPS).toFixed(1)} ms a prefill`, '', '| instruction | runs / prefill | ms / prefill | share | GMAC/s |', '| --- | ---: | ---: | ---: | ---: |');
    for (const [k, [runs, ns]] of Object.entries(stats).sort((a, b) => b[1][1] - a[1][1])) {
      if (ns / total < 0.003) continue;
      const mac = macs(k);
      notes.push(`| ${k} | ${String(runs / REPS)} | ${(ns / 1e6 / REPS).toFixed(2)} | ${((100 * ns) / total).toFixed(1)} % | ${mac === undefined ? '—' : ((mac * runs) / ns).toFixed(1)} |`);
    }
    notes.push('');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
writeResults('native-profile', `cpu-native instruction profile of a ${String(PREFILL)}-token prefill (the engine's base program, ${QUANT}, 2 threads) on the Qwen3 shape of bench/llamacpp and a Llama shape of the same widths with head_dim 64. Medians of ${String(REPS)} prefills.`, cases, notes);
