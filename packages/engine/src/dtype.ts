import { type DType, type Graph, type HostTensor, deserializeGraph, dtypeBytes, errorMessage, expandComposites, graphToJson } from '@stageml/ir';
import { hfLlamaRounding, roundedTensor, topoOrder } from '@stageml/models';
import { EngineCode, EngineError } from './errors.js';

/** Compute dtypes of the engine's programs (`EngineOptions.dtype`). */
export const ENGINE_DTYPES = ['f32', 'bf16', 'f16'] as const;

/** One of `ENGINE_DTYPES`. */
export type EngineDType = (typeof ENGINE_DTYPES)[number];

/**
 * Dtype of the LoRA factors (`EngineOptions.adapterDtype`): `f32` (default) keeps the slot tables
 * f32 and, in a bf16/f16 engine, computes each LoRA term as PEFT does on a bf16/f16 base
 * (`autocast_adapter_dtype=True`); `same` rounds the factors to the compute dtype and the LoRA
 * chain op by op; `int8` (an f32 engine) stores A and B as int8 codes with an f32 scale per rank
 * row, a quarter of the f32 tables' bytes, read in place by cpu-native's bank kernel (error bounded
 * by `@stageml/planner`'s `loraFactorQuantBound`).
 */
export const ENGINE_ADAPTER_DTYPES = ['f32', 'same', 'int8'] as const;

/** One of `ENGINE_ADAPTER_DTYPES`. */
export type EngineAdapterDType = (typeof ENGINE_ADAPTER_DTYPES)[number];

/** The lowest finite value of a compute dtype (torch.finfo(dtype).min, what HF masks with). */
export function lowestOf(dtype: EngineDType): number {
  return dtype === 'bf16' ? -3.3895313892515355e38 : dtype === 'f16' ? -65504 : -3.4028234663852886e38;
}

/** `t` rounded to `dtype` (nearest even), in the IR's host storage of that dtype (a new tensor; `t` is not changed). */
export const castTensor: (t: HostTensor, dtype: DType) => HostTensor = roundedTensor;

/** Bytes `t` occupies as its dtype (bf16/f16: 2 per element, what a device holding it in that dtype spends). */
export function tensorBytes(t: HostTensor): number {
  return t.data.length * dtypeBytes(t.dtype);
}

type GraphJson = ReturnType<typeof graphToJson>;
type JsonNode = GraphJson['nodes'][number];
type JsonType = JsonNode['results'][number]['type'];

/** Options of `castEngineGraph`. */
export interface CastEngineOptions {
  /** The LoRA factors' dtype (default `f32`, as PEFT). */
  readonly adapterDtype?: EngineAdapterDType;
  /** Whether an input holds adapter factors (the slot tables). */
  readonly isFactorInput: (name: string) => boolean;
  /** Inputs holding an additive key mask: clamped to the dtype's lowest finite value before the cast (HF masks with finfo.min). */
  readonly maskInputs?: ReadonlySet<string>;
  /** f32 inputs that become `dtype` inputs (the KV cache: its values are exact in `dtype`). */
  readonly dtypeInputs?: (name: string) => boolean;
  /** Outputs left in `dtype` rather than cast back to f32 (the step's new keys and values). */
  readonly dtypeOutputs?: (name: string) => boolean;
}

/**
 * Converts an engine program built in f32 to `dtype` (bf16 or f16) with Hugging Face's rounding
 * points, as `stageml stage --dtype` converts a residual (apps/cli `castResidual`): every f32
 * parameter (a weight) becomes `dtype`, and so does every f32 value computed from one; values
 * computed only from integers, literals and f32 inputs stay f32 (the rotary angles) and are
 * rounded where they meet `dtype` values, as HF casts cos/sin to the hidden states' dtype.
 * `rmsNorm(x, w)` becomes `mul(rmsNorm(x), w)` and `rotary(x, cos, sin)` becomes
 * `x·cos + rotate_half(x)·sin`, each op rounded (LlamaRMSNorm, apply_rotary_pos_emb). The
 * interface is unchanged but where asked: f32 inputs stay f32 (cast on entry; an additive mask is
 * clamped to the dtype's lowest finite value first, so a fully masked padding row stays finite)
 * unless `dtypeInputs` makes them `dtype` inputs, and f32 outputs are cast back unless
 * `dtypeOutputs` keeps them in `dtype`. The serving ops stay ops, so an executor that runs them
 * itself (the torch worker's bank kernel and in-place KV append) still sees them: `cachedAttention`
 * always (its decomposition only transposes and concatenates, which round nothing) and `loraBank`
 * with `adapterDtype: 'same'` (cast as one op in `dtype`, as its reference semantics round once);
 * with `f32` factors `loraBank` is expanded first, since PEFT's f32 chain rounds inside it.
 *
 * The slot tables (inputs `isFactorInput` accepts): with `adapterDtype: 'f32'` they stay f32, and
 * every value computed from them is computed in f32 with its `dtype` operands cast up (PEFT's
 * `x.to(lora_A.weight.dtype)`); where such a term meets the base output in an `add`, the sum is
 * taken in f32 and rounded once (`result + lora_B(lora_A(x))·s` promotes to f32, then
 * `.to(previous_dtype)`). With `same` they are `dtype` inputs like the weights.
 */
export function castEngineGraph(program: Graph, dtype: 'bf16' | 'f16', opts: CastEngineOptions): Graph {
  const same = opts.adapterDtype === 'same';
  // PEFT's f32 LoRA chain has rounding points inside `loraBank` (and `loraBankLinear`, a linear and
  // a `loraBank`): cast their decomposition then.
  // `skipRmsNorm` is expanded too, so that its norm takes HF's rounding below (`hfLlamaRounding`).
  const g = expandComposites(program, (op) => op === 'skipRmsNorm' || (!same && (op === 'loraBank' || op === 'loraBankLinear')));
  const json = graphToJson(g);
  const masks = opts.maskInputs ?? new Set<string>();
  const nodes: JsonNode[] = [];
  const types: { name: string; dtype: string; shape: JsonType['shape']; node: number }[] = [];
  /** Per new value: computed from adapter factors in f32. */
  const factor: boolean[] = [];
  /** Per new value: computed from a mask input only (clamped before a cast). */
  const maskDerived: boolean[] = [];
  const emit = (n: JsonNode, flags: { factor?: boolean; mask?: boolean } = {}): number => {
    nodes.push(n);
    const first = types.length;
    for (const r of n.results) {
      types.push({ name: r.name, dtype: r.type.dtype, shape: r.type.shape, node: nodes.length - 1 });
      factor.push(flags.factor === true && r.type.dtype === 'f32');
      maskDerived.push(flags.mask === true);
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
  const op1 = (op: string, operands: number[], attrs: Record<string, unknown> | undefined, name: string, type: JsonType, flags: { factor?: boolean } = {}): number =>
    emit({ kind: 'op', op, operands, ...(attrs === undefined ? {} : { attrs }), results: [{ name, type }] }, flags);
  const lowered = new Map<number, number>();
  /** Value `v` (f32) as `dtype`: a literal of that dtype, or a cast (a mask clamped first); made once. */
  const asTarget = (v: number): number => {
    const hit = lowered.get(v);
    if (hit !== undefined) return hit;
    const t = types[v]!;
    const def = nodes[t.node]!;
    const type = { dtype, shape: t.shape };
    let id: number;
    if (def.kind === 'op' && def.op === 'sml.constant') id = emit({ ...def, attrs: { ...def.attrs, dtype }, results: [{ name: fresh(`${t.name}.${dtype}`), type }] });
    else {
      let src = v;
      if (maskDerived[v] === true) {
        const lo = op1('sml.constant', [], { value: [lowestOf(dtype)], shape: [], dtype: 'f32' }, fresh(`${t.name}.lowest`), { dtype: 'f32', shape: [] });
        src = op1('sml.maximum', [v, lo], undefined, fresh(`${t.name}.clamped`), { dtype: 'f32', shape: t.shape });
      }
      id = op1('sml.cast', [src], { dtype }, fresh(`${t.name}.${dtype}`), type);
    }
    lowered.set(v, id);
    return id;
  };
  const widened = new Map<number, number>();
  /** Value `v` (`dtype`) cast to f32; made once. */
  const asF32 = (v: number): number => {
    const t = types[v]!;
    if (t.dtype !== dtype) return v;
    const hit = widened.get(v);
    if (hit !== undefined) return hit;
    const id = op1('sml.cast', [v], { dtype: 'f32' }, fresh(`${t.name}.f32`), { dtype: 'f32', shape: t.shape });
    widened.set(v, id);
    return id;
  };
  const remap: number[] = [];
  for (const n of json.nodes) {
    if (n.kind !== 'op') {
      const r = n.results[0]!;
      const isFactor = n.kind === 'input' && opts.isFactorInput(r.name);
      const lower = r.type.dtype === 'f32' && (n.kind === 'param' || (isFactor && same) || opts.dtypeInputs?.(r.name) === true);
      remap.push(emit({ ...n, results: n.results.map((x) => (lower ? { name: x.name, type: { dtype, shape: x.type.shape } } : x)) }, { factor: isFactor && !same, mask: n.kind === 'input' && masks.has(r.name) }));
      continue;
    }
    const operands = n.operands.map((o) => remap[o]!);
    const withDtype = operands.some((o) => types[o]!.dtype === dtype);
    const withFactor = operands.some((o) => factor[o] === true);
    const isMask = operands.length > 0 && operands.every((o) => maskDerived[o] === true);
    const r0 = n.results[0]!;
    if (withFactor) {
      if (withDtype && n.op === 'sml.add' && operands.length === 2 && n.results.length === 1) {
        // PEFT: result (dtype) + delta (f32) promotes to f32; result.to(previous dtype) rounds once.
        const sum = op1('sml.add', operands.map(asF32), n.attrs, fresh(`${r0.name}.f32`), { dtype: 'f32', shape: r0.type.shape });
        remap.push(op1('sml.cast', [sum], { dtype }, r0.name, { dtype, shape: r0.type.shape }));
        continue;
      }
      // PEFT: x.to(lora_A.weight.dtype): the LoRA chain in f32.
      const id = emit({ ...n, operands: operands.map(asF32) }, { factor: true });
      for (let i = 0; i < n.results.length; i++) remap.push(id + i);
      continue;
    }
    const producesF32 = n.results.some((r) => r.type.dtype === 'f32');
    if (!withDtype || !producesF32) {
      const ops2 = withDtype ? operands.map((o) => (types[o]!.dtype === 'f32' ? asTarget(o) : o)) : operands;
      const id = emit({ ...n, operands: ops2 }, { mask: isMask });
      for (let i = 0; i < n.results.length; i++) remap.push(id + i);
      continue;
    }
    const attrs = n.attrs === undefined ? undefined : Object.fromEntries(Object.entries(n.attrs).map(([k, v]) => [k, k === 'dtype' && v === 'f32' ? dtype : v]));
    const low = operands.map((o) => (types[o]!.dtype === 'f32' ? asTarget(o) : o));
    // LlamaRMSNorm and apply_rotary_pos_emb round where transformers' bf16 Llama does.
    const hf = hfLlamaRounding(n, low, dtype, attrs, op1, fresh, types);
    if (hf !== undefined) {
      remap.push(hf);
      continue;
    }
    const id = emit({ ...n, operands: low, ...(attrs === undefined ? {} : { attrs }), results: n.results.map((r) => ({ name: r.name, type: { dtype: r.type.dtype === 'f32' ? dtype : r.type.dtype, shape: r.type.shape } })) });
    for (let i = 0; i < n.results.length; i++) remap.push(id + i);
  }
  const outputs = json.outputs.map((o) => {
    const v = remap[o.value]!;
    const t = types[v]!;
    if (g.values[o.value]!.type.dtype !== 'f32' || t.dtype === 'f32' || opts.dtypeOutputs?.(o.name) === true) return { name: o.name, value: v };
    return { name: o.name, value: op1('sml.cast', [v], { dtype: 'f32' }, fresh(`${t.name}.f32`), { dtype: 'f32', shape: t.shape }) };
  });
  // Lowered literals and casts were appended after their first reader: put every node after its
  // operands, and drop op nodes no output reads (literals replaced by their lowered copies).
  const live = new Array<boolean>(nodes.length).fill(false);
  const mark = (v: number): void => {
    const i = types[v]!.node;
    if (live[i]) return;
    live[i] = true;
    for (const o of nodes[i]!.operands) mark(o);
  };
  for (const o of outputs) mark(o.value);
  const order = topoOrder(nodes, types);
  const firstResult = new Map<number, number>();
  types.forEach((t, v) => {
    if (!firstResult.has(t.node)) firstResult.set(t.node, v);
  });
  const renumber = new Map<number, number>();
  const sorted: JsonNode[] = [];
  let next = 0;
  for (const i of order) {
    const n = nodes[i]!;
    if (n.kind === 'op' && !live[i]) continue;
    sorted.push({ ...n, operands: n.operands.map((o) => renumber.get(o)!) });
    const first = firstResult.get(i)!;
    for (let r = 0; r < n.results.length; r++) renumber.set(first + r, next++);
  }
  try {
    return deserializeGraph({ ...json, nodes: sorted, outputs: outputs.map((o) => ({ name: o.name, value: renumber.get(o.value)! })) });
  } catch (e) {
    throw new EngineError(EngineCode.BAD_OPTIONS, `cannot build the ${dtype} program: ${errorMessage(e)}`, { cause: e });
  }
}
