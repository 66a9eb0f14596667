import {
  expandDecomposed,
  type AttrsOf,
  type DType,
  type Dim,
  type Graph,
  type HostTensor,
  type NodeRef,
  type OpNode,
  type TensorType,
  type ValueId,
  type WeightStore,
  StageError,
  bindDims,
  graphInputs,
  graphParams,
  opDef,
  substituteDim,
  errorMessage,
} from '@stageml/ir';
import type { NodeProto } from 'onnx-buf';

import { type InitializerSpec, OnnxGraphBuilder } from './builder.js';
import { conform } from './convert.js';
import { ElemType, computeType, hostBytes } from './dtypes.js';
import { OnnxCode, OnnxLowerError } from './errors.js';
import type { Lowering, OnnxRuleTable } from './rule.js';
import { ONNX_RULES } from './rules.js';
import { usesMatMulNBits } from './rules-quant.js';
import { nodeReads } from './proto.js';

/** The ONNX opset the lowering targets (default domain). */
export const ONNX_OPSET = 18;

/** The ONNX IR version written into models (the one that introduced opset 18). */
export const ONNX_IR_VERSION = 8;

/** Options of `lowerToOnnx`. */
export interface LowerOnnxOptions {
  /** Data of the graph's parameters, which become initializers (every parameter must resolve). */
  readonly weights?: WeightStore | Readonly<Record<string, HostTensor>>;
  /** The lowering table (default `ONNX_RULES`); override entries to experiment or test. */
  readonly rules?: OnnxRuleTable;
}

/** A graph input or output of the lowered model. */
export interface OnnxTensorSpec {
  /** Tensor name (the IR input or output name). */
  readonly name: string;
  /** The IR dtype of the value. */
  readonly dtype: DType;
  /** The ONNX element type it travels in (`computeType(dtype)`). */
  readonly elemType: ElemType;
  /** Dims; symbols bound by parameter shapes are substituted, others stay symbolic (`dim_param`). */
  readonly shape: readonly Dim[];
}

/** A lowered model: nodes, initializers and signature, ready to encode (`encodeOnnx`). */
export interface OnnxModel {
  /** Graph name. */
  readonly name: string;
  /** Opset of the default domain. */
  readonly opset: number;
  /** Nodes in topological order. */
  readonly nodes: readonly NodeProto[];
  /** Parameters and constants. */
  readonly initializers: readonly InitializerSpec[];
  /** Graph inputs in the IR's order. */
  readonly inputs: readonly OnnxTensorSpec[];
  /** Graph outputs in the IR's order. */
  readonly outputs: readonly OnnxTensorSpec[];
}

function weightStore(w: LowerOnnxOptions['weights']): WeightStore {
  if (w === undefined) return { get: () => undefined };
  if (typeof (w as WeightStore).get === 'function') return w as WeightStore;
  const rec = w as Readonly<Record<string, HostTensor>>;
  return { get: (name) => (Object.hasOwn(rec, name) ? rec[name] : undefined) };
}

function nodeRef(graph: Graph, index: number, node: OpNode): NodeRef {
  return { graph: graph.name, node: index, value: graph.values[node.results[0]!]?.name };
}

/**
 * Renames tensor `from` to `to` in the nodes emitted from `start` on, when one of them produced it;
 * false (and nothing renamed) when `from` came from before `start`.
 */
function renameSince(nodes: NodeProto[], start: number, from: string, to: string): boolean {
  let produced = false;
  for (let i = start; i < nodes.length && !produced; i++) produced = nodes[i]!.output.includes(from);
  if (!produced) return false;
  for (let i = start; i < nodes.length; i++) {
    const n = nodes[i]!;
    n.input = n.input.map((x) => (x === from ? to : x));
    n.output = n.output.map((x) => (x === from ? to : x));
  }
  return true;
}

/**
 * The u8 parameters that travel as UINT8 initializers: every use is the codes or zero points of a
 * quantized linear lowered to MatMulNBits (4× smaller than the int32 compute type, and read by the
 * kernel in place).
 */
function nativeU8Params(graph: Graph, subst: (t: TensorType) => TensorType): Set<string> {
  const uses = new Map<ValueId, boolean>();
  for (const n of graph.nodes) {
    if (n.kind !== 'op') continue;
    n.operands.forEach((v, i) => {
      const ok = n.op === 'quantizedLinear' && (i === 1 || i === 3) && usesMatMulNBits(n.attrs as AttrsOf<'quantizedLinear'>, subst(graph.values[n.operands[0]!]!.type));
      uses.set(v, (uses.get(v) ?? true) && ok);
    });
  }
  for (const o of graph.outputs) uses.set(o.value, false);
  const out = new Set<string>();
  for (const n of graph.nodes) if (n.kind === 'param' && graph.values[n.results[0]!]!.type.dtype === 'u8' && uses.get(n.results[0]!) === true) out.add(n.name);
  return out;
}

function u8Bytes(t: HostTensor): Uint8Array<ArrayBuffer> {
  return t.data instanceof Uint8Array ? new Uint8Array(t.data.buffer as ArrayBuffer, t.data.byteOffset, t.data.byteLength) : Uint8Array.from(t.data as ArrayLike<number>);
}

/**
 * Removes nodes none of whose results reach a graph output (what a fused rule leaves behind: the
 * KV concat GroupQueryAttention reads as past and new halves instead), in place.
 */
function pruneDead(nodes: NodeProto[], outputs: readonly string[]): void {
  const live = new Set(outputs);
  const keep = new Array<boolean>(nodes.length).fill(false);
  for (let i = nodes.length - 1; i >= 0; i--) {
    const n = nodes[i]!;
    if (!n.output.some((o) => o !== '' && live.has(o))) continue;
    keep[i] = true;
    for (const x of nodeReads(n)) if (x !== '') live.add(x);
  }
  if (keep.every(Boolean)) return;
  const kept = nodes.filter((_, i) => keep[i]);
  nodes.length = 0;
  nodes.push(...kept);
}

/**
 * Lowers a (residual) graph to an ONNX model: parameters become initializers, inputs keep their
 * names with symbolic dims as `dim_param`, and every op lowers through the rule table to standard
 * ONNX ops of opset `ONNX_OPSET`. Tensor names follow the IR's value names. Each IR dtype travels
 * in its compute type (see `computeType`); narrow results are rounded or wrapped after each op.
 *
 * Errors: an op whose rule is `unsupported` is `ONNX_UNSUPPORTED_OP` naming the op, the reason and
 * the node; a parameter without data or of the wrong type `ONNX_BAD_WEIGHT`; a symbolic dim no
 * input can supply at run time `ONNX_UNBOUND_SYMBOL`; names ONNX cannot keep apart `ONNX_BAD_GRAPH`.
 */
export function lowerToOnnx(source: Graph, opts: LowerOnnxOptions = {}): OnnxModel {
  const rules = opts.rules ?? ONNX_RULES;
  // Composites the table lowers by decomposition become their primitive ops first.
  const graph = expandDecomposed(source, rules);
  graph.nodes.forEach((n, i) => {
    if (n.kind !== 'op') return;
    const rule = rules[n.op];
    if (rule.kind === 'unsupported') {
      throw new OnnxLowerError(OnnxCode.UNSUPPORTED_OP, `${opDef(n.op).name} has no ONNX lowering: ${rule.reason}`, { at: nodeRef(graph, i, n) });
    }
  });
  const store = weightStore(opts.weights);
  const params = graphParams(graph).map((p) => {
    const type = graph.values[p.results[0]!]!.type;
    const value = store.get(p.name);
    if (value === undefined) throw new OnnxLowerError(OnnxCode.BAD_WEIGHT, `parameter '${p.name}' has no data`, { at: { graph: graph.name, value: p.name } });
    return { name: p.name, type, value };
  });
  let statics: Record<string, number>;
  try {
    statics = bindDims(params);
  } catch (e) {
    throw new OnnxLowerError(OnnxCode.BAD_WEIGHT, errorMessage(e), { cause: e });
  }
  const subst = (t: TensorType): TensorType => ({ dtype: t.dtype, shape: t.shape.map((d) => substituteDim(d, statics)) });
  const spec = (name: string, type: TensorType): OnnxTensorSpec => ({ name, dtype: type.dtype, elemType: computeType(type.dtype), shape: subst(type).shape });

  const inputs = graphInputs(graph).map((n) => spec(n.name, graph.values[n.results[0]!]!.type));
  const b = new OnnxGraphBuilder(inputs, statics);
  const outputOwner = new Map<string, ValueId>();
  // An op result that is a graph output takes the (first) output name as its tensor name.
  const outputNameOf = new Map<ValueId, string>();
  for (const o of graph.outputs) if (!outputNameOf.has(o.value)) outputNameOf.set(o.value, o.name);
  for (const input of inputs) b.reserve(input.name);
  for (const p of params) b.reserve(p.name);
  for (const o of graph.outputs) {
    if (outputOwner.has(o.name)) throw new OnnxLowerError(OnnxCode.BAD_GRAPH, `output name '${o.name}' is used twice`);
    outputOwner.set(o.name, o.value);
    const source = graph.nodes[graph.values[o.value]!.node]!;
    // An input or parameter returned under its own name stays one tensor; any other clash is fatal.
    if (!b.reserve(o.name) && !(source.kind !== 'op' && source.name === o.name)) {
      throw new OnnxLowerError(OnnxCode.BAD_GRAPH, `output name '${o.name}' is also the name of an input or parameter`);
    }
  }

  const native = nativeU8Params(graph, subst);
  const names = new Array<string | undefined>(graph.values.length);
  graph.nodes.forEach((n, i) => {
    if (n.kind === 'input') {
      names[n.results[0]!] = n.name;
      return;
    }
    if (n.kind === 'param') {
      const p = params.find((x) => x.name === n.name)!;
      const init: InitializerSpec = native.has(n.name)
        ? { name: n.name, elemType: ElemType.UINT8, dims: [...p.value.shape], raw: u8Bytes(p.value) }
        : { name: n.name, elemType: computeType(p.type.dtype), dims: [...p.value.shape], raw: hostBytes(p.value) };
      b.initializers.push(init);
      names[n.results[0]!] = n.name;
      return;
    }
    const at = nodeRef(graph, i, n);
    const rule = rules[n.op] as Lowering<OpNode['op']>;
    b.setScope(`${String(at.value)} (${opDef(n.op).name})`);
    const start = b.nodes.length;
    let outs: string[];
    try {
      const results = rule.lower({
        b,
        attrs: n.attrs,
        inputs: n.operands.map((v) => names[v]!),
        operands: n.operands.map((v) => subst(graph.values[v]!.type)),
        results: n.results.map((v) => subst(graph.values[v]!.type)),
        native: n.operands.map((v) => {
          const src = graph.nodes[graph.values[v]!.node]!;
          return src.kind === 'param' && native.has(src.name);
        }),
        source: { graph, node: n, nameOf: (v) => names[v] },
      });
      outs = results.map((r, k) => (rule.exact ? r : conform(b, r, graph.values[n.results[k]!]!.type.dtype)));
    } catch (e) {
      if (e instanceof StageError && e.at !== undefined) throw e;
      const code = e instanceof OnnxLowerError ? e.code : OnnxCode.BAD_GRAPH;
      const msg = errorMessage(e);
      throw new OnnxLowerError(code, `lowering ${opDef(n.op).name} (%${String(at.value)}) failed: ${msg}`, { at, cause: e });
    }
    n.results.forEach((v, k) => {
      const want = outputNameOf.get(v) ?? graph.values[v]!.name;
      const own = outputOwner.get(want) === v;
      const target = own ? want : b.reserve(want) ? want : b.fresh(want);
      // Give the result the IR value's name: rename the tensor this step produced, or copy a reused one.
      if (b.isShared(outs[k]!) || !renameSince(b.nodes, start, outs[k]!, target)) b.emitTo('Identity', [outs[k]!], [target]);
      names[v] = target;
    });
  });
  b.setScope('outputs');
  for (const o of graph.outputs) {
    const name = names[o.value]!;
    if (name !== o.name) b.emitTo('Identity', [name], [o.name]);
  }
  pruneDead(b.nodes, graph.outputs.map((o) => o.name));
  return {
    name: graph.name,
    opset: ONNX_OPSET,
    nodes: b.nodes,
    initializers: b.initializers,
    inputs,
    outputs: graph.outputs.map((o) => spec(o.name, graph.values[o.value]!.type)),
  };
}
