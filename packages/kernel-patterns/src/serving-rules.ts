// The rewrite rules that turn residual primitive graphs into the serving ops of the IR registry, so
// that no backend has to recognise primitive patterns: executors lower the ops from their own
// tables (or expand them by `decompose`), and the code generators read them as kernels.
import { type AttrValue, type Graph, type OpKey, StageError, type TensorType, type Value, opDef, typeEquals } from '@stageml/ir';
import { type Pattern, type RewriteLogEntry, type Rule, type RuleContext, type RuleSet, m, rewriteGreedy, rule, ruleSet } from '@stageml/rewrite';

const X = m.capture('x');

// NOTE: the helpers below infer their return types so that rules keep typed captures.

/** linear(src, w[, bias]) with its result captured as `as`. */
function linearMaybeBias<const S extends Pattern, const W extends string, const Bi extends string, const As extends string>(src: S, w: W, bias: Bi, as: As) {
  return m.oneOf(m.op('linear', src, m.capture(w), { as }), m.op('linear', src, m.capture(w), m.capture(bias), { as }));
}

/** s·Δ with the scalar on either side (captured as `scale`, the product as `delta`), or Δ alone. */
function maybeScaled<const E extends Pattern>(expand: E) {
  return m.oneOf(m.commutative('mul', expand, m.scalar(undefined, { as: 'scale' }), { as: 'delta' }), expand);
}

/** PEFT's LoRA delta on `src`: [s·]linear(linear(src, A), B[, biasB]). */
function loraDelta<const S extends Pattern>(src: S) {
  return maybeScaled(linearMaybeBias(m.op('linear', src, m.capture('a'), { as: 'shrink' }), 'b', 'biasB', 'expand'));
}

/**
 * The scale a matched delta applies: 1 when there is no `mul`, else the value of its scalar when
 * that is a one-element constant of the delta's dtype whose rank does not exceed the delta's (so
 * the product keeps the delta's shape); undefined otherwise.
 */
function scaleOf(
  c: { readonly scale?: Value | undefined; readonly expand?: Value | undefined },
  ctx: RuleContext,
  dtype: TensorType['dtype'],
): number | undefined {
  if (c.scale === undefined) return 1;
  const t = c.scale.type;
  if (t.dtype !== dtype || !t.shape.every((d) => d === 1) || (c.expand !== undefined && t.shape.length > c.expand.type.shape.length)) return undefined;
  return ctx.splat(c.scale);
}

/**
 * Whether op `key` accepts these operand types and attributes (`attrs` complete) and infers
 * exactly `root`'s type: a rule folds a chain only into an op that replaces it type for type.
 */
function infersAs(key: OpKey, operands: readonly (Value | undefined)[], attrs: Readonly<Record<string, AttrValue>>, root: Value): boolean {
  try {
    const [t] = opDef(key).infer(
      operands.filter((v) => v !== undefined).map((v) => v.type),
      attrs,
    );
    return t !== undefined && typeEquals(t, root.type);
  } catch (e) {
    if (e instanceof StageError) return false;
    throw e;
  }
}

/** Whether every value has `dtype`. */
function allOf(dtype: TensorType['dtype'], values: readonly (Value | undefined)[]): boolean {
  return values.every((v) => v === undefined || v.type.dtype === dtype);
}

/**
 * x·Wᵀ + bias + s·((x·Aᵀ)·Bᵀ + biasB) → loraLinear(x, W, A, B[, bias][, biasB]){scale: s}: PEFT's
 * LoRA layer in residual form, as `@stageml/peft`'s `loraLinear` builds it, becomes the registry
 * op whose decomposition is this very chain (so the rewrite changes no executor's numerics unless
 * it lowers the op itself).
 */
export const foldLoraLinear: Rule = rule({
  name: 'add.fold-lora-linear',
  identity: 'x·Wᵀ + bias + s·((x·Aᵀ)·Bᵀ + biasB) = loraLinear(x, W, A, B, bias, biasB){scale: s}',
  conditions:
    'the same x in the base and the shrink; bias and biasB optional, s optional (1) and else a one-element constant splat of the operands’ dtype no higher in rank than the delta; A [r, in] and B [out, r] matrices; every value of the chain one dtype; the base, shrink, expand and scaled delta have no other users (else the chain would be computed twice)',
  match: m.commutative('add', linearMaybeBias(X, 'w', 'bias', 'base'), loraDelta(X), { as: 'y' }),
  when: (c, ctx) => {
    const dtype = c.y.type.dtype;
    const scale = scaleOf(c, ctx, dtype);
    const operands = [c.x, c.w, c.a, c.b, c.bias, c.biasB];
    return scale !== undefined && allOf(dtype, operands) && infersAs('loraLinear', operands, { scale, loraBias: c.biasB !== undefined }, c.y);
  },
  build: (c, b, ctx) => {
    const scale = scaleOf(c, ctx, c.y.type.dtype);
    return scale === undefined ? undefined : b.loraLinear(c.x, c.w, c.a, c.b, scale, { bias: c.bias, biasB: c.biasB });
  },
});

const IDS = m.capture('ids');
const TRANSPOSED_B = { attrs: { transposeA: false, transposeB: true } } as const;
const gathered = <const N extends string>(stack: N) => m.op('gather', m.capture(stack), IDS, { attrs: { axis: 0 } });

/**
 * x·Wᵀ + bias + (x·A[ids]ᵀ)·B[ids]ᵀ · reshape(S[ids], [batch, 1, 1]) → gatheredLoraLinear(x, W, A,
 * B, S, ids[, bias]): `@stageml/peft`'s BGMV bank (`bankLinearGathered`) becomes the registry op
 * whose decomposition is this chain.
 */
export const foldGatheredLoraLinear: Rule = rule({
  name: 'add.fold-gathered-lora-linear',
  identity: 'x·Wᵀ + bias + (x·A[ids]ᵀ)·B[ids]ᵀ · reshape(S[ids]) = gatheredLoraLinear(x, W, A, B, S, ids, bias)',
  conditions:
    'x [batch, seq, in]; the three gathers along axis 0 by the same ids; both matmuls transpose only their right operand; the gathered scales reshaped to [batch, 1, 1]; bias optional; every float value one dtype; interior values have no other users',
  match: m.commutative(
    'add',
    linearMaybeBias(X, 'w', 'bias', 'base'),
    m.commutative(
      'mul',
      m.op('matmul', m.op('matmul', X, gathered('aStack'), TRANSPOSED_B), gathered('bStack'), TRANSPOSED_B),
      m.op('reshape', gathered('scales'), { as: 'scaleRows' }),
    ),
    { as: 'y' },
  ),
  when: (c) => {
    const dtype = c.y.type.dtype;
    const s = c.scaleRows.type.shape;
    const operands = [c.x, c.w, c.aStack, c.bStack, c.scales, c.ids, c.bias];
    const rowScales =
      s.length === 3 &&
      s[1] === 1 &&
      s[2] === 1 &&
      c.ids.type.shape.length === 1 &&
      typeEquals({ dtype, shape: [c.ids.type.shape[0]!, 1, 1] }, c.scaleRows.type);
    return rowScales && allOf(dtype, [c.x, c.w, c.aStack, c.bStack, c.scales, c.bias]) && infersAs('gatheredLoraLinear', operands, {}, c.y);
  },
  build: (c, b) => b.gatheredLoraLinear(c.x, c.w, c.aStack, c.bStack, c.scales, c.ids, c.bias),
});

const ROWS = m.capture('rows');

/**
 * scatterAdd(acc, rows, s·((x[rows]·Aᵀ)·Bᵀ + biasB)) → loraScatterAdd(acc, x, rows, A, B[, biasB]){scale: s}:
 * one group of `@stageml/peft`'s SGMV bank (`bankLinearGrouped`) becomes the registry op whose
 * decomposition is this chain; a bank is a chain of them over its base linear.
 */
export const foldLoraScatterAdd: Rule = rule({
  name: 'scatterAdd.fold-lora-step',
  identity: 'scatterAdd(acc, rows, s·((x[rows]·Aᵀ)·Bᵀ + biasB)) = loraScatterAdd(acc, x, rows, A, B, biasB){scale: s}',
  conditions:
    'the same rows select from x and scatter into acc, both along axis 0; biasB optional; s optional (1) and else a one-element constant splat of the operands’ dtype no higher in rank than the delta; A [r, in] and B [out, r] matrices; every float value one dtype; interior values have no other users',
  match: m.op('scatterAdd', m.capture('acc'), ROWS, loraDelta(m.op('indexSelect', X, ROWS, { attrs: { axis: 0 } })), { attrs: { axis: 0 }, as: 'y' }),
  when: (c, ctx) => {
    const dtype = c.y.type.dtype;
    const scale = scaleOf(c, ctx, dtype);
    const operands = [c.acc, c.x, c.rows, c.a, c.b, c.biasB];
    return scale !== undefined && allOf(dtype, [c.acc, c.x, c.a, c.b, c.biasB]) && infersAs('loraScatterAdd', operands, { scale }, c.y);
  },
  build: (c, b, ctx) => {
    const scale = scaleOf(c, ctx, c.y.type.dtype);
    return scale === undefined ? undefined : b.loraScatterAdd(c.acc, c.x, c.rows, c.a, c.b, scale, c.biasB);
  },
});

const GROUPS = m.capture('groups');
const expertFactor = <const S extends Pattern, const F extends string, const As extends string>(src: S, factor: F, as: As) =>
  m.op('groupedMatmul', src, m.capture(factor), GROUPS, { attrs: { transposeW: true }, as });

/**
 * x·W[g] + s·(x·A[g]ᵀ)·B[g]ᵀ → groupedLoraMatmul(x, W, A, B, g){transposeW, scale: s}: a MoE expert
 * projection with expert LoRA, as `@stageml/moe`'s `moeBlock` builds it, becomes the registry op
 * whose decomposition is this chain.
 */
export const foldGroupedLoraMatmul: Rule = rule({
  name: 'add.fold-grouped-lora-matmul',
  identity: 'groupedMatmul(x, W, g) + s·groupedMatmul(groupedMatmul(x, A, g)ᵀ, B, g)ᵀ = groupedLoraMatmul(x, W, A, B, g){transposeW, scale: s}',
  conditions:
    'the same x and groups in the base and both factor products; the factor products with transposeW (A [E, r, in], B [E, out, r]); the base in either layout; s optional (1) and else a one-element constant splat of the operands’ dtype no higher in rank than the delta; every float value one dtype; interior values have no other users',
  match: m.commutative(
    'add',
    m.op('groupedMatmul', X, m.capture('w'), GROUPS, { as: 'base' }),
    maybeScaled(expertFactor(expertFactor(X, 'a', 'shrink'), 'b', 'expand')),
    { as: 'y' },
  ),
  when: (c, ctx) => {
    const dtype = c.y.type.dtype;
    const scale = scaleOf(c, ctx, dtype);
    const transposeW = ctx.attrs(c.base, 'groupedMatmul').transposeW;
    const operands = [c.x, c.w, c.a, c.b, c.groups];
    return scale !== undefined && allOf(dtype, [c.x, c.w, c.a, c.b]) && infersAs('groupedLoraMatmul', operands, { transposeW, scale }, c.y);
  },
  build: (c, b, ctx) => {
    const scale = scaleOf(c, ctx, c.y.type.dtype);
    return scale === undefined
      ? undefined
      : b.groupedLoraMatmul(c.x, c.w, c.a, c.b, c.groups, { transposeW: ctx.attrs(c.base, 'groupedMatmul').transposeW, scale });
  },
});

/** The rules that turn residual primitives into serving ops (`foldServingOps`). */
export const servingOpRules: RuleSet = ruleSet('serving-ops', [foldLoraLinear, foldGatheredLoraLinear, foldLoraScatterAdd, foldGroupedLoraMatmul]);

/** What `foldServingOps` returns. */
export interface FoldedServingOps {
  /** The graph with the chains folded (the input itself when nothing folded). */
  readonly graph: Graph;
  /** How many chains each rule folded (every rule listed, zeros included). */
  readonly applied: Readonly<Record<string, number>>;
  /** Every fold, in order: the rule, the root value it replaced and the input nodes it matched. */
  readonly log: readonly RewriteLogEntry[];
}

/**
 * `graph` with the primitive chains of `servingOpRules` folded into their ops (a new graph; the
 * input is untouched), how many of each rule applied and the driver's log of the folds. `stageml
 * stage` runs it on the residual it writes, and `recognizeResidual` on the graph it reads; the
 * chains it leaves (shared intermediates, mixed dtypes) run as primitives.
 */
export function foldServingOps(graph: Graph): FoldedServingOps {
  const r = rewriteGreedy(graph, [servingOpRules]);
  // NOTE: nothing folded, the graph itself (the driver's rebuild would also CSE and drop dead code).
  return { graph: r.log.length > 0 ? r.graph : graph, applied: r.applied, log: r.log };
}
