import { concretizeAttrs } from './attrs.js';
import { type DimBindings, dimAsSymbol, dimSymbols, dimToString, evalDim } from './dim.js';
import { IrCode, IrError, type NodeRef, StageError } from './errors.js';
import type { Graph, OpNode, ValueId } from './graph.js';
import type { EvalContext } from './op-def.js';
import { opDef } from './ops/index.js';
import type { HostTensor } from './tensor.js';
import { type TensorType, concreteShape, typeToString } from './types.js';
import { errorMessage } from './error-classes.js';

/** Where parameter data comes from: a weight store keyed by parameter name. */
export interface WeightStore {
  /** The tensor for `name`, or undefined when the store has none. */
  get(name: string): HostTensor | undefined;
}

/** Options of `interpret`. */
export interface InterpretOptions {
  /** Values of graph inputs, by input name. */
  readonly inputs?: Readonly<Record<string, HostTensor>>;
  /** Parameter data: a store or a plain record. */
  readonly weights?: WeightStore | Readonly<Record<string, HostTensor>>;
  /** Seed of the random stream random ops draw from (default 0). */
  readonly seed?: number;
}

/** A deterministic uniform [0, 1) stream (mulberry32). */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Wraps a plain record as a weight store. */
export function recordWeightStore(rec: Readonly<Record<string, HostTensor>>): WeightStore {
  return { get: (name) => (Object.hasOwn(rec, name) ? rec[name] : undefined) };
}

/** A weight store for a store, a plain record of tensors, or nothing (an empty store). */
export function asWeightStore(w: WeightStore | Readonly<Record<string, HostTensor>> | undefined): WeightStore {
  if (w === undefined) return { get: () => undefined };
  return typeof (w as WeightStore).get === 'function' ? (w as WeightStore) : recordWeightStore(w as Record<string, HostTensor>);
}

/**
 * Binds the symbols of declared types to the dims of actual tensors and checks every dim. Throws
 * `IR_BINDING_MISMATCH` naming the value and dim on any disagreement. An entry without `data` is
 * checked by dtype and shape alone (an input whose data comes in another form, e.g. per row).
 */
export function bindDims(
  entries: readonly { readonly name: string; readonly type: TensorType; readonly value: Pick<HostTensor, 'dtype' | 'shape'> & { readonly data?: HostTensor['data'] } }[],
  initial: DimBindings = {},
  opts: { readonly allowUnbound?: boolean } = {},
): Record<string, number> {
  const b: Record<string, number> = { ...initial };
  for (const { name, type, value } of entries) {
    if (value.dtype !== type.dtype) {
      throw new IrError(IrCode.BINDING_MISMATCH, `'${name}' must be ${type.dtype}, got ${value.dtype}`);
    }
    if (value.shape.length !== type.shape.length) {
      throw new IrError(IrCode.BINDING_MISMATCH, `'${name}' must have rank ${String(type.shape.length)} (${typeToString(type)}), got shape [${value.shape.join(', ')}]`);
    }
    type.shape.forEach((d, i) => {
      const s = dimAsSymbol(d);
      const actual = value.shape[i]!;
      if (s === undefined) return;
      const prev = b[s];
      if (prev === undefined) b[s] = actual;
      else if (prev !== actual) {
        throw new IrError(IrCode.BINDING_MISMATCH, `'${name}' dim ${String(i)} binds ${s} = ${String(actual)}, but ${s} = ${String(prev)} elsewhere`);
      }
    });
  }
  for (const { name, type, value } of entries) {
    type.shape.forEach((d, i) => {
      let want: number;
      if (opts.allowUnbound === true && dimSymbols(d).some((name) => b[name] === undefined)) return;
      try {
        want = evalDim(d, b);
      } catch {
        throw new IrError(IrCode.BINDING_MISMATCH, `'${name}' dim ${String(i)} (${dimToString(d)}) mentions a symbol no input binds on its own`);
      }
      if (want !== value.shape[i]) {
        throw new IrError(IrCode.BINDING_MISMATCH, `'${name}' dim ${String(i)} must be ${dimToString(d)} = ${String(want)}, got ${String(value.shape[i])}`);
      }
    });
    if (value.data !== undefined && value.data.length !== value.shape.reduce((a, x) => a * x, 1)) {
      throw new IrError(IrCode.BINDING_MISMATCH, `'${name}' has ${String(value.data.length)} elements for shape [${value.shape.join(', ')}]`);
    }
  }
  return b;
}

/**
 * Runs one op node on concrete operands: attributes made concrete under `bindings`, results
 * checked against the node's inferred type. Errors name the node.
 */
export function evaluateNode(g: Graph, nodeIndex: number, operands: readonly HostTensor[], bindings: DimBindings, ctx: EvalContext): HostTensor[] {
  const node = g.nodes[nodeIndex] as OpNode;
  const def = opDef(node.op);
  const at: NodeRef = { graph: g.name, node: nodeIndex, value: g.values[node.results[0]!]?.name };
  let out: HostTensor[];
  try {
    const attrs = concretizeAttrs(def.attrs, node.attrs, bindings);
    out = def.evaluate(operands, attrs, ctx);
  } catch (e) {
    if (e instanceof StageError) throw new IrError(IrCode.EVAL_ERROR, e.message, { at, cause: e });
    throw new IrError(IrCode.EVAL_ERROR, `${def.name} failed: ${errorMessage(e)}`, { at, cause: e });
  }
  node.results.forEach((id, k) => {
    const t = g.values[id]!.type;
    const got = out[k];
    let want: number[];
    try {
      want = concreteShape(t, bindings);
    } catch (e) {
      throw new IrError(IrCode.EVAL_ERROR, errorMessage(e), { at, cause: e });
    }
    if (got?.dtype !== t.dtype || got.shape.length !== want.length || got.shape.some((d, i) => d !== want[i])) {
      throw new IrError(
        IrCode.EVAL_ERROR,
        `${def.name} produced ${got === undefined ? 'nothing' : `${got.dtype}[${got.shape.join(', ')}]`} where ${t.dtype}[${want.join(', ')}] was inferred`,
        { at },
      );
    }
  });
  return out;
}

/**
 * The reference interpreter: runs a graph on concrete inputs and weights and returns its outputs
 * by name. Computation is in f64 with results rounded to each value's dtype, so it is the oracle
 * every executor and lowering is tested against. Values are freed after their last use.
 */
export function interpret(g: Graph, opts: InterpretOptions = {}): Record<string, HostTensor> {
  const inputs = opts.inputs ?? {};
  const store = asWeightStore(opts.weights);
  const env = new Map<ValueId, HostTensor>();
  const leaves: { name: string; type: TensorType; value: HostTensor }[] = [];
  for (const n of g.nodes) {
    if (n.kind === 'op') continue;
    const vid = n.results[0]!;
    const type = g.values[vid]!.type;
    const value = n.kind === 'input' ? inputs[n.name] : store.get(n.name);
    if (value === undefined) {
      throw n.kind === 'input'
        ? new IrError(IrCode.MISSING_INPUT, `input '${n.name}' (${typeToString(type)}) was not supplied`, { at: { graph: g.name, value: n.name } })
        : new IrError(IrCode.MISSING_WEIGHT, `parameter '${n.name}' (${typeToString(type)}) is not in the weight store`, { at: { graph: g.name, value: n.name } });
    }
    leaves.push({ name: n.name, type, value });
    env.set(vid, value);
  }
  const bindings = bindDims(leaves);
  const lastUse = new Int32Array(g.values.length).fill(-1);
  g.nodes.forEach((n, i) => {
    for (const v of n.operands) lastUse[v] = i;
  });
  for (const o of g.outputs) lastUse[o.value] = g.nodes.length;
  const ctx: EvalContext = { random: seededRandom(opts.seed ?? 0) };
  g.nodes.forEach((n, i) => {
    if (n.kind !== 'op') return;
    const out = evaluateNode(g, i, n.operands.map((v) => env.get(v)!), bindings, ctx);
    n.results.forEach((id, k) => env.set(id, out[k]!));
    for (const v of n.operands) if (lastUse[v] === i) env.delete(v);
  });
  const result: Record<string, HostTensor> = {};
  for (const o of g.outputs) result[o.name] = env.get(o.value)!;
  return result;
}
