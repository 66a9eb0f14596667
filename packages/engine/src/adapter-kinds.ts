import type { HostTensor } from '@stageml/ir';
import { readParam } from '@stageml/models';
import type { LoraAdapter, LoraModule } from '@stageml/peft';
import { openCheckpoint } from '@stageml/safetensors';

/**
 * The PEFT adapter kinds the engine serves, and where each one's data lives. One table: the
 * engine's validation, its slot writes and the docs read it.
 *
 * - `lora`: the factors A, B of a module (slot tables `slots.<m>.A`, `.B`, scale folded into B);
 * - `lora_bias`: `lora_B`'s bias b, added with the delta as PEFT does (s·b) — the per-slot output
 *   table `slots.<m>.C` [N, out];
 * - `dora`: the magnitude m; the column norm ‖W + s·B·A‖ depends on base and adapter only, so it
 *   is computed once when the slot is written and the run applies a per-slot per-output-channel
 *   scale m/‖W + s·B·A‖ (stored minus 1, so free slots stay zero) — `slots.<m>.S` [N, out];
 * - `target_parameters` (MoE experts): per-expert factors in the expert slot tables;
 * - `target_parameters` (MoE router, `mlp.gate.weight`): the router is a linear, its factors a
 *   module's (`routerAsModules`) — slot tables `slots.<layer>.mlp.gate.A`, `.B`, like `lora`;
 * - `trainable_tokens`: embedding rows replaced (a tied head's rows too) — a lane whose embedding
 *   input holds the replaced rows;
 * - `modules_to_save`: whole tensors replaced (a tied model's `lm_head` included) — a lane.
 *
 * Slot kinds mix row by row in one batch; lane kinds run in batches of their own on the same
 * programs, which the engine forms itself (a mixed call still returns every row's result).
 */
export const ADAPTER_KINDS = {
  lora: { field: 'target_modules', where: 'slot' },
  lora_bias: { field: 'lora_bias', where: 'slot' },
  dora: { field: 'use_dora', where: 'slot' },
  target_parameters: { field: 'target_parameters', where: 'slot' },
  router_parameters: { field: 'target_parameters', where: 'slot' },
  trainable_tokens: { field: 'trainable_token_indices', where: 'lane' },
  modules_to_save: { field: 'modules_to_save', where: 'lane' },
} as const;

/** What a module writes into its slot's output tables (undefined: leaves them zero). */
export interface SlotOut {
  /** DoRA: m / ‖W + s·B·A‖_row − 1 per output channel. */
  readonly scale?: Float32Array;
  /** LoRA bias: s · b per output channel. */
  readonly bias?: Float32Array;
}

const f32 = (d: HostTensor['data']): Float32Array => (d instanceof Float32Array ? d : Float32Array.from(d as ArrayLike<number>));

/**
 * DoRA's per-output-channel scale of `m` on base weight `w` ([out, in], or [in, out] with
 * `fanInFanOut`), minus 1: m[o] / ‖W[o,:] + s·B[o,:]·A‖ − 1, in f64 (PEFT: `DoraLinearLayer`,
 * the norm detached, as at inference).
 */
export function doraScale(w: HostTensor, m: LoraModule, fanInFanOut = false): Float32Array {
  const [out, inDim] = fanInFanOut ? [w.shape[1]!, w.shape[0]!] : [w.shape[0]!, w.shape[1]!];
  const W = f32(w.data);
  const A = f32(m.A.data);
  const B = f32(m.B.data);
  const mag = f32(m.magnitude!.data);
  const r = m.rank;
  const s = new Float32Array(out);
  const row = new Float64Array(inDim);
  for (let o = 0; o < out; o++) {
    for (let i = 0; i < inDim; i++) row[i] = fanInFanOut ? W[i * out + o]! : W[o * inDim + i]!;
    for (let j = 0; j < r; j++) {
      const b = m.scale * B[o * r + j]!;
      if (b === 0) continue;
      for (let i = 0; i < inDim; i++) row[i]! += b * A[j * inDim + i]!;
    }
    let n = 0;
    for (let i = 0; i < inDim; i++) n += row[i]! * row[i]!;
    s[o] = mag[o]! / Math.sqrt(n) - 1;
  }
  return s;
}

/** s · b of a module's LoRA bias. */
export function scaledBias(m: LoraModule): Float32Array {
  const b = f32(m.biasB!.data);
  return b.map((v) => m.scale * v);
}

/**
 * The output-table rows of every module of `adapter` that has any (`lora_bias`, DoRA), computed
 * from base weights `weightOf(<module>.weight)` (DoRA needs them; undefined: refused earlier).
 */
export function slotOuts(adapter: LoraAdapter, weightOf: (param: string) => HostTensor | undefined): Map<string, SlotOut> {
  const out = new Map<string, SlotOut>();
  for (const m of adapter.modules.values()) {
    if (m.biasB === undefined && m.magnitude === undefined) continue;
    const w = m.magnitude === undefined ? undefined : weightOf(`${m.module}.weight`);
    out.set(m.module, {
      ...(m.biasB === undefined ? {} : { bias: scaledBias(m) }),
      // The engine's base weights are [out, in] (HF linears).
      ...(w === undefined ? {} : { scale: doraScale(w, m) }),
    });
  }
  return out;
}

/**
 * A DoRA module's base weight merged with its adapter, as the module computes it:
 * diag(m/‖W + s·B·A‖)·(W + s·B·A) (what a plan's merged lane holds; a LoRA bias is never merged,
 * it stays in the slot's output table).
 */
export function mergedModule(w: HostTensor, m: LoraModule): HostTensor {
  const [out, inDim] = w.shape as [number, number];
  const data = Float32Array.from(w.data as ArrayLike<number>);
  const A = f32(m.A.data);
  const B = f32(m.B.data);
  const s = m.magnitude === undefined ? undefined : doraScale(w, m);
  for (let o = 0; o < out; o++) {
    for (let j = 0; j < m.rank; j++) {
      const b = m.scale * B[o * m.rank + j]!;
      if (b === 0) continue;
      for (let i = 0; i < inDim; i++) data[o * inDim + i]! += b * A[j * inDim + i]!;
    }
    if (s !== undefined) for (let i = 0; i < inDim; i++) data[o * inDim + i]! *= 1 + s[o]!;
  }
  return { dtype: 'f32', shape: w.shape, data };
}

/**
 * The lane weights of an adapter's trainable tokens: the embedding (`weights`' own) with the
 * adapter's rows in place, and on a model whose head reads `lm_head.weight` fed the embedding's
 * tensor (tied), the head the same — PEFT ties the head's token adapter to the embedding's.
 */
export function laneTokenWeights(adapter: LoraAdapter, weights: Readonly<Record<string, HostTensor>>): Map<string, HostTensor> {
  const out = new Map<string, HostTensor>();
  if (adapter.tokenRows.length === 0) return out;
  const key = 'model.embed_tokens.weight';
  const E = weights[key]!;
  const H = E.shape[1]!;
  const data = Float32Array.from(E.data as ArrayLike<number>);
  for (const t of adapter.tokenRows) {
    const rows = f32(t.rows.data);
    t.indices.forEach((id, k) => { data.set(rows.subarray(k * H, (k + 1) * H), id * H); });
  }
  const replaced: HostTensor = { dtype: 'f32', shape: E.shape, data };
  out.set(key, replaced);
  if (weights['lm_head.weight'] === E) out.set('lm_head.weight', replaced);
  return out;
}

/**
 * Reads what `slotOuts` needs and computes it: the base weights of the adapter's DoRA modules from
 * the checkpoint in `dir` (f32, as PEFT computes the norm), `shapeOf` giving each one's shape.
 */
export async function loadSlotOuts(dir: string, adapter: LoraAdapter, shapeOf: (param: string) => readonly number[] | undefined): Promise<Map<string, SlotOut>> {
  const dora = [...adapter.modules.values()].filter((m) => m.magnitude !== undefined);
  const weights = new Map<string, HostTensor>();
  if (dora.length > 0) {
    const ckpt = await openCheckpoint(dir);
    try {
      for (const m of dora) {
        const p = `${m.module}.weight`;
        weights.set(p, await readParam(ckpt, dir, p, shapeOf(p)!));
      }
    } finally {
      await ckpt.close();
    }
  }
  return slotOuts(adapter, (p) => weights.get(p));
}
