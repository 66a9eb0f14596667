import { type Graph, type HostTensor, deserializeGraph, expandComposites, graphToJson, errorMessage } from '@stageml/ir';
import type { SpecializeResult } from '@stageml/runtime';
import { openCheckpoint } from '@stageml/safetensors';
import { hfLlamaRounding, roundedTensor, topoOrder } from '@stageml/models';
import { CliCode, CliError } from './errors.js';

/** Compute dtypes `stageml stage --dtype` accepts (`checkpoint`: the floating dtype the checkpoint stores). */
export const STAGE_DTYPES = ['f32', 'bf16', 'f16', 'checkpoint'] as const;

/** One of `STAGE_DTYPES`. */
export type StageDType = (typeof STAGE_DTYPES)[number];

/** Parses `--dtype`; anything else is `CLI_USAGE`. */
export function parseStageDType(v: string): StageDType {
  if ((STAGE_DTYPES as readonly string[]).includes(v)) return v as StageDType;
  throw new CliError(CliCode.USAGE, `--dtype must be one of ${STAGE_DTYPES.join(', ')}, got '${v}'`);
}

/**
 * What `stageml stage --adapter-dtype` accepts: the dtype of the LoRA factors in a bf16/f16 residual.
 * `f32` (default) keeps them f32 and computes the LoRA term as PEFT does on a bf16/f16 base (its
 * `autocast_adapter_dtype=True`): x cast to f32, A, B and the scale in f32, added to the base
 * output in f32 (torch's type promotion), then rounded to the compute dtype once. `same` rounds
 * the factors to the compute dtype and the LoRA chain op by op (the form `gen triton|cuda` and the
 * torch executor's fused kernel take).
 */
export const STAGE_ADAPTER_DTYPES = ['f32', 'same'] as const;

/** One of `STAGE_ADAPTER_DTYPES`. */
export type StageAdapterDType = (typeof STAGE_ADAPTER_DTYPES)[number];

/** Parses `--adapter-dtype`; anything else is `CLI_USAGE`. */
export function parseStageAdapterDType(v: string): StageAdapterDType {
  if ((STAGE_ADAPTER_DTYPES as readonly string[]).includes(v)) return v as StageAdapterDType;
  throw new CliError(CliCode.USAGE, `--adapter-dtype must be one of ${STAGE_ADAPTER_DTYPES.join(', ')}, got '${v}'`, { hint: 'f32: LoRA factors and term in f32 as PEFT computes them on a bf16/f16 base; same: rounded to the compute dtype' });
}

const SAFETENSORS_FLOATS: Readonly<Record<string, 'f32' | 'bf16' | 'f16'>> = { F32: 'f32', BF16: 'bf16', F16: 'f16' };

/**
 * The floating dtype a model directory's checkpoint stores (the dtype of most of its float
 * tensors, by element count). Errors: a checkpoint of another float type is `CLI_USAGE`.
 */
export async function checkpointDType(dir: string): Promise<'f32' | 'bf16' | 'f16'> {
  const ckpt = await openCheckpoint(dir);
  try {
    const top = ckpt.storedFloatDType();
    const dt = top === undefined ? undefined : SAFETENSORS_FLOATS[top];
    if (dt === undefined) {
      throw new CliError(CliCode.USAGE, `the checkpoint in '${dir}' stores ${top ?? 'no float tensors'}; --dtype checkpoint needs F32, BF16 or F16`, { hint: 'give --dtype f32, bf16 or f16' });
    }
    return dt;
  } finally {
    await ckpt.close();
  }
}

/**
 * Names of the values of `g` computed from literals and integers alone (no parameter or float
 * input among their ancestors), e.g. rotary frequency tables: when specialization folds one into
 * the constant table it stays f32 (it is not a weight).
 */
function literalDerived(g: Graph): Set<string> {
  const exact = new Array<boolean>(g.values.length).fill(false);
  const out = new Set<string>();
  for (const n of g.nodes) {
    let ok: boolean;
    if (n.kind === 'op') ok = n.operands.every((o) => exact[o] === true);
    else ok = n.kind === 'input' && !['f64', 'f32', 'f16', 'bf16'].includes(g.values[n.results[0]!]!.type.dtype);
    for (const r of n.results) {
      exact[r] = ok;
      if (ok) out.add(g.values[r]!.name);
    }
  }
  return out;
}

/** Options of `castResidual`. */
export interface CastOptions {
  /** The LoRA factors' dtype (see `STAGE_ADAPTER_DTYPES`; default `f32`, as PEFT). */
  adapterDtype?: StageAdapterDType;
}

/**
 * Whether `name` is a LoRA factor of a residual linear (`adapterParamName`: `adapter.<name>.<module>.
 * lora_A|lora_B|lora_B_bias`), which PEFT keeps in f32. Chosen by the parameter's role (its name), not
 * by the shape of the graph around it; per-expert factors (`adapter.<name>.<layer>.experts.…`)
 * are not, so they are rounded with the weights.
 */
export function isLinearLoraFactor(name: string): boolean {
  return name.startsWith('adapter.') && !name.includes('.experts.') && /\.lora_(A|B|B_bias)$/.test(name);
}

/**
 * Converts a residual computed in f32 to `dtype` (bf16 or f16): every f32 parameter and constant
 * becomes `dtype`, and so does every f32 value computed from one. Values computed only from
 * integers, literals and f32 inputs stay f32 (rotary angles from positions: bf16 cannot even hold
 * positions past 256) and are rounded to `dtype` where they meet a `dtype` value (literals by a
 * literal of that dtype, so LoRA scales stay scalar constants, other values by a cast), as
 * Hugging Face casts cos/sin to the hidden states' dtype. The interface is unchanged: f32 inputs
 * stay f32 and f32 outputs are cast back to f32, so callers (the engine's KV cache, logits) see
 * the same signature. Parameter data is rounded to nearest even once; external parameters (not in
 * the constant table) must be supplied in `dtype`.
 *
 * The rounding points follow Hugging Face's Llama in that dtype: `rmsNorm(x, w)` becomes
 * `mul(rmsNorm(x), w)` (HF rounds the normalized value, then multiplies by the weight in `dtype`)
 * and `rotary(x, cos, sin)` becomes `x·cos + rotate_half(x)·sin`, each op rounded. With
 * `adapterDtype: 'f32'` (the default) the LoRA factors (`isLinearLoraFactor`) stay f32 and every
 * value computed from them is computed in f32, its `dtype` operands cast up (PEFT's
 * `x.to(lora_A.weight.dtype)`); where such a value meets a `dtype` one in an `add` (the layer's
 * output), the sum is taken in f32 and rounded once — for a residual LoRA linear
 * `cast(add(cast(linear(x, W), f32), mul(linear(linear(cast(x, f32), A), B), s)), dtype)`, as PEFT
 * computes it. This is a data-flow rule on the factors' role, the one the engine's
 * `castEngineGraph` applies to its slot tables, not a match of the chain's shape. With `'same'` the
 * factors are rounded to `dtype` like the base weights.
 */
export function castResidual(result: SpecializeResult, dtype: 'bf16' | 'f16', source?: Graph, options: CastOptions = {}): SpecializeResult {
  const keep = source === undefined ? new Set<string>() : literalDerived(source);
  // A residual add + norm (`skipRmsNorm`) as its add and `rmsNorm`, whose HF rounding follows.
  const json = graphToJson(expandComposites(result.residual, (op) => op === 'skipRmsNorm'));
  type JsonNode = (typeof json.nodes)[number];
  const loraParams = new Set(options.adapterDtype === 'same' ? [] : json.nodes.flatMap((n) => (n.kind === 'param' && n.results[0]!.type.dtype === 'f32' && isLinearLoraFactor(n.results[0]!.name) ? [n.results[0]!.name] : [])));
  const nodes: JsonNode[] = [];
  const newTypes: { name: string; dtype: string; shape: (number | string)[]; node: number }[] = [];
  /** Per new value: computed (in f32) from LoRA factors. */
  const factor: boolean[] = [];
  const emit = (n: JsonNode, fromFactors = false): number => {
    nodes.push(n);
    const first = newTypes.length;
    for (const r of n.results) {
      newTypes.push({ name: r.name, dtype: r.type.dtype, shape: r.type.shape, node: nodes.length - 1 });
      factor.push(fromFactors && r.type.dtype === 'f32');
    }
    return first;
  };
  const taken = new Set(json.nodes.flatMap((n) => n.results.map((r) => r.name)));
  const fresh = (base: string): string => {
    let name = base;
    for (let i = 1; taken.has(name); i++) name = `${base}_${String(i)}`;
    taken.add(name);
    return name;
  };
  const lowered = new Map<number, number>();
  /** Value `v` (new id, f32) as `dtype`: a literal of that dtype, or a cast (made once). */
  const asTarget = (v: number): number => {
    const hit = lowered.get(v);
    if (hit !== undefined) return hit;
    const t = newTypes[v]!;
    const def = nodes[t.node]!;
    const id =
      def.kind === 'op' && def.op === 'sml.constant'
        ? emit({ ...def, attrs: { ...def.attrs, dtype }, results: [{ name: fresh(`${t.name}.${dtype}`), type: { dtype, shape: t.shape } }] })
        : emit({ kind: 'op', op: 'sml.cast', operands: [v], attrs: { dtype }, results: [{ name: fresh(`${t.name}.${dtype}`), type: { dtype, shape: t.shape } }] });
    lowered.set(v, id);
    return id;
  };
  const widened = new Map<number, number>();
  /** Value `v` (new id, `dtype`) cast to f32 (made once). */
  const asF32 = (v: number): number => {
    const hit = widened.get(v);
    if (hit !== undefined) return hit;
    const t = newTypes[v]!;
    const id = t.dtype === 'f32' ? v : emit({ kind: 'op', op: 'sml.cast', operands: [v], attrs: { dtype: 'f32' }, results: [{ name: fresh(`${t.name}.f32`), type: { dtype: 'f32', shape: t.shape } }] });
    widened.set(v, id);
    return id;
  };
  /** An op node of one result of `type` (a new id). */
  const op1 = (op: string, operands: number[], attrs: Record<string, unknown> | undefined, name: string, type: { dtype: string; shape: (number | string)[] }): number =>
    emit({ kind: 'op', op, operands, ...(attrs === undefined ? {} : { attrs }), results: [{ name, type }] });
  const remap: number[] = [];
  for (const n of json.nodes) {
    if (n.kind !== 'op') {
      const name = n.results[0]!.name;
      const isFactor = n.kind === 'param' && loraParams.has(name);
      const lower = n.kind === 'param' && n.results[0]!.type.dtype === 'f32' && !keep.has(name) && !isFactor;
      remap.push(emit({ ...n, results: n.results.map((r) => (lower ? { name: r.name, type: { dtype, shape: r.type.shape } } : r)) }, isFactor));
      continue;
    }
    const operands = n.operands.map((o) => remap[o]!);
    if (operands.some((o) => factor[o] === true)) {
      const r = n.results[0]!;
      if (n.op === 'sml.add' && operands.some((o) => newTypes[o]!.dtype === dtype)) {
        // PEFT: result (dtype) + delta (f32) promotes to f32; result.to(torch_result_dtype) rounds once.
        const sum = op1('sml.add', operands.map((o) => asF32(o)), n.attrs, fresh(`${r.name}.f32`), { dtype: 'f32', shape: r.type.shape });
        remap.push(op1('sml.cast', [sum], { dtype }, r.name, { dtype, shape: r.type.shape }));
        continue;
      }
      // PEFT: x.to(lora_A.weight.dtype), then the LoRA computation in f32.
      const id = emit({ ...n, operands: operands.map((o) => asF32(o)) }, true);
      for (let i = 0; i < n.results.length; i++) remap.push(id + i);
      continue;
    }
    const mixed = operands.some((o) => newTypes[o]!.dtype === dtype);
    const producesF32 = n.results.some((r) => r.type.dtype === 'f32');
    if (!mixed || !producesF32) {
      // Exact-derived f32 (or no f32 result): unchanged, but f32 operands meeting dtype ones are lowered.
      const ops2 = mixed ? operands.map((o) => (newTypes[o]!.dtype === 'f32' ? asTarget(o) : o)) : operands;
      const id = emit({ ...n, operands: ops2 });
      for (let i = 0; i < n.results.length; i++) remap.push(id + i);
      continue;
    }
    const attrs = n.attrs === undefined ? undefined : Object.fromEntries(Object.entries(n.attrs).map(([k, v]) => [k, k === 'dtype' && v === 'f32' ? dtype : v]));
    const lowOps = operands.map((o) => (newTypes[o]!.dtype === 'f32' ? asTarget(o) : o));
    const hf = hfLlamaRounding(n, lowOps, dtype, attrs, op1, fresh, newTypes);
    if (hf !== undefined) {
      remap.push(hf);
      continue;
    }
    const id = emit({
      ...n,
      operands: lowOps,
      ...(attrs === undefined ? {} : { attrs }),
      results: n.results.map((r) => ({ name: r.name, type: { dtype: r.type.dtype === 'f32' ? dtype : r.type.dtype, shape: r.type.shape } })),
    });
    for (let i = 0; i < n.results.length; i++) remap.push(id + i);
  }
  const outputs = json.outputs.map((o) => {
    const v = remap[o.value]!;
    const t = newTypes[v]!;
    if (result.residual.values[o.value]!.type.dtype !== 'f32' || t.dtype === 'f32') return { name: o.name, value: v };
    return { name: o.name, value: emit({ kind: 'op', op: 'sml.cast', operands: [v], attrs: { dtype: 'f32' }, results: [{ name: fresh(`${t.name}.f32`), type: { dtype: 'f32', shape: t.shape } }] }) };
  });
  // Lowered literals and casts were appended after their first reader: put every node after its
  // operands, and drop literals no longer read (their lowered copies replaced them).
  const live = new Array<boolean>(nodes.length).fill(false);
  const mark = (v: number): void => {
    const i = newTypes[v]!.node;
    if (live[i]) return;
    live[i] = true;
    for (const o of nodes[i]!.operands) mark(o);
  };
  for (const o of outputs) mark(o.value);
  const order = topoOrder(nodes, newTypes).filter((i) => live[i] === true || nodes[i]!.kind !== 'op');
  const renumber = new Map<number, number>();
  const sorted: JsonNode[] = [];
  let nid = 0;
  for (const i of order) {
    const n = nodes[i]!;
    const firstOld = newTypes.findIndex((t) => t.node === i);
    sorted.push({ ...n, operands: n.operands.map((o) => renumber.get(o)!) });
    for (let r = 0; r < n.results.length; r++) renumber.set(firstOld + r, nid++);
  }
  let residual: Graph;
  try {
    residual = deserializeGraph({ ...json, nodes: sorted, outputs: outputs.map((o) => ({ name: o.name, value: renumber.get(o.value)! })) });
  } catch (e) {
    throw new CliError(CliCode.USAGE, `cannot convert the residual to ${dtype}: ${errorMessage(e)}`, { cause: e });
  }
  const constants: Record<string, HostTensor> = {};
  for (const [k, t] of Object.entries(result.constants)) constants[k] = t.dtype === 'f32' && !keep.has(k) && !loraParams.has(k) ? roundedTensor(t, dtype) : t;
  const constantTypes = Object.fromEntries(Object.entries(result.constantTypes).map(([k, t]) => [k, t.dtype === 'f32' && !keep.has(k) && !loraParams.has(k) ? { dtype, shape: t.shape } : t]));
  const constantBytes = Object.values(constants).reduce((a, t) => a + t.data.length * (t.dtype === 'f64' || t.dtype === 'i64' ? 8 : t.dtype === 'bf16' || t.dtype === 'f16' ? 2 : t.dtype === 'i8' || t.dtype === 'u8' || t.dtype === 'bool' ? 1 : 4), 0);
  return { ...result, residual, constants, constantTypes, report: { ...result.report, residualOps: residual.nodes.filter((n) => n.kind === 'op').length, constantBytes } };
}
