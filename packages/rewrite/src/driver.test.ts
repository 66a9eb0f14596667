import { type Graph, GraphBuilder, PassManager, graphOps, printGraph } from '@stageml/ir';
import { expectCode } from '@stageml/testkit';
import { describe, expect, test } from 'vitest';
import {
  RwCode,
  canonicalRules,
  csePass,
  dcePass,
  defaultRules,
  eliminateCommonSubexpressions,
  eliminateDeadCode,
  m,
  mulDropOne,
  negCancelDouble,
  resolveContext,
  rewriteGreedy,
  rewritePass,
  rule,
  ruleSet,
} from './index.js';

function negChain(depth: number): Graph {
  const b = new GraphBuilder('chain');
  let v = b.input('x', ['f32', [4]]);
  for (let i = 0; i < depth; i++) v = b.neg(v);
  b.output('y', b.mul(v, b.scalar(1)));
  return b.build();
}

describe('rewriteGreedy', () => {
  test('reaches a fixpoint, counts every rule (zeros included) and names the replaced values', () => {
    const r = rewriteGreedy(negChain(4), [negCancelDouble, mulDropOne], { verifyEach: true });
    expect(r.stop).toBe('fixpoint');
    expect(r.applied).toEqual({ 'neg.cancel-double': 2, 'mul.drop-one': 1 });
    expect(printGraph(r.graph)).toMatchInlineSnapshot(`
      "graph @chain {
        %x = input : f32[4]
        return y = %x
      }
      "
    `);
    // Top-down: the product first, then the negations from the outermost in.
    expect(r.log.map((e) => e.rule)).toEqual(['mul.drop-one', 'neg.cancel-double', 'neg.cancel-double']);
    expect(r.log[1]).toMatchObject({ node: 'neg_3', before: '%neg_2 = sml.neg(%neg_1) : f32[4]\n%neg_3 = sml.neg(%neg_2) : f32[4]', after: '%neg_1' });
    // The matched op nodes, by index in the input graph (x, neg … neg_3, the constant 1, mul).
    expect(r.log.map((e) => e.matched)).toEqual([[6], [3, 4], [1, 2]]);
  });

  test('stops at the iteration limit when the sweeps run out before a fixpoint is confirmed', () => {
    const r = rewriteGreedy(negChain(2), [negCancelDouble], { maxIterations: 1 });
    expect(r.stop).toBe('iteration-limit');
    expect(r.iterations).toBe(1);
    expect(rewriteGreedy(negChain(2), [negCancelDouble], { maxIterations: 2 }).stop).toBe('fixpoint');
  });

  test('stops rules that never converge at maxRewrites', () => {
    // exp(x) → exp(tanh(x)) matches its own result forever.
    const grow = rule({ name: 'exp.grow', identity: 'test only', match: m.op('exp', m.capture('x')), build: ({ x }, b) => b.exp(b.tanh(x)) });
    const b = new GraphBuilder('loop');
    b.output('y', b.exp(b.input('x', ['f32', [2]])));
    const r = rewriteGreedy(b.build(), [grow], { maxRewrites: 7 });
    expect(r.stop).toBe('iteration-limit');
    expect(r.log).toHaveLength(7);
  });

  test('a rule undoing another finds the replaced value through hash-consing and stops', () => {
    const there = rule({ name: 'exp.flip', identity: 'test only', match: m.op('exp', m.capture('x')), build: ({ x }, b) => b.sigmoid(x) });
    const back = rule({ name: 'sigmoid.flip', identity: 'test only', match: m.op('sigmoid', m.capture('x')), build: ({ x }, b) => b.exp(x) });
    const b = new GraphBuilder('flip');
    b.output('y', b.exp(b.input('x', ['f32', [2]])));
    const r = rewriteGreedy(b.build(), [there, back]);
    expect(r.stop).toBe('fixpoint');
    expect(r.applied).toEqual({ 'exp.flip': 1, 'sigmoid.flip': 0 });
  });

  test('never modifies its input graph', () => {
    const g = negChain(3);
    const before = JSON.stringify(g);
    rewriteGreedy(g, [defaultRules]);
    expect(JSON.stringify(g)).toBe(before);
  });

  test('merges duplicate computations (CSE) and drops dead nodes while rewriting', () => {
    const b = new GraphBuilder('dup', { intern: false });
    const x = b.input('x', ['f32', [3]]);
    b.exp(x);
    b.output('a', b.add(b.exp(x), b.neg(b.neg(x))));
    b.output('b', b.add(x, b.exp(x)));
    const r = rewriteGreedy(b.build(), [negCancelDouble]);
    expect(graphOps(r.graph).map((n) => n.op)).toEqual(['exp', 'add']);
    expect(r.graph.outputs[0]!.value).toBe(r.graph.outputs[1]!.value);
  });

  test('reports misbehaving rules with coded errors naming the rule', () => {
    const g = negChain(1);
    const throws = rule({ name: 'neg.throw', identity: 'test only', match: m.op('neg', m.any()), build: () => JSON.parse('{') as never });
    expect(expectCode(() => rewriteGreedy(g, [throws]), RwCode.RULE_FAILED).message).toContain("rule 'neg.throw'");
    const param = rule({ name: 'neg.param', identity: 'test only', match: m.op('neg', m.any()), build: (_c, b) => b.neg(b.param('p', ['f32', [4]])) });
    expectCode(() => rewriteGreedy(g, [param]), RwCode.BAD_RULE);
    const self = rule({ name: 'neg.self', identity: 'test only', match: m.op('neg', m.any(), { as: 'y' }), build: ({ y }, b) => b.abs(y) });
    expectCode(() => rewriteGreedy(g, [self]), RwCode.BAD_RULE);
    const retype = rule({ name: 'neg.retype', identity: 'test only', match: m.op('neg', m.capture('x')), build: ({ x }, b) => b.sum(x) });
    expectCode(() => rewriteGreedy(g, [retype]), RwCode.TYPE_CHANGED);
    const peek = rule({ name: 'neg.peek', identity: 'test only', match: m.op('neg', m.capture('x')), build: ({ x }, b, ctx) => (ctx.isStatic(b.exp(x)) ? x : undefined) });
    expectCode(() => rewriteGreedy(g, [peek]), RwCode.BAD_RULE);
  });

  test('rejects bad rule names, duplicate rules and bad options', () => {
    expectCode(() => rule({ name: 'NoDot', identity: '', match: m.any(), build: () => undefined }), RwCode.BAD_RULE);
    expectCode(() => ruleSet('twice', [mulDropOne, canonicalRules]), RwCode.DUPLICATE_RULE);
    expectCode(() => rewriteGreedy(negChain(1), [], { maxIterations: 0 }), RwCode.BAD_OPTION);
    expectCode(() => rewriteGreedy(negChain(1), [], { context: { sizes: { batch: -1 } } }), RwCode.BAD_OPTION);
    expectCode(() => rewriteGreedy(negChain(1), [], { context: { memoryBudget: -1 } }), RwCode.BAD_OPTION);
    expectCode(() => rewriteGreedy(negChain(1), [], { context: { lattice: 'nope' } }), RwCode.BAD_OPTION);
    expectCode(() => resolveContext(negChain(1), { cutoff: 'later' }), 'BTA_UNKNOWN_STAGE');
  });

  test('verifyEach verifies the input graph too', () => {
    const g = negChain(1);
    const broken: Graph = { ...g, outputs: [{ name: 'y', value: 99 }] };
    expectCode(() => rewriteGreedy(broken, [negCancelDouble], { verifyEach: true }), 'IR_UNDEFINED_VALUE');
  });

  test('runs as a pass of the IR pass manager, with DCE and CSE passes', () => {
    const pm = new PassManager([rewritePass([canonicalRules]), csePass, dcePass], { verifyEach: true });
    const { graph, timings } = pm.run(negChain(2));
    expect(timings.map((t) => t.pass)).toEqual(['rewrite-greedy', 'cse', 'dce']);
    expect(graph.nodes).toHaveLength(1);
  });
});

describe('eliminateDeadCode and eliminateCommonSubexpressions', () => {
  const b = new GraphBuilder('g', { intern: false });
  const x = b.input('x', ['f32', [2]]);
  b.param('unused', ['f32', [2]]);
  b.exp(x);
  const s1 = b.add(x, b.neg(x));
  const s2 = b.add(b.neg(x), x);
  const r1 = b.op('randomUniform', [], { shape: [2] });
  const r2 = b.op('randomUniform', [], { shape: [2] });
  b.output('a', b.mul(s1, r1));
  b.output('b', b.mul(s2, r2));
  const g = b.build();

  test('DCE drops unused ops but keeps every input and parameter, in order', () => {
    const d = eliminateDeadCode(g);
    expect(d.nodes.map((n) => (n.kind === 'op' ? n.op : n.name))).toEqual(['x', 'unused', 'neg', 'add', 'neg', 'add', 'randomUniform', 'randomUniform', 'mul', 'mul']);
    expect(eliminateDeadCode(d)).toBe(d);
  });

  test('CSE merges commutative operand orders (from the registry traits) but never random ops', () => {
    const c = eliminateCommonSubexpressions(g);
    expect(graphOps(c).map((n) => n.op)).toEqual(['neg', 'add', 'randomUniform', 'randomUniform', 'mul', 'mul']);
    expect(c.nodes.some((n) => n.kind === 'param')).toBe(true);
  });
});
