import { StageError, type TensorType, concretizeAttrs, isStaticType, numElements, opDef, seededRandom, typeEquals } from '@stageml/ir';
import { m } from '../pattern.js';
import { type Rule, rule } from '../rule.js';

/** Whether every dim of `t` is the literal 1 (a scalar of any rank: `[]`, `[1]`, `[1, 1]`). */
export function isScalarLike(t: TensorType): boolean {
  return t.shape.every((d) => d === 1);
}

/** x · 1 → x, with the 1 on either side. */
export const mulDropOne: Rule = rule({
  name: 'mul.drop-one',
  identity: 'x · 1 = x',
  conditions: 'the other operand is a splat constant 1; the product has the type of x (the 1 does not broadcast x up)',
  match: m.commutative('mul', m.capture('x'), m.scalar(1), { as: 'y' }),
  when: ({ x, y }) => typeEquals(x.type, y.type),
  build: ({ x }) => x,
});

/** x / 1 → x. */
export const divDropOne: Rule = rule({
  name: 'div.drop-one',
  identity: 'x / 1 = x',
  conditions: 'the divisor is a splat constant 1; the quotient has the type of x',
  match: m.op('div', m.capture('x'), m.scalar(1), { as: 'y' }),
  when: ({ x, y }) => typeEquals(x.type, y.type),
  build: ({ x }) => x,
});

/**
 * x + 0 → x, with the 0 on either side.
 *
 * NOTE: exact for integers and for every float except x = −0, where −0 + 0 = +0; the two zeros
 * compare equal and only a later division by the result could tell them apart (XLA's algebraic
 * simplifier and tinygrad fold x + 0 the same way).
 */
export const addDropZero: Rule = rule({
  name: 'add.drop-zero',
  identity: 'x + 0 = x',
  conditions: 'the other operand is a splat constant ±0; the sum has the type of x',
  match: m.commutative('add', m.capture('x'), m.scalar(0), { as: 'y' }),
  when: ({ x, y }) => typeEquals(x.type, y.type),
  build: ({ x }) => x,
});

/** x − 0 → x (exact, including x = −0). */
export const subDropZero: Rule = rule({
  name: 'sub.drop-zero',
  identity: 'x − 0 = x',
  conditions: 'the subtrahend is a splat constant ±0; the difference has the type of x',
  match: m.op('sub', m.capture('x'), m.scalar(0), { as: 'y' }),
  when: ({ x, y }) => typeEquals(x.type, y.type),
  build: ({ x }) => x,
});

/** −(−x) → x (also for wrapping integers). */
export const negCancelDouble: Rule = rule({
  name: 'neg.cancel-double',
  identity: '−(−x) = x',
  conditions: 'none; the inner negation may have other users (it stays for them)',
  match: m.op('neg', m.op('neg', m.capture('x'), { shared: true })),
  build: ({ x }) => x,
});

/**
 * f(c₁, …, cₙ) → c: a pure op whose operands are all literal constants becomes the literal it
 * evaluates to (by the op's reference semantics, so rounding matches the interpreter).
 *
 * NOTE: the anchor is `pure` (any op with a pure effect, read from the registry), not an op name.
 * Constants are not folded into larger ones: the result may have at most `maxFoldElements`
 * elements or as many as its operands together, so folding never grows the graph's literals
 * much. An op that fails to evaluate is left for run time to report.
 */
export const foldConstants: Rule = rule({
  name: 'pure.fold-constants',
  identity: 'f(c₁, …, cₙ) = c, c = eval f(c₁, …, cₙ)',
  conditions: 'pure op with ≥ 1 operand, every operand a `constant`, static result type, result size ≤ max(maxFoldElements, Σ operand sizes)',
  match: m.any({ as: 'y' }),
  when: ({ y }, ctx) => {
    if (!isStaticType(y.type)) return false;
    const d = ctx.def(y);
    if (d === undefined || d.operands.length === 0 || opDef(d.op).effect !== 'pure') return false;
    if (!d.operands.every((o) => ctx.def(o)?.op === 'constant')) return false;
    const size = ctx.size(numElements(y.type));
    const operandSize = d.operands.reduce((acc, o) => acc + ctx.size(numElements(o.type)), 0);
    return size <= Math.max(ctx.maxFoldElements, operandSize);
  },
  build: ({ y }, b, ctx) => {
    const d = ctx.def(y)!;
    const def = opDef(d.op);
    let out;
    try {
      out = def.evaluate(
        d.operands.map((o) => ctx.literal(o)!),
        concretizeAttrs(def.attrs, d.attrs, {}),
        { random: seededRandom(0) },
      )[0]!;
    } catch (e) {
      if (e instanceof StageError) return undefined;
      throw e;
    }
    const values = Array.from(out.data);
    const splat = values.length > 0 && values.every((v) => Object.is(v, values[0]));
    return b.constant(splat ? [values[0]!] : values, out.dtype, out.shape);
  },
});
