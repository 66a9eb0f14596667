// The rewrite rules that turn residual primitive graphs into the serving ops of the IR registry, so
// that no backend has to recognise primitive patterns: executors lower the ops from their own
// tables (or expand them by `decompose`), and the code generators read them as kernels.
import type { Graph } from '@stageml/ir';
import { type Rule, type RuleSet, m, rewriteGreedy, rule, ruleSet } from '@stageml/rewrite';

const base = m.op('linear', m.capture('x'), m.capture('w'), { as: 'base' });
const expand = m.op('linear', m.op('linear', m.capture('x'), m.capture('a'), { as: 'shrink' }), m.capture('b'), { as: 'expand' });
const scaled = m.commutative('mul', expand, m.scalar(undefined, { as: 'scale' }), { as: 'delta' });

/**
 * x·Wᵀ + s·((x·Aᵀ)·Bᵀ) → loraLinear(x, W, A, B){scale: s}: PEFT's LoRA layer in residual form, as
 * `@stageml/peft`'s `loraLinear` builds it, becomes the registry op whose decomposition is this
 * very chain (so the rewrite changes no executor's numerics unless it lowers the op itself).
 */
export const foldLoraLinear: Rule = rule({
  name: 'add.fold-lora-linear',
  identity: 'x·Wᵀ + s·((x·Aᵀ)·Bᵀ) = loraLinear(x, W, A, B){scale: s}',
  conditions:
    'the same x in the base and the shrink; no bias on either linear; s a rank-0 constant splat of the operands’ dtype; A [r, in] and B [out, r] matrices; the base, shrink, expand and scaled delta have no other users (else the chain would be computed twice)',
  match: m.commutative('add', base, scaled, { as: 'y' }),
  when: (c, ctx) => {
    const dtype = c.y.type.dtype;
    const scale = ctx.splat(c.scale);
    return (
      scale !== undefined &&
      c.scale.type.shape.length === 0 &&
      [c.x, c.w, c.a, c.b, c.scale].every((v) => v.type.dtype === dtype) &&
      c.a.type.shape.length === 2 &&
      c.b.type.shape.length === 2 &&
      [c.base, c.shrink, c.expand, c.delta].every((v) => ctx.uses(v) === 1)
    );
  },
  build: (c, b, ctx) => {
    const scale = ctx.splat(c.scale);
    return scale === undefined ? undefined : b.loraLinear(c.x, c.w, c.a, c.b, scale);
  },
});

/** The rules that turn residual primitives into serving ops (`foldServingOps`). */
export const servingOpRules: RuleSet = ruleSet('serving-ops', [foldLoraLinear]);

/**
 * `graph` with the primitive chains of `servingOpRules` folded into their ops (a new graph; the
 * input is untouched), and how many of each rule applied. `stageml stage` runs it on the residual
 * it writes; the chains it leaves (biased LoRA layers, shared intermediates) run as primitives.
 */
export function foldServingOps(graph: Graph): { readonly graph: Graph; readonly applied: Readonly<Record<string, number>> } {
  const r = rewriteGreedy(graph, [servingOpRules]);
  // NOTE: nothing folded, the graph itself (the driver's rebuild would also CSE and drop dead code).
  return { graph: Object.values(r.applied).some((n) => n > 0) ? r.graph : graph, applied: r.applied };
}
