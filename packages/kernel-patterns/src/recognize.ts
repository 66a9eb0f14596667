import { type Dim, type Graph, type TensorType, type ValueId, dimProduct, dimToString, isStaticDim, valueUsers } from '@stageml/ir';
import { type MatchResult, type MatchView, type Pattern, matchPattern } from '@stageml/rewrite';
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
import { BANK_GATHERED, BANK_GROUP_STEP, BASE_LINEAR, LORA_LINEAR, MOE_LORA } from './shapes.js';

/** A structural match whose kernel cannot be built: control flow, caught by `recognizeResidual`. */
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

/** A read-only `MatchView` of a whole graph (no binding times: kernel shapes do not need them). */
class GraphView implements MatchView {
  readonly uses: number[];
  readonly outputNames: Map<number, string>;
  constructor(readonly g: Graph) {
    this.uses = valueUsers(g).map((u) => u.length);
    for (const o of g.outputs) this.uses[o.value]! += 1;
    this.outputNames = new Map([...g.outputs].reverse().map((o) => [o.value, o.name]));
  }
  producer(v: ValueId): ReturnType<MatchView['producer']> {
    const index = this.g.values[v]!.node;
    const n = this.g.nodes[index]!;
    return n.kind === 'op' ? { op: n.op, operands: n.operands, attrs: n.attrs, node: index } : undefined;
  }
  useCount(v: ValueId): number {
    return this.uses[v]!;
  }
  isStatic(): boolean {
    return false;
  }
  type(v: ValueId): TensorType {
    return this.g.values[v]!.type;
  }
  splat(v: ValueId): number | undefined {
    const p = this.producer(v);
    const value = p?.attrs['value'];
    if (!Array.isArray(value) || value.length === 0) return undefined;
    const first = value[0] as number;
    return value.every((e) => Object.is(e, first) || e === first) ? first : undefined;
  }
  name(v: ValueId): string {
    return this.g.values[v]!.name;
  }
  /** The node index of the scale constant when `v` is a one-element constant, else undefined. */
  scalarNode(v: ValueId): number | undefined {
    const p = this.producer(v);
    const value = p?.op === 'constant' ? (p.attrs['value'] as readonly number[]) : undefined;
    return value?.length === 1 && this.type(v).shape.every((d) => d === 1) ? p!.node : undefined;
  }
}

/** Captures of a match, read by name. */
class Bound {
  constructor(
    readonly v: GraphView,
    readonly r: MatchResult,
  ) {}
  get(name: string): ValueId {
    return this.r.captures.get(name) ?? fail();
  }
  has(name: string): boolean {
    return this.r.captures.has(name);
  }
  name(capture: string): string {
    return this.v.name(this.get(capture));
  }
  optional(key: string, capture: string): Record<string, string> {
    return this.has(capture) ? { [key]: this.name(capture) } : {};
  }
  /** Op nodes of the match plus the scale constant, when there is one. */
  nodes(): number[] {
    const scale = this.has('scale') ? this.v.scalarNode(this.get('scale')) : undefined;
    return scale === undefined ? [...this.r.nodes] : [...this.r.nodes, scale];
  }
  /** Whether a captured scale (if any) is a one-element constant, as the kernels require. */
  scaleIsScalar(): boolean {
    return !this.has('scale') || this.v.scalarNode(this.get('scale')) !== undefined;
  }
  factors(rankAxis: number): LoraFactors {
    const a = this.get('a');
    const rank = staticDim(this.v.type(a).shape[rankAxis], `rank of ${this.v.name(a)}`);
    return {
      a: this.v.name(a),
      b: this.name('b'),
      rank,
      scale: this.has('scale') ? this.v.splat(this.get('scale'))! : 1,
      ...this.optional('biasB', 'biasB'),
    };
  }
}

/** The first match of `p` at `root` that `build` accepts (returns a kernel for); `build` may throw `NoMatch`. */
function first<K>(v: GraphView, p: Pattern, root: ValueId, build: (b: Bound) => K | undefined): K {
  let out: K | undefined;
  matchPattern(v, p, root, (r) => {
    const b = new Bound(v, r);
    if (!b.scaleIsScalar()) return false;
    out = build(b);
    return out !== undefined;
  });
  return out ?? fail();
}

function common(v: GraphView, out: ValueId, x: ValueId, nodes: readonly number[], kind: string, wOut: Dim | undefined, wIn: Dim | undefined): KernelCommon {
  const xt = v.type(x);
  const outDim = staticDim(wOut, `output dim of ${v.name(out)}`);
  const inDim = staticDim(wIn, `input dim of ${v.name(out)}`);
  const rows = dimToString(dimProduct(xt.shape.slice(0, -1)));
  // NOTE: a kernel computing a graph output is named after the output (stable across rewrites).
  const name = `${kind}_${v.outputNames.get(out) ?? v.name(out)}`.replace(/[^A-Za-z0-9_]/g, '_').toLowerCase();
  return { name, output: v.name(out), dtype: v.type(out).dtype, inDim, outDim, rows, x: v.name(x), nodes: [...nodes].sort((p, q) => p - q) };
}

function matchLoraLinear(v: GraphView, root: ValueId): LoraLinearKernel {
  return first(v, LORA_LINEAR, root, (b) => {
    const wt = v.type(b.get('w')).shape;
    if (!b.has('a')) {
      return { kind: 'loraLinear', ...common(v, root, b.get('x'), b.nodes(), 'linear', wt[0], wt[1]), w: b.name('w'), ...b.optional('bias', 'bias') };
    }
    const lora = b.factors(0);
    return { kind: 'loraLinear', ...common(v, root, b.get('x'), b.nodes(), 'lora_linear', wt[0], wt[1]), w: b.name('w'), ...b.optional('bias', 'bias'), lora };
  });
}

/** A `loraLinear` op (what `foldServingOps` makes of the residual LoRA chain): one fused kernel. */
function matchLoraLinearOp(v: GraphView, root: ValueId): LoraLinearKernel {
  const p = v.producer(root);
  if (p?.op !== 'loraLinear') fail();
  const [x, w, a, b] = p.operands as [ValueId, ValueId, ValueId, ValueId];
  const wt = v.type(w).shape;
  const rank = staticDim(v.type(a).shape[0], `rank of ${v.name(a)}`);
  const lora: LoraFactors = { a: v.name(a), b: v.name(b), rank, scale: p.attrs['scale'] as number };
  return { kind: 'loraLinear', ...common(v, root, x, [p.node], 'lora_linear', wt[0], wt[1]), w: v.name(w), lora };
}

function matchBankGrouped(v: GraphView, root: ValueId): BankGroupedKernel {
  const groups: BankGroup[] = [];
  const nodes: number[] = [];
  let cur = root;
  let src: ValueId | undefined;
  while (v.producer(cur)?.op === 'scatterAdd') {
    if (cur !== root && v.useCount(cur) !== 1) fail();
    const step = first(v, BANK_GROUP_STEP, cur, (b) => (src === undefined || b.get('src') === src ? b : undefined));
    src = step.get('src');
    groups.unshift({ ...step.factors(0), rowsValue: step.name('rows') });
    nodes.push(...step.nodes());
    cur = step.get('acc');
  }
  if (groups.length === 0 || v.useCount(cur) !== 1) fail();
  const base = first(v, BASE_LINEAR, cur, (b) => (b.get('x') === src && v.type(src).shape.length === 2 ? b : undefined));
  nodes.push(...base.nodes());
  const wt = v.type(base.get('w')).shape;
  return { kind: 'bankGrouped', ...common(v, root, src!, nodes, 'lora_bank', wt[0], wt[1]), w: base.name('w'), ...base.optional('bias', 'bias'), groups };
}

function matchBankGathered(v: GraphView, root: ValueId): BankGatheredKernel {
  return first(v, BANK_GATHERED, root, (b) => {
    const at = v.type(b.get('aStack')).shape;
    const x = b.get('x');
    const xt = v.type(x).shape;
    if (at.length !== 3 || xt.length < 3) return undefined;
    const rowsPerId = staticDim(dimProduct(xt.slice(1, -1)), `rows per adapter id of ${v.name(x)}`);
    const wt = v.type(b.get('w')).shape;
    return {
      kind: 'bankGathered',
      ...common(v, root, x, b.nodes(), 'lora_bgmv', wt[0], wt[1]),
      w: b.name('w'),
      ...b.optional('bias', 'bias'),
      a: b.name('aStack'),
      b: b.name('bStack'),
      scales: b.name('scales'),
      ids: b.name('ids'),
      numAdapters: staticDim(at[0], `adapter count of ${b.name('aStack')}`),
      rank: staticDim(at[1], `rank of ${b.name('aStack')}`),
      rowsPerId,
    };
  });
}

function matchMoe(v: GraphView, root: ValueId): MoeLoraKernel {
  return first(v, MOE_LORA, root, (b) => {
    const lora = b.has('a') ? b.factors(1) : undefined;
    const w = b.get('w');
    const transposeW = v.producer(b.get('base'))!.attrs['transposeW'] === true;
    const wt = v.type(w).shape;
    const [outD, inD] = transposeW ? [wt[1], wt[2]] : [wt[2], wt[1]];
    return {
      kind: 'moeLora',
      ...common(v, root, b.get('x'), b.nodes(), lora === undefined ? 'moe' : 'moe_lora', outD, inD),
      w: v.name(w),
      transposeW,
      experts: b.name('groups'),
      numExperts: staticDim(wt[0], `expert count of ${v.name(w)}`),
      ...(lora === undefined ? {} : { lora }),
    };
  });
}

function isConstant(n: Graph['nodes'][number] | undefined): boolean {
  return n?.kind === 'op' && n.op === 'constant';
}

const MATCHERS: readonly ((v: GraphView, root: ValueId) => ResidualKernel)[] = [matchLoraLinearOp, matchBankGrouped, matchBankGathered, matchLoraLinear, matchMoe];

/**
 * Finds the kernel-sized patterns of a residual graph: fused LoRA linears (and plain linears),
 * SGMV banks (`bankLinearGrouped`), BGMV banks (`bankLinearGathered`) and MoE expert GEMMs with
 * or without expert LoRA (`moeBlock`'s `groupedMatmul` triples). The shapes are rewrite patterns
 * (`shapes.ts`), so commutative operands match in either order. Roots are tried from the last node
 * back, so the largest pattern wins; interior values of a match must have no other reader. Scale
 * factors must be one-element constants. Never throws for a non-matching graph: dropped matches
 * are returned in `rejected`, and nodes no kernel covers in `uncovered`.
 */
export function recognizeResidual(g: Graph): Recognition {
  const v = new GraphView(g);
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
