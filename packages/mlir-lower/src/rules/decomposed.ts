import { GraphBuilder, type OpKey, type ValueId, opDef } from '@stageml/ir';
import type { ValueRef } from '../emitter.js';
import { LowerCode, LowerError } from '../errors.js';
import { type MlirRuleFn, type RuleContext, isUnsupported } from '../rule.js';
import { mlirRuleOf } from '../rules.js';

/**
 * Lowers a composite op through its registry decomposition (`OpDef.decompose`): the primitive ops
 * it expands to are lowered in place with their own rules, so this backend needs no re-implementation
 * of the composite (a fused rule stays possible as an optimization).
 */
export function decomposed<K extends OpKey>(key: K): MlirRuleFn<K> {
  return (ctx: RuleContext<K>): readonly ValueRef[] => {
    const decompose = opDef(key).decompose;
    if (decompose === undefined) throw new LowerError(LowerCode.UNSUPPORTED_OP, `${opDef(key).name} has no decomposition`);
    const b = new GraphBuilder(`${key}_decomposed`, { intern: false });
    const inputs = ctx.operands.map((o, i) => b.input(`in${String(i)}`, o.type));
    decompose(b, inputs, ctx.attrs).forEach((v, i) => {
      b.output(`out${String(i)}`, v);
    });
    const g = b.build();
    const env = new Map<ValueId, ValueRef>();
    const prefix = ctx.names[0] ?? key;
    let next = 0;
    for (const n of g.nodes) {
      if (n.kind !== 'op') {
        env.set(n.results[0]!, ctx.operands[next++]!);
        continue;
      }
      const rule = mlirRuleOf(n.op);
      if (isUnsupported(rule)) throw new LowerError(LowerCode.UNSUPPORTED_OP, `${opDef(key).name} decomposes to ${opDef(n.op).name}, which has no MLIR lowering: ${rule.reason}`);
      const out = rule({
        e: ctx.e,
        attrs: n.attrs,
        operands: n.operands.map((v) => env.get(v)!),
        results: n.results.map((r) => g.values[r]!.type),
        names: n.results.map((r) => `${prefix}_${g.values[r]!.name}`),
        literal: ctx.literal,
      });
      n.results.forEach((r, i) => env.set(r, out[i]!));
    }
    return g.outputs.map((o) => env.get(o.value)!);
  };
}
