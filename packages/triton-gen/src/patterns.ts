import { type Dim, type Graph, type OpKey, type OpNode, type TensorType, dimProduct, dimToString, isStaticDim, valueUsers } from '@stageml/ir';
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
} from './pattern-types.js';

export type {
  BankGatheredKernel,
  BankGroup,
  BankGroupedKernel,
  KernelCommon,
  LoraFactors,
  LoraLinearKernel,
  MoeLoraKernel,
  PatternDType,
  PatternRejection,
  Recognition,
  ResidualKernel,
  ResidualKernelKind,
} from './pattern-types.js';


/** A mismatch inside a matcher: control flow, not an error (caught by `recognizeResidual`). */
class NoMatch extends Error {
  constructor(readonly dynamic?: string) {
    super(dynamic ?? 'no match');
  }
}

function fail(): never {
  throw new NoMatch();
}

function staticDim(d: Dim | undefined, what: string): number {
  if (d === undefined) fail();
  if (!isStaticDim(d)) throw new NoMatch(`${what} is ${dimToString(d)}: kernels specialize on it, so it must be static`);
  return d;
}

/** Read-only view of a graph for matchers. */
class View {
  readonly users: number[][];
  readonly outputs: Set<number>;
  readonly outputNames: Map<number, string>;
  constructor(readonly g: Graph) {
    this.users = valueUsers(g);
    this.outputs = new Set(g.outputs.map((o) => o.value));
    this.outputNames = new Map([...g.outputs].reverse().map((o) => [o.value, o.name]));
  }
  name(v: number): string {
    return this.g.values[v]!.name;
  }
  type(v: number): TensorType {
    return this.g.values[v]!.type;
  }
  nodeOf(v: number): number {
    return this.g.values[v]!.node;
  }
  /** The op node defining `v` if it applies `key`. */
  op(v: number, key: OpKey): { node: OpNode; index: number } | undefined {
    const index = this.nodeOf(v);
    const node = this.g.nodes[index]!;
    return node.kind === 'op' && node.op === key ? { node, index } : undefined;
  }
  need(v: number, key: OpKey, attrs: Record<string, unknown> = {}): { node: OpNode; index: number } {
    const m = this.op(v, key) ?? fail();
    for (const [k, want] of Object.entries(attrs)) if (m.node.attrs[k] !== want) fail();
    return m;
  }
  /** Interior values of a fused pattern may not be read by anything else. */
  private(v: number): void {
    if (this.outputs.has(v) || this.users[v]!.length !== 1) fail();
  }
  /** The value of a scalar `constant` (one element), or undefined. */
  scalar(v: number): { value: number; index: number } | undefined {
    const m = this.op(v, 'constant');
    if (m === undefined) return undefined;
    const value = m.node.attrs['value'] as readonly number[];
    const t = this.type(v);
    if (value.length !== 1 || t.shape.some((d) => d !== 1)) return undefined;
    return { value: value[0]!, index: m.index };
  }
}

interface Delta {
  readonly x: number;
  readonly factors: LoraFactors;
  readonly nodes: number[];
}

/** s·linear(linear(x, A), B, b_B) (either order of the product, or no scale at all). */
function matchLinearDelta(v: View, d: number): Delta {
  const nodes: number[] = [];
  let expandV = d;
  let scale = 1;
  const mul = v.op(d, 'mul');
  if (mul !== undefined) {
    const [p, q] = mul.node.operands as [number, number];
    const sq = v.scalar(q);
    const sp = v.scalar(p);
    if (sq !== undefined) [expandV, scale] = [p, sq.value];
    else if (sp !== undefined) [expandV, scale] = [q, sp.value];
    else fail();
    nodes.push(mul.index, (sq ?? sp)!.index);
    v.private(expandV);
  }
  const expand = v.need(expandV, 'linear');
  const [shrinkV, bV, biasB] = expand.node.operands as [number, number, number | undefined];
  v.private(shrinkV);
  const shrink = v.need(shrinkV, 'linear');
  if (shrink.node.operands.length !== 2) fail();
  const [x, aV] = shrink.node.operands as [number, number];
  nodes.push(expand.index, shrink.index);
  const rank = staticDim(v.type(aV).shape[0], `rank of ${v.name(aV)}`);
  return { x, nodes, factors: { a: v.name(aV), b: v.name(bV), rank, scale, ...(biasB === undefined ? {} : { biasB: v.name(biasB) }) } };
}

interface Base {
  readonly x: number;
  readonly w: number;
  readonly bias: number | undefined;
  readonly index: number;
}

function matchLinear(v: View, b: number): Base {
  const lin = v.need(b, 'linear');
  const [x, w, bias] = lin.node.operands as [number, number, number | undefined];
  return { x, w, bias, index: lin.index };
}

function common(v: View, out: number, x: number, nodes: number[], kind: string, wOut: Dim | undefined, wIn: Dim | undefined): KernelCommon {
  const xt = v.type(x);
  const outDim = staticDim(wOut, `output dim of ${v.name(out)}`);
  const inDim = staticDim(wIn, `input dim of ${v.name(out)}`);
  const rows = dimToString(dimProduct(xt.shape.slice(0, -1)));
  // NOTE: a kernel computing a graph output is named after the output (stable across rewrites).
  const name = `${kind}_${v.outputNames.get(out) ?? v.name(out)}`.replace(/[^A-Za-z0-9_]/g, '_').toLowerCase();
  return { name, output: v.name(out), dtype: v.type(out).dtype, inDim, outDim, rows, x: v.name(x), nodes: [...nodes].sort((p, q) => p - q) };
}

function optional(key: string, v: View, value: number | undefined): Record<string, string> {
  return value === undefined ? {} : { [key]: v.name(value) };
}

/** add(linear(x, W, b), s·linear(linear(x, A), B)) in either order, or a lone linear. */
function matchLoraLinear(v: View, root: number): LoraLinearKernel {
  const add = v.op(root, 'add');
  if (add === undefined) {
    const base = matchLinear(v, root);
    const wt = v.type(base.w).shape;
    return { kind: 'loraLinear', ...common(v, root, base.x, [base.index], 'linear', wt[0], wt[1]), w: v.name(base.w), ...optional('bias', v, base.bias) };
  }
  for (const [p, q] of [add.node.operands, [...add.node.operands].reverse()] as [number, number][]) {
    try {
      v.private(p);
      v.private(q);
      const base = matchLinear(v, p);
      const delta = matchLinearDelta(v, q);
      if (delta.x !== base.x) fail();
      const wt = v.type(base.w).shape;
      const nodes = [add.index, base.index, ...delta.nodes];
      return { kind: 'loraLinear', ...common(v, root, base.x, nodes, 'lora_linear', wt[0], wt[1]), w: v.name(base.w), ...optional('bias', v, base.bias), lora: delta.factors };
    } catch (e) {
      if (!(e instanceof NoMatch) || e.dynamic !== undefined) throw e;
    }
  }
  return fail();
}

/** scatterAdd(…scatterAdd(linear(x, W, b), rows_0, Δ_0)…, rows_k, Δ_k), Δ_g on indexSelect(x, rows_g). */
function matchBankGrouped(v: View, root: number): BankGroupedKernel {
  const groups: BankGroup[] = [];
  const nodes: number[] = [];
  let cur = root;
  let x: number | undefined;
  for (let s = v.op(cur, 'scatterAdd'); s !== undefined; s = v.op(cur, 'scatterAdd')) {
    if (s.node.attrs['axis'] !== 0) fail();
    const [acc, rows, upd] = s.node.operands as [number, number, number];
    v.private(upd);
    const delta = matchLinearDelta(v, upd);
    v.private(delta.x);
    const sel = v.need(delta.x, 'indexSelect', { axis: 0 });
    const [src, selRows] = sel.node.operands as [number, number];
    if (selRows !== rows || (x !== undefined && src !== x)) fail();
    x = src;
    groups.unshift({ ...delta.factors, rowsValue: v.name(rows) });
    nodes.push(s.index, sel.index, ...delta.nodes);
    if (cur !== root) v.private(cur);
    cur = acc;
  }
  if (groups.length === 0) fail();
  v.private(cur);
  const base = matchLinear(v, cur);
  if (base.x !== x || v.type(base.x).shape.length !== 2) fail();
  nodes.push(base.index);
  const wt = v.type(base.w).shape;
  return { kind: 'bankGrouped', ...common(v, root, base.x, nodes, 'lora_bank', wt[0], wt[1]), w: v.name(base.w), ...optional('bias', v, base.bias), groups };
}

/** add(linear(x, W, b), matmul(matmul(x, gather(A, ids)ᵀ), gather(B, ids)ᵀ) · reshape(gather(S, ids))). */
function matchBankGathered(v: View, root: number): BankGatheredKernel {
  const add = v.need(root, 'add');
  for (const [p, q] of [add.node.operands, [...add.node.operands].reverse()] as [number, number][]) {
    try {
      v.private(p);
      v.private(q);
      const base = matchLinear(v, p);
      const mul = v.need(q, 'mul');
      const [expandV, scaleV] = mul.node.operands as [number, number];
      for (const u of [expandV, scaleV]) v.private(u);
      const expand = v.need(expandV, 'matmul', { transposeA: false, transposeB: true });
      const [shrinkV, bRows] = expand.node.operands as [number, number];
      v.private(shrinkV);
      const shrink = v.need(shrinkV, 'matmul', { transposeA: false, transposeB: true });
      const [x, aRows] = shrink.node.operands as [number, number];
      if (x !== base.x) fail();
      const ga = v.need(aRows, 'gather', { axis: 0 });
      const gb = v.need(bRows, 'gather', { axis: 0 });
      const reshape = v.need(scaleV, 'reshape');
      v.private(reshape.node.operands[0]!);
      const gs = v.need(reshape.node.operands[0]!, 'gather', { axis: 0 });
      const ids = ga.node.operands[1]!;
      if (gb.node.operands[1] !== ids || gs.node.operands[1] !== ids) fail();
      for (const u of [aRows, bRows]) v.private(u);
      const [aStack, bStack, sStack] = [ga.node.operands[0]!, gb.node.operands[0]!, gs.node.operands[0]!];
      const at = v.type(aStack).shape;
      const xt = v.type(x).shape;
      if (at.length !== 3 || xt.length < 3) fail();
      const rowsPerId = staticDim(dimProduct(xt.slice(1, -1)), `rows per adapter id of ${v.name(x)}`);
      const wt = v.type(base.w).shape;
      const nodes = [add.index, base.index, mul.index, expand.index, shrink.index, ga.index, gb.index, gs.index, reshape.index];
      return {
        kind: 'bankGathered',
        ...common(v, root, x, nodes, 'lora_bgmv', wt[0], wt[1]),
        w: v.name(base.w),
        ...optional('bias', v, base.bias),
        a: v.name(aStack),
        b: v.name(bStack),
        scales: v.name(sStack),
        ids: v.name(ids),
        numAdapters: staticDim(at[0], `adapter count of ${v.name(aStack)}`),
        rank: staticDim(at[1], `rank of ${v.name(aStack)}`),
        rowsPerId,
      };
    } catch (e) {
      if (!(e instanceof NoMatch) || e.dynamic !== undefined) throw e;
    }
  }
  return fail();
}

/** groupedMatmul(x, W, g) [+ s·groupedMatmul(groupedMatmul(x, A, g), B, g)]. */
function matchMoe(v: View, root: number): MoeLoraKernel {
  const build = (baseV: number, lora: { factors: LoraFactors; nodes: number[] } | undefined, extra: number[]): MoeLoraKernel => {
    const base = v.need(baseV, 'groupedMatmul');
    const [x, w, g] = base.node.operands as [number, number, number];
    const transposeW = base.node.attrs['transposeW'] === true;
    const wt = v.type(w).shape;
    const [outD, inD] = transposeW ? [wt[1], wt[2]] : [wt[2], wt[1]];
    const kind = lora === undefined ? 'moe' : 'moe_lora';
    return {
      kind: 'moeLora',
      ...common(v, root, x, [base.index, ...extra, ...(lora?.nodes ?? [])], kind, outD, inD),
      w: v.name(w),
      transposeW,
      experts: v.name(g),
      numExperts: staticDim(wt[0], `expert count of ${v.name(w)}`),
      ...(lora === undefined ? {} : { lora: lora.factors }),
    };
  };
  const add = v.op(root, 'add');
  if (add === undefined) return build(root, undefined, []);
  for (const [p, q] of [add.node.operands, [...add.node.operands].reverse()] as [number, number][]) {
    try {
      v.private(p);
      v.private(q);
      const base = v.need(p, 'groupedMatmul');
      const [x, , g] = base.node.operands as [number, number, number];
      const mul = v.need(q, 'mul');
      const [e, s] = mul.node.operands as [number, number];
      const sc = v.scalar(s) ?? fail();
      v.private(e);
      const expand = v.need(e, 'groupedMatmul', { transposeW: true });
      v.private(expand.node.operands[0]!);
      const shrink = v.need(expand.node.operands[0]!, 'groupedMatmul', { transposeW: true });
      if (shrink.node.operands[0] !== x || shrink.node.operands[2] !== g || expand.node.operands[2] !== g) fail();
      const aV = shrink.node.operands[1]!;
      const rank = staticDim(v.type(aV).shape[1], `rank of ${v.name(aV)}`);
      const factors: LoraFactors = { a: v.name(aV), b: v.name(expand.node.operands[1]!), rank, scale: sc.value };
      return build(p, { factors, nodes: [mul.index, sc.index, expand.index, shrink.index] }, [add.index]);
    } catch (err) {
      if (!(err instanceof NoMatch) || err.dynamic !== undefined) throw err;
    }
  }
  return fail();
}

function isConstant(n: Graph['nodes'][number] | undefined): boolean {
  return n?.kind === 'op' && n.op === 'constant';
}

const MATCHERS: readonly ((v: View, root: number) => ResidualKernel)[] = [matchBankGrouped, matchBankGathered, matchLoraLinear, matchMoe];

/**
 * Finds the kernel-sized patterns of a residual graph: fused LoRA linears (and plain linears),
 * SGMV banks (`bankLinearGrouped`), BGMV banks (`bankLinearGathered`) and MoE expert GEMMs with
 * or without expert LoRA (`moeBlock`'s `groupedMatmul` triples). Roots are tried from the last
 * node back, so the largest pattern wins; interior values of a match must have no other reader.
 * Scale factors must be scalar constants. Never throws for a non-matching graph: dropped matches
 * are returned in `rejected`, and nodes no kernel covers in `uncovered`.
 */
export function recognizeResidual(g: Graph): Recognition {
  const v = new View(g);
  const covered = new Set<number>();
  const kernels: ResidualKernel[] = [];
  const rejected: PatternRejection[] = [];
  for (let i = g.nodes.length - 1; i >= 0; i--) {
    const node = g.nodes[i]!;
    if (node.kind !== 'op' || covered.has(i) || node.results.length !== 1) continue;
    const root = node.results[0]!;
    for (const match of MATCHERS) {
      try {
        const k = match(v, root);
        if (k.nodes.some((n) => covered.has(n) && !isConstant(g.nodes[n]))) continue;
        for (const n of k.nodes) covered.add(n);
        kernels.push(k);
        break;
      } catch (e) {
        if (!(e instanceof NoMatch)) throw e;
        if (e.dynamic !== undefined) {
          rejected.push({ node: i, value: v.name(root), message: e.dynamic });
          break;
        }
      }
    }
  }
  const uncovered = g.nodes.flatMap((n, i) => (n.kind === 'op' && !covered.has(i) ? [i] : []));
  const names = new Map<string, number>();
  const unique = kernels.reverse().map((k) => {
    const seen = names.get(k.name) ?? 0;
    names.set(k.name, seen + 1);
    return seen === 0 ? k : { ...k, name: `${k.name}_${String(seen)}` };
  });
  return { kernels: unique, uncovered, rejected };
}
