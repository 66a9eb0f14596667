import { type AttrsOf, type Dim, type GraphBuilder, type Value, dimEquals, dimProduct } from '@stageml/ir';
import { m } from '../pattern.js';
import { type Rule, type RuleContext, rule } from '../rule.js';

/** Longest chain considered (the dynamic program is cubic in it). */
const MAX_FACTORS = 8;

/** One factor of a product chain: a value, used transposed or not. */
interface Factor {
  readonly v: Value;
  readonly transposed: boolean;
}

/** A parenthesization: a factor index, or the product of two sub-trees. */
type Tree = number | readonly [Tree, Tree];

/** A product chain and its best order. */
export interface ChainPlan {
  /** Factors, left to right; only the first may have batch axes. */
  readonly factors: readonly Factor[];
  /** Per-request FLOPs of the current order. */
  readonly current: number;
  /** Per-request FLOPs of the best order. */
  readonly best: number;
  /** The best order. */
  readonly tree: Tree;
}

/**
 * Flattens the product rooted at `root` (through `matmul` and bias-free `linear` nodes that have no
 * other users) into factors and the current parenthesization. The first factor may carry batch
 * axes (its rows then count once per batch element); every other factor must be a matrix.
 */
function flatten(root: Value, ctx: RuleContext): { factors: Factor[]; tree: Tree } | undefined {
  const factors: Factor[] = [];
  const leaf = (v: Value, transposed: boolean): number => factors.push({ v, transposed }) - 1;
  const walk = (v: Value, isRoot: boolean, leftmost: boolean): Tree => {
    // NOTE: `opOf` first: most operands are not products, and `def` allocates.
    const op = ctx.opOf(v);
    if ((op !== 'matmul' && op !== 'linear') || (!isRoot && ctx.uses(v) !== 1) || (!leftmost && v.type.shape.length !== 2) || factors.length >= MAX_FACTORS - 1) return leaf(v, false);
    const d = ctx.def(v)!;
    if (d.op === 'matmul') {
      const at = d.attrs as AttrsOf<'matmul'>;
      const l = at.transposeA ? leaf(d.operands[0]!, true) : walk(d.operands[0]!, false, leftmost);
      const r = at.transposeB ? leaf(d.operands[1]!, true) : walk(d.operands[1]!, false, false);
      return [l, r];
    }
    if (d.op === 'linear' && d.operands.length === 2) {
      const l = walk(d.operands[0]!, false, leftmost);
      return [l, leaf(d.operands[1]!, true)];
    }
    return leaf(v, false);
  };
  const tree = walk(root, true, true);
  if (factors.length < 3 || factors[0]!.v.type.shape.length < 2) return undefined;
  if (factors.slice(1).some((f) => f.v.type.shape.length !== 2)) return undefined;
  return { factors, tree };
}

function rowsCols(f: Factor): [Dim, Dim] {
  const s = f.v.type.shape;
  const r = s[s.length - 2]!;
  const c = s[s.length - 1]!;
  return f.transposed ? [c, r] : [r, c];
}

/**
 * The best order of the product chain rooted at `root`, by the classic matrix-chain dynamic
 * program on per-request FLOPs (Cormen et al., §15.2): dims are evaluated at the context's sizes,
 * and a sub-product of static factors costs nothing per request (it is folded ahead of time).
 */
export function planChain(root: Value, ctx: RuleContext): ChainPlan | undefined {
  const flat = flatten(root, ctx);
  if (flat === undefined) return undefined;
  const { factors } = flat;
  const n = factors.length;
  const dims: number[] = [];
  const symbolic: Dim[] = [rowsCols(factors[0]!)[0]];
  for (let i = 0; i < n; i++) {
    const [r, c] = rowsCols(factors[i]!);
    if (!dimEquals(r, symbolic[i]!)) return undefined;
    symbolic.push(c);
  }
  for (const d of symbolic) dims.push(ctx.size(d));
  const batch = ctx.size(dimProduct(factors[0]!.v.type.shape.slice(0, -2)));
  const isStatic = factors.map((f) => ctx.isStatic(f.v));
  const allStatic = (i: number, j: number): boolean => isStatic.slice(i, j + 1).every(Boolean);
  const mulCost = (i: number, k: number, j: number): number =>
    allStatic(i, j) ? 0 : 2 * (i === 0 ? batch : 1) * dims[i]! * dims[k + 1]! * dims[j + 1]!;
  const best: number[][] = Array.from({ length: n }, () => new Array<number>(n).fill(0));
  const split: number[][] = Array.from({ length: n }, () => new Array<number>(n).fill(0));
  for (let len = 2; len <= n; len++) {
    for (let i = 0; i + len - 1 < n; i++) {
      const j = i + len - 1;
      best[i]![j] = Number.POSITIVE_INFINITY;
      for (let k = i; k < j; k++) {
        const c = best[i]![k]! + best[k + 1]![j]! + mulCost(i, k, j);
        if (c < best[i]![j]!) {
          best[i]![j] = c;
          split[i]![j] = k;
        }
      }
    }
  }
  const costOf = (t: Tree): { cost: number; lo: number; hi: number } => {
    if (typeof t === 'number') return { cost: 0, lo: t, hi: t };
    const l = costOf(t[0]);
    const r = costOf(t[1]);
    return { cost: l.cost + r.cost + mulCost(l.lo, l.hi, r.hi), lo: l.lo, hi: r.hi };
  };
  const treeOf = (i: number, j: number): Tree => (i === j ? i : [treeOf(i, split[i]![j]!), treeOf(split[i]![j]! + 1, j)]);
  return { factors, current: costOf(flat.tree).cost, best: best[0]![n - 1]!, tree: treeOf(0, n - 1) };
}

function buildTree(t: Tree, plan: ChainPlan, b: GraphBuilder, ctx: RuleContext): Factor {
  if (typeof t === 'number') {
    const f = plan.factors[t]!;
    return { v: ctx.handle(f.v), transposed: f.transposed };
  }
  const l = buildTree(t[0], plan, b, ctx);
  const r = buildTree(t[1], plan, b, ctx);
  return { v: b.matmul(l.v, r.v, { transposeA: l.transposed, transposeB: r.transposed }), transposed: false };
}

// NOTE: "better" is strict beyond rounding, so a chain already in its best order never fires again.
const improves = (p: ChainPlan | undefined): boolean => p !== undefined && p.best < p.current * (1 - 1e-9);

function chainRule(anchor: 'matmul' | 'linear'): Rule {
  return rule({
    name: `${anchor}.reorder-chain`,
    identity: 'M₁·M₂·…·Mₙ re-parenthesized by the matrix-chain DP (associativity of the product)',
    conditions:
      'a chain of ≥ 3 factors through single-use matmul/linear nodes; only the first factor has batch axes; fires when the best order has fewer per-request FLOPs (static sub-products are free), then cost-checked',
    match: m.op(anchor, m.any(), m.any(), { as: 'root' }),
    when: ({ root }, ctx) => improves(planChain(root, ctx)),
    build: ({ root }, b, ctx) => {
      const plan = planChain(root, ctx);
      return plan === undefined ? undefined : buildTree(plan.tree, plan, b, ctx).v;
    },
    costGuard: 'improving',
  });
}

/** Matrix-chain ordering rooted at a `matmul`: (x·M₁)·M₂ ⇄ x·(M₁·M₂) and longer chains, by FLOPs. */
export const matmulReorderChain: Rule = chainRule('matmul');

/** Matrix-chain ordering rooted at a `linear` (x·Wᵀ is a chain factor Wᵀ). */
export const linearReorderChain: Rule = chainRule('linear');
