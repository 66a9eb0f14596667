// The weights the llama.cpp comparisons run on (bench/llamacpp.ts in one process, bench/server-llamacpp.ts
// through the HTTP server): a random-weight Llama-family checkpoint of a given shape, 8 PEFT LoRA
// adapters (rank 16, all 7 projections) and the same weights as GGUF files for llama.cpp, written
// by @stageml/models' `writeLlamaGguf` / `writeLoraGguf`.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { type HostTensor, graphParams } from '@stageml/ir';
import { type GgmlTypeName, buildLlamaGraph, parseLlamaConfig, writeLlamaGguf, writeLoraGguf } from '@stageml/models';
import { writeSafetensors } from '@stageml/safetensors';
import type { RooflineShape } from './roofline.js';

/** A Llama-family model shape (widths, heads, vocabulary), as the checkpoint writer needs it. */
export interface ModelShape {
  readonly key: string;
  readonly name: string;
  readonly layers: number;
  readonly hidden: number;
  readonly inter: number;
  readonly heads: number;
  readonly kv: number;
  readonly vocab: number;
  readonly tied: boolean;
  /** `qwen3`: Qwen3's config (per-head q/k norms, `head_dim`, rope θ 1e6; llama.cpp's `qwen3` architecture); default `llama`. */
  readonly family?: 'llama' | 'qwen3';
  /** Per-head width when it is not hidden / heads (Qwen3: 128). */
  readonly headDim?: number;
}

/**
 * Precision pairs: our weight format (`--quantize`; undefined = f32) and the GGUF type llama.cpp
 * reads, with the bytes a weight takes in each (ours: block-32 codes + an f32 scale; GGUF's
 * Q8_0 / Q4_0: block-32 codes + an f16 scale).
 */
export const PAIRS = [
  { key: 'f32', ours: undefined, gguf: 'F32', oursBytes: 4, ggufBytes: 4 },
  { key: 'int8', ours: 'int8', gguf: 'Q8_0', oursBytes: 36 / 32, ggufBytes: 34 / 32 },
  { key: 'int4', ours: 'int4', gguf: 'Q4_0', oursBytes: 20 / 32, ggufBytes: 18 / 32 },
] as const satisfies readonly { key: string; ours: string | undefined; gguf: GgmlTypeName; oursBytes: number; ggufBytes: number }[];

/** One of `PAIRS`. */
export type Pair = (typeof PAIRS)[number];

/** Rank of every adapter. */
export const RANK = 16;
/** `lora_alpha` of every adapter. */
export const ALPHA = 32;
/** Adapters written per checkpoint (`a0` … `a7`). */
export const ADAPTERS = 8;
/** The projections every adapter targets. */
export const PROJ = ['self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj', 'self_attn.o_proj', 'mlp.gate_proj', 'mlp.up_proj', 'mlp.down_proj'];
/** The adapters' names, which are also their directory names under `<dir>/adapters`. */
export const ADAPTER_NAMES: readonly string[] = Array.from({ length: ADAPTERS }, (_, k) => `a${String(k)}`);

/** Uniform in [−a, a) from a 32-bit LCG (deterministic, fast). */
export function uniform(n: number, seed: number, a: number): Float32Array {
  const out = new Float32Array(n);
  let s = (seed * 2654435761) >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = ((s / 4294967296) * 2 - 1) * a;
  }
  return out;
}

/** Creates `p` (and its parents) if missing; returns it. */
export function mkdir(p: string): string {
  mkdirSync(p, { recursive: true });
  return p;
}

/** The Hugging Face `config.json` of a shape. */
export function configOf(s: ModelShape): Record<string, unknown> {
  const qwen3 = s.family === 'qwen3';
  return {
    architectures: [qwen3 ? 'Qwen3ForCausalLM' : 'LlamaForCausalLM'],
    model_type: qwen3 ? 'qwen3' : 'llama',
    vocab_size: s.vocab,
    hidden_size: s.hidden,
    intermediate_size: s.inter,
    num_hidden_layers: s.layers,
    num_attention_heads: s.heads,
    num_key_value_heads: s.kv,
    rms_norm_eps: qwen3 ? 1e-6 : 1e-5,
    rope_theta: qwen3 ? 1000000 : 10000,
    max_position_embeddings: 2048,
    tie_word_embeddings: s.tied,
    bos_token_id: 1,
    eos_token_id: 2,
    ...(s.headDim === undefined ? {} : { head_dim: s.headDim }),
  };
}

/** Writes config.json + model.safetensors and the 8 PEFT adapters under `dir/adapters`; returns the weights. */
export async function makeCheckpoint(s: ModelShape, dir: string): Promise<Map<string, HostTensor>> {
  const cfg = configOf(s);
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
  // The graph of the config as the engine reads it (Qwen3's q/k norms are parameters too).
  const g = buildLlamaGraph(parseLlamaConfig(JSON.stringify(cfg)));
  const w = new Map<string, HostTensor>();
  graphParams(g).forEach((p, i) => {
    const shape = g.values[p.results[0]!]!.type.shape as number[];
    const n = shape.reduce((a, b) => a * b, 1);
    // Unit-gain projections, unit-scale embeddings: peaked logits, so greedy choices are stable.
    const a = p.name.includes('norm') ? 0 : p.name === 'model.embed_tokens.weight' ? Math.sqrt(3) : p.name === 'lm_head.weight' ? 0.35 : Math.sqrt(3 / shape[1]!);
    w.set(p.name, { dtype: 'f32', shape, data: a === 0 ? new Float32Array(n).fill(1) : uniform(n, i + 1, a) });
  });
  await writeSafetensors(join(dir, 'model.safetensors'), Object.fromEntries(w));
  for (const [k, name] of ADAPTER_NAMES.entries()) {
    const ad = mkdir(join(dir, 'adapters', name));
    writeFileSync(join(ad, 'adapter_config.json'), JSON.stringify({ peft_type: 'LORA', r: RANK, lora_alpha: ALPHA, target_modules: PROJ.map((p) => p.split('.')[1]), bias: 'none', use_rslora: false, use_dora: false, fan_in_fan_out: false }));
    const t: Record<string, HostTensor> = {};
    for (let l = 0; l < s.layers; l++) {
      for (const [j, p] of PROJ.entries()) {
        const wt = w.get(`model.layers.${String(l)}.${p}.weight`)!;
        const [out, inF] = wt.shape as [number, number];
        const key = `base_model.model.model.layers.${String(l)}.${p}`;
        const seed = 1000 + k * 1000 + l * 10 + j;
        t[`${key}.lora_A.weight`] = { dtype: 'f32', shape: [RANK, inF], data: uniform(RANK * inF, seed, Math.sqrt(3 / inF)) };
        t[`${key}.lora_B.weight`] = { dtype: 'f32', shape: [out, RANK], data: uniform(out * RANK, seed + 7, 0.02) };
      }
    }
    await writeSafetensors(join(ad, 'adapter_model.safetensors'), t);
  }
  return w;
}

/** The GGUF file of the base weights at `gguf` (`F32`, `Q8_0`, `Q4_0`) under `dir`. */
export const ggufModelPath = (dir: string, gguf: string): string => join(dir, `model-${gguf}.gguf`);
/** The GGUF LoRA file of adapter `name` under `dir`. */
export const ggufLoraPath = (dir: string, name: string): string => join(dir, `lora-${name}.gguf`);

/** Writes the base weights `w` as one GGUF file per type in `types`, and each adapter of `dir/adapters` as a GGUF LoRA. */
export async function makeGguf(s: ModelShape, dir: string, w: ReadonlyMap<string, HostTensor>, types: readonly GgmlTypeName[]): Promise<void> {
  const config = parseLlamaConfig(readFileSync(join(dir, 'config.json'), 'utf8'));
  for (const type of types) await writeLlamaGguf(ggufModelPath(dir, type), config, w, { type, name: s.name });
  const { loadLoraAdapter } = await import('@stageml/peft');
  for (const name of ADAPTER_NAMES) {
    const a = await loadLoraAdapter(join(dir, 'adapters', name), { name });
    await writeLoraGguf(ggufLoraPath(dir, name), config, ALPHA, [...a.modules.values()].map((m) => ({ module: m.module, A: m.A, B: m.B })));
  }
}

/** The median of `xs` (non-empty). */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 === 1 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/** `n` deterministic prompts of `len` token ids in [3, vocab). */
export function prompts(vocab: number, n: number, len: number, seed: number): number[][] {
  return Array.from({ length: n }, (_, r) => Array.from({ length: len }, (_, i) => 3 + ((seed * 7919 + r * 104729 + i * 15485863) % (vocab - 3))));
}

/** The shape as lib/roofline.ts counts its bytes. */
export function rooflineShapeOf(s: ModelShape): RooflineShape {
  return { layers: s.layers, hidden: s.hidden, intermediate: s.inter, heads: s.heads, kvHeads: s.kv, ...(s.headDim === undefined ? {} : { headDim: s.headDim }), vocab: s.vocab };
}
