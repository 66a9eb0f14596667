import {
  type Dim,
  type Graph,
  type OpKey,
  type OpNode,
  type TensorType,
  type ValueId,
  dimProduct,
  dimToString,
  isStaticDim,
  loraLinearOperands,
  valueUsers,
} from '@stageml/ir';
import type {
  BankGatheredKernel,
  BankGroup,
  BankGroupedKernel,
  KernelCommon,
  LoraFactors,
  LoraLinearKernel,
  MoeLoraKernel,
  PatternRejection,
  Recognition,
  ResidualKernel,
} from './kernel-types.js';
import { type FoldedServingOps, foldServingOps } from './serving-rules.js';

/** A kernel dim the kernels specialize on is symbolic: control flow, caught by `recognizeResidual`. */
class SymbolicDim extends Error {}

function staticDim(d: Dim | undefined, what: string): number {
  if (d !== undefined && isStaticDim(d)) return d;
  throw new SymbolicDim(`${what} is ${d === undefined ? 'missing' : dimToString(d)}: kernels specialize on it, so it must be static`);
}

/** The folded graph's op nodes, read by value (what each kernel reader needs of it). */
class OpView {
  readonly uses: number[];
  readonly outputNames: Map<ValueId, string>;
  constructor(readonly g: Graph) {
    this.uses = valueUsers(g).map((u) => u.length);
    for (const o of g.outputs) this.uses[o.value]! += 1;
    this.outputNames = new Map([...g.outputs].reverse().map((o) => [o.value, o.name]));
  }
  /** The op node defining `v` and its index, or undefined for leaves. */
  op(v: ValueId): { readonly node: OpNode; readonly index: number } | undefined {
    const index = this.g.values[v]!.node;
    const node = this.g.nodes[index]!;
    return node.kind === 'op' ? { node, index } : undefined;
  }
  type(v: ValueId): TensorType {
    return this.g.values[v]!.type;
  }
  name(v: ValueId): string {
    return this.g.values[v]!.name;
  }
  /** Fields every kernel has; `nodes` are the folded graph's (mapped to the input's later). */
  common(out: ValueId, x: ValueId, nodes: readonly number[], kind: string, wOut: Dim | undefined, wIn: Dim | undefined): KernelCommon {
    const outDim = staticDim(wOut, `output dim of ${this.name(out)}`);
    const inDim = staticDim(wIn, `input dim of ${this.name(out)}`);
    const rows = dimToString(dimProduct(this.type(x).shape.slice(0, -1)));
    // NOTE: a kernel computing a graph output is named after the output (stable across rewrites).
    const name = `${kind}_${this.outputNames.get(out) ?? this.name(out)}`.replace(/[^A-Za-z0-9_]/g, '_').toLowerCase();
    return { name, output: this.name(out), dtype: this.type(out).dtype, inDim, outDim, rows, x: this.name(x), nodes };
  }
  /** LoRA factors A, B (rank on `rankAxis` of A) with a scale and an optional bias of B. */
  factors(a: ValueId, b: ValueId, rankAxis: number, scale: number, biasB?: ValueId): LoraFactors {
    const rank = staticDim(this.type(a).shape[rankAxis], `rank of ${this.name(a)}`);
    return { a: this.name(a), b: this.name(b), rank, scale, ...(biasB === undefined ? {} : { biasB: this.name(biasB) }) };
  }
}

/** A `linear` op (plain) or a `loraLinear` op: one LoRA-linear kernel. */
function readLinear(v: OpView, root: ValueId, n: OpNode, index: number): LoraLinearKernel {
  if (n.op === 'linear') {
    const [x, w, bias] = n.operands as [ValueId, ValueId, ValueId | undefined];
    const wt = v.type(w).shape;
    return { kind: 'loraLinear', ...v.common(root, x, [index], 'linear', wt[0], wt[1]), w: v.name(w), ...(bias === undefined ? {} : { bias: v.name(bias) }) };
  }
  const t = loraLinearOperands(n.operands, n.attrs['loraBias'] === true);
  const wt = v.type(t.w).shape;
  const lora = v.factors(t.A, t.B, 0, n.attrs['scale'] as number, t.biasB);
  return {
    kind: 'loraLinear',
    ...v.common(root, t.x, [index], 'lora_linear', wt[0], wt[1]),
    w: v.name(t.w),
    ...(t.bias === undefined ? {} : { bias: v.name(t.bias) }),
    lora,
  };
}

/**
 * A chain of `loraScatterAdd` steps over one x whose accumulator starts at `linear(x, W[, b])`,
 * every step but the last and the linear read only by the next: one SGMV kernel (groups in graph
 * order, ranks may differ); undefined for any other shape.
 */
function readBankGrouped(v: OpView, root: ValueId): BankGroupedKernel | undefined {
  const groups: BankGroup[] = [];
  const nodes: number[] = [];
  let cur = root;
  let x: ValueId | undefined;
  for (let p = v.op(cur); p?.node.op === 'loraScatterAdd'; p = v.op(cur)) {
    const [acc, src, rows, a, b, biasB] = p.node.operands as [ValueId, ValueId, ValueId, ValueId, ValueId, ValueId | undefined];
    if ((cur !== root && v.uses[cur] !== 1) || (x !== undefined && src !== x)) return undefined;
    x = src;
    groups.unshift({ ...v.factors(a, b, 0, p.node.attrs['scale'] as number, biasB), rowsValue: v.name(rows) });
    nodes.push(p.index);
    cur = acc;
  }
  const base = v.op(cur);
  if (x === undefined || base?.node.op !== 'linear' || v.uses[cur] !== 1 || base.node.operands[0] !== x || v.type(x).shape.length !== 2) return undefined;
  const [, w, bias] = base.node.operands as [ValueId, ValueId, ValueId | undefined];
  const wt = v.type(w).shape;
  nodes.push(base.index);
  return {
    kind: 'bankGrouped',
    ...v.common(root, x, nodes, 'lora_bank', wt[0], wt[1]),
    w: v.name(w),
    ...(bias === undefined ? {} : { bias: v.name(bias) }),
    groups,
  };
}

/** A `gatheredLoraLinear` op: one BGMV kernel. */
function readBankGathered(v: OpView, root: ValueId, n: OpNode, index: number): BankGatheredKernel {
  const [x, w, a, b, scales, ids, bias] = n.operands as [ValueId, ValueId, ValueId, ValueId, ValueId, ValueId, ValueId | undefined];
  const xt = v.type(x).shape;
  const at = v.type(a).shape;
  const wt = v.type(w).shape;
  return {
    kind: 'bankGathered',
    ...v.common(root, x, [index], 'lora_bgmv', wt[0], wt[1]),
    w: v.name(w),
    ...(bias === undefined ? {} : { bias: v.name(bias) }),
    a: v.name(a),
    b: v.name(b),
    scales: v.name(scales),
    ids: v.name(ids),
    numAdapters: staticDim(at[0], `adapter count of ${v.name(a)}`),
    rank: staticDim(at[1], `rank of ${v.name(a)}`),
    rowsPerId: staticDim(dimProduct(xt.slice(1, -1)), `rows per adapter id of ${v.name(x)}`),
  };
}

/** A `groupedMatmul` (base experts only) or `groupedLoraMatmul` op: one MoE kernel. */
function readMoe(v: OpView, root: ValueId, n: OpNode, index: number): MoeLoraKernel {
  const [x, w, ...rest] = n.operands as [ValueId, ValueId, ...ValueId[]];
  const withLora = n.op === 'groupedLoraMatmul';
  const groups = rest[rest.length - 1]!;
  const transposeW = n.attrs['transposeW'] === true;
  const wt = v.type(w).shape;
  const [outD, inD] = transposeW ? [wt[1], wt[2]] : [wt[2], wt[1]];
  const lora = withLora ? v.factors(rest[0]!, rest[1]!, 1, n.attrs['scale'] as number) : undefined;
  return {
    kind: 'moeLora',
    ...v.common(root, x, [index], withLora ? 'moe_lora' : 'moe', outD, inD),
    w: v.name(w),
    transposeW,
    experts: v.name(groups),
    numExperts: staticDim(wt[0], `expert count of ${v.name(w)}`),
    ...(lora === undefined ? {} : { lora }),
  };
}

/** Reads the kernel an op node of the folded graph roots (undefined: the node roots none). */
type KernelReader = (v: OpView, root: ValueId, n: OpNode, index: number) => ResidualKernel | undefined;

// NOTE: not a backend table (those are exhaustive over `OPS`): the few ops a kernel is read from.
/** The ops that root a kernel, each with its reader; every other op is left to the host. */
const KERNEL_READERS: Partial<Readonly<Record<OpKey, KernelReader>>> = {
  linear: readLinear,
  loraLinear: readLinear,
  loraScatterAdd: (v, root) => readBankGrouped(v, root),
  gatheredLoraLinear: readBankGathered,
  groupedMatmul: readMoe,
  groupedLoraMatmul: readMoe,
};

/** Where the nodes of a folded graph come from in the graph that was folded. */
interface Origins {
  /** Per folded node, the input's nodes it stands for. */
  readonly nodes: readonly (readonly number[])[];
  /** Per folded node, the input's node that defines its value (its root, for a folded chain). */
  readonly root: readonly number[];
}

/**
 * For each node of `folded`, the nodes of `g` it stands for: a folded serving op the chain its rule
 * matched (plus the scale constant the chain's `mul` read), every other node the node of `g` that
 * defines the same value name (the fold keeps names, and names its replacement after the root).
 */
function originsOf(g: Graph, folded: FoldedServingOps): Origins {
  if (folded.graph === g) return { nodes: g.nodes.map((_, i) => [i]), root: g.nodes.map((_, i) => i) };
  const byName = new Map<string, number>();
  for (const val of g.values) byName.set(val.name, val.node);
  const isConstant = (i: number): boolean => {
    const n = g.nodes[i]!;
    return n.kind === 'op' && n.op === 'constant';
  };
  const chains = new Map<string, number[]>();
  for (const e of folded.log) {
    const matched = e.matched.filter((i) => i < g.nodes.length);
    const scales = matched.flatMap((i) => {
      const n = g.nodes[i]!;
      return n.kind === 'op' && n.op === 'mul' ? n.operands.map((o) => g.values[o]!.node).filter((p) => !matched.includes(p) && isConstant(p)) : [];
    });
    chains.set(e.node, [...new Set([...matched, ...scales])]);
  }
  const names = folded.graph.nodes.map((n) => folded.graph.values[n.results[0]!]!.name);
  return {
    nodes: names.map((name) => {
      const i = byName.get(name);
      return chains.get(name) ?? (i === undefined ? [] : [i]);
    }),
    root: names.map((name, i) => byName.get(name) ?? i),
  };
}

/**
 * Finds the kernel-sized pieces of a residual graph by reading op nodes: it first folds the
 * residual's primitive chains into the IR's serving ops (`foldServingOps`; a bundle `stageml stage`
 * wrote is folded already), then reads a `loraLinear` op or a lone `linear` as a LoRA-linear
 * kernel, a chain of `loraScatterAdd` steps over the linear of the same x as an SGMV bank, a
 * `gatheredLoraLinear` op as a BGMV bank and a `groupedLoraMatmul` (or lone `groupedMatmul`) op as
 * a MoE expert GEMM. Roots are read from the last node back, so an SGMV chain claims its base
 * linear. Kernel nodes, `uncovered` and `rejected` are indices into `g` itself (a folded op
 * reports the nodes of the chain it replaced). Never throws for a graph it cannot read: a kernel
 * whose specialized dims are symbolic is reported in `rejected`, and op nodes no kernel covers in
 * `uncovered`.
 */
export function recognizeResidual(g: Graph): Recognition {
  const folded = foldServingOps(g);
  const fg = folded.graph;
  const origins = originsOf(g, folded);
  const v = new OpView(fg);
  const claimed = new Set<number>();
  const kernels: ResidualKernel[] = [];
  const rejected: PatternRejection[] = [];
  const toInput = (nodes: readonly number[]): number[] => [...new Set(nodes.flatMap((i) => origins.nodes[i]!))].sort((p, q) => p - q);
  for (let i = fg.nodes.length - 1; i >= 0; i--) {
    const node = fg.nodes[i]!;
    if (node.kind !== 'op' || claimed.has(i) || node.results.length !== 1) continue;
    const root = node.results[0]!;
    try {
      const k = KERNEL_READERS[node.op]?.(v, root, node, i);
      if (k === undefined || k.nodes.some((n) => claimed.has(n))) continue;
      for (const n of k.nodes) claimed.add(n);
      kernels.push({ ...k, nodes: toInput(k.nodes) });
    } catch (e) {
      if (!(e instanceof SymbolicDim)) throw e;
      rejected.push({ node: origins.root[i]!, value: v.name(root), message: e.message });
    }
  }
  const covered = new Set(kernels.flatMap((k) => k.nodes));
  const uncovered = g.nodes.flatMap((n, i) => (n.kind === 'op' && !covered.has(i) ? [i] : []));
  // Graph order of the outputs (in `g`), and names made unique in that order.
  const ordered = kernels.sort((p, q) => Math.max(...p.nodes) - Math.max(...q.nodes));
  const names = new Map<string, number>();
  const unique = ordered.map((k) => {
    const seen = names.get(k.name) ?? 0;
    names.set(k.name, seen + 1);
    return seen === 0 ? k : { ...k, name: `${k.name}_${String(seen)}` };
  });
  return { kernels: unique, uncovered, rejected };
}
