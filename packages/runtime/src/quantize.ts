import {
  type AttrsOf,
  type Graph,
  GraphBuilder,
  type HostTensor,
  type PackedWeight,
  type TensorType,
  type Value,
  type ValueId,
  type WeightQuantOptions,
  loraBankLinearOperands,
  quantizeWeight,
} from '@stageml/ir';
import { RuntimeCode, RuntimeError } from './errors.js';
import type { SpecializeResult } from './specialize.js';

/** A weight quantization spec as flags and configs write it. */
export interface WeightQuantSpec extends WeightQuantOptions {
  /** Per output channel (one block per row) instead of `blockSize` groups. */
  readonly perChannel?: boolean;
}

/**
 * Parses `int8`, `int4` (symmetric, blocks of 32 inputs: llama.cpp's Q8_0 / Q4_0 grouping),
 * `int8:g128`, `int4:channel`, and any of them with `:asym` (zero points). Anything else is
 * `RT_BAD_QUANT` naming the spec.
 */
export function parseWeightQuantSpec(spec: string): WeightQuantSpec {
  const m = /^int(8|4)(?::(g(\d+)|channel))?(:asym)?$/.exec(spec.trim());
  if (m === null) throw new RuntimeError(RuntimeCode.BAD_QUANT, `quantization must be int8 or int4, optionally :g<N> or :channel and :asym (e.g. int4:g128:asym), got '${spec}'`);
  const bits = m[1] === '8' ? 8 : 4;
  const group = m[3] === undefined ? 32 : Number(m[3]);
  if (!(group >= 2) || (bits === 4 && group % 2 !== 0)) throw new RuntimeError(RuntimeCode.BAD_QUANT, `group size must be ≥ 2 (even for int4), got ${String(group)} in '${spec}'`);
  return { bits, blockSize: group, symmetric: m[4] === undefined, ...(m[2] === 'channel' ? { perChannel: true } : {}) };
}

/** The spec's string form (`int4:g128:asym`), as `parseWeightQuantSpec` reads it. */
export function formatWeightQuantSpec(s: WeightQuantSpec): string {
  return `int${String(s.bits)}${s.perChannel === true ? ':channel' : s.blockSize === 32 ? '' : `:g${String(s.blockSize)}`}${s.symmetric === false ? ':asym' : ''}`;
}

/** Options of `quantizeLinears`. */
export interface QuantizeLinearsOptions {
  /**
   * Which weight gets which quantization (`undefined`: stays f32). Called for every [out, in] f32
   * parameter used only as a linear layer's weight, with its name and data. The default quantizes
   * all but LoRA factors (parameters named `adapter.*` or containing `lora`) with `spec`.
   */
  readonly choose?: (name: string, weight: HostTensor) => WeightQuantSpec | undefined;
  /** The spec the default `choose` applies. */
  readonly spec?: WeightQuantSpec;
  /**
   * Packed weights by source tensor and spec, reused across calls: programs compiled for several
   * adapter sets share the base weights, so each is quantized once.
   */
  readonly cache?: WeakMap<HostTensor, Map<string, PackedWeight>>;
}

/** What `quantizeLinears` did to one weight. */
export interface QuantizedWeightInfo {
  /** The f32 parameter it replaced. */
  readonly name: string;
  /** Its spec. */
  readonly spec: WeightQuantSpec;
  /** The packed operands (also in the returned constants under `<name>.qweight` etc.). */
  readonly packed: PackedWeight;
}

/** Result of `quantizeLinears`: a new graph and constant table (inputs untouched). */
export interface QuantizeLinearsResult {
  readonly graph: Graph;
  readonly constants: Readonly<Record<string, HostTensor>>;
  /** Weights that were quantized, in graph order. */
  readonly quantized: readonly QuantizedWeightInfo[];
}

/** Whether a parameter name is a LoRA factor (which stays f32, as QLoRA keeps it). */
export function isLoraParamName(name: string): boolean {
  return name.startsWith('adapter.') || /lora/i.test(name);
}

function blockSizeFor(spec: WeightQuantSpec, inFeatures: number): number {
  if (spec.perChannel !== true) return spec.blockSize;
  // One block per row, rounded up to whole bytes for 4-bit codes.
  return spec.bits === 4 ? inFeatures + (inFeatures % 2) : inFeatures;
}

/** Ops whose operand 1 is a linear weight W [out, in] the pass may quantize. */
function isLinearOp(op: string): op is 'linear' | 'loraBankLinear' {
  return op === 'linear' || op === 'loraBankLinear';
}

/**
 * The weight-only quantization pass: rewrites every `linear(x, W)` (and the base linear of every
 * `loraBankLinear`, which becomes `loraBank` over the quantized linear) whose weight W is an f32
 * [out, in] parameter with data in `constants` (and that `choose` picks) into
 * `quantizedLinear(x, W.qweight, W.scales[, W.zero_points])` (+ bias), and replaces W's data by
 * the packed codes, f32 scales and u8 zero points. A weight also used elsewhere (a tied
 * embedding's gather) keeps its f32 copy for those uses. Works on any graph — a model before
 * staging or a residual after `specialize` (merged LoRA weights included) — and never mutates its
 * inputs. bf16/f16 weights are quantized from their stored values (held exactly in f32).
 */
export function quantizeLinears(graph: Graph, constants: Readonly<Record<string, HostTensor>>, opts: QuantizeLinearsOptions = {}): QuantizeLinearsResult {
  const spec = opts.spec;
  const choose = opts.choose ?? ((name: string) => (isLoraParamName(name) ? undefined : spec));
  if (opts.choose === undefined && spec === undefined) throw new RuntimeError(RuntimeCode.BAD_QUANT, 'quantizeLinears needs a spec or a choose function');
  const paramOf = new Map<ValueId, string>();
  for (const n of graph.nodes) if (n.kind === 'param') paramOf.set(n.results[0]!, n.name);
  // Weights to quantize: f32 [out, in] params feeding a linear's weight slot.
  const chosen = new Map<string, QuantizedWeightInfo>();
  const otherUse = new Set<string>();
  for (const n of graph.nodes) {
    if (n.kind !== 'op') continue;
    n.operands.forEach((v, i) => {
      const name = paramOf.get(v);
      if (name === undefined) return;
      if (!isLinearOp(n.op) || i !== 1) otherUse.add(name);
    });
  }
  for (const o of graph.outputs) {
    const name = paramOf.get(o.value);
    if (name !== undefined) otherUse.add(name);
  }
  for (const n of graph.nodes) {
    if (n.kind !== 'op' || !isLinearOp(n.op)) continue;
    const name = paramOf.get(n.operands[1]!);
    if (name === undefined || chosen.has(name)) continue;
    const w = constants[name];
    const type = graph.values[n.operands[1]!]!.type;
    if (w === undefined || type.dtype !== 'f32' || w.shape.length !== 2) continue;
    const s = choose(name, w);
    if (s === undefined) continue;
    const [out, inF] = w.shape as [number, number];
    const key = formatWeightQuantSpec(s);
    let packed = opts.cache?.get(w)?.get(key);
    if (packed === undefined) {
      packed = quantizeWeight(w.data, out, inF, { bits: s.bits, blockSize: blockSizeFor(s, inF), symmetric: s.symmetric ?? true });
      if (opts.cache !== undefined) {
        let m = opts.cache.get(w);
        if (m === undefined) opts.cache.set(w, (m = new Map<string, PackedWeight>()));
        m.set(key, packed);
      }
    }
    chosen.set(name, { name, spec: s, packed });
  }
  const b = new GraphBuilder(graph.name, { intern: false });
  const map = new Array<Value | undefined>(graph.values.length);
  const qparams = new Map<string, { q: Value; s: Value; z: Value | undefined }>();
  const out: Record<string, HostTensor> = {};
  for (const [k, v] of Object.entries(constants)) if (!chosen.has(k) || otherUse.has(k)) out[k] = v;
  const qOf = (name: string): { q: Value; s: Value; z: Value | undefined } => {
    let p = qparams.get(name);
    if (p === undefined) {
      const { packed } = chosen.get(name)!;
      const qn = `${name}.qweight`;
      const sn = `${name}.scales`;
      const zn = `${name}.zero_points`;
      out[qn] = packed.qweight;
      out[sn] = packed.scales;
      if (packed.zeroPoints !== undefined) out[zn] = packed.zeroPoints;
      p = {
        q: b.param(qn, ['u8', packed.qweight.shape]),
        s: b.param(sn, ['f32', packed.scales.shape]),
        z: packed.zeroPoints === undefined ? undefined : b.param(zn, ['u8', packed.zeroPoints.shape]),
      };
      qparams.set(name, p);
    }
    return p;
  };
  graph.nodes.forEach((n) => {
    const v0 = n.results[0]!;
    const info = graph.values[v0]!;
    if (n.kind === 'input') {
      map[v0] = b.input(n.name, info.type);
      return;
    }
    if (n.kind === 'param') {
      if (!chosen.has(n.name) || otherUse.has(n.name)) map[v0] = b.param(n.name, info.type);
      return;
    }
    const name = isLinearOp(n.op) ? paramOf.get(n.operands[1]!) : undefined;
    if (name !== undefined && chosen.has(name)) {
      const p = qOf(name);
      const { attrs } = chosen.get(name)!.packed;
      const x = map[n.operands[0]!]!;
      const y = b.quantizedLinear(x, p.q, p.s, p.z, attrs);
      if (n.op === 'linear') {
        const bias = n.operands[2];
        map[v0] = bias === undefined ? y : b.add(y, map[bias]!);
        return;
      }
      // A `loraBankLinear` over a quantized W: its decomposition with the quantized base linear.
      const a = n.attrs as AttrsOf<'loraBankLinear'>;
      const t = loraBankLinearOperands(n.operands.map((v) => map[v]!), a.form);
      const base = t.bias === undefined ? y : b.add(y, t.bias);
      const bank = [t.x, base, t.A, t.B, t.index, ...(t.select === undefined ? [] : [t.select])];
      map[v0] = b.apply('loraBank', bank, { form: a.form, zeroTail: a.zeroTail }, { name: info.name })[0];
      return;
    }
    const res = b.apply(n.op, n.operands.map((v) => map[v]!), n.attrs, { names: n.results.map((r) => graph.values[r]!.name) });
    n.results.forEach((r, k) => (map[r] = res[k]));
  });
  for (const o of graph.outputs) b.output(o.name, map[o.value]!);
  return { graph: b.build(), constants: out, quantized: [...chosen.values()] };
}

/**
 * `quantizeLinears` over a specialization result: the residual's f32 linear weights become packed
 * constants (each new parameter at the stage of the weight it replaces), ready for `writeBundle`
 * (u8 codes and f32 scales are ordinary safetensors constants, so quantized bundles round-trip).
 */
export function quantizeStaged(result: SpecializeResult, opts: QuantizeLinearsOptions = {}): SpecializeResult & { readonly quantized: readonly QuantizedWeightInfo[] } {
  const q = quantizeLinears(result.residual, result.constants, opts);
  const stages = new Map(result.annotations.stages);
  const types: Record<string, TensorType> = {};
  for (const [k, v] of Object.entries(result.constantTypes)) if (Object.hasOwn(q.constants, k)) types[k] = v;
  for (const info of q.quantized) {
    const stage = stages.get(info.name);
    for (const [suffix, t] of [['qweight', info.packed.qweight], ['scales', info.packed.scales], ['zero_points', info.packed.zeroPoints]] as const) {
      if (t === undefined) continue;
      const name = `${info.name}.${suffix}`;
      types[name] = { dtype: t.dtype, shape: [...t.shape] };
      if (stage !== undefined) stages.set(name, stage);
    }
    if (!Object.hasOwn(q.constants, info.name)) stages.delete(info.name);
  }
  return { ...result, residual: q.graph, constants: q.constants, constantTypes: types, annotations: { lattice: result.annotations.lattice, stages }, quantized: q.quantized };
}
