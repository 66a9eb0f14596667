// Shared helpers of the rewrite tests: random rule instances embedded in random noise graphs, and
// the checks every rule must pass (semantics, verification, idempotence, no slower residual).
import {
  type DimBindings,
  type Graph,
  GraphBuilder,
  type HostTensor,
  type OpKey,
  type Value,
  graphInputs,
  graphParams,
  interpret,
  printGraph,
  verifyGraph,
} from '@stageml/ir';
import { allcloseReport, arbGraphWithData, arbHostTensor, defaultTolerance } from '@stageml/testkit';
import fc from 'fast-check';
import { expect } from 'vitest';
import { type RewriteContextOptions, type RewriteResult, type Rule, type RuleSet, residualCost, rewriteGreedy } from '../src/index.js';

/** A graph with data for every input and parameter, and the sizes of its symbols. */
export interface Case {
  readonly graph: Graph;
  readonly inputs: Record<string, HostTensor>;
  readonly weights: Record<string, HostTensor>;
  readonly bindings: DimBindings;
}

// Bounded-magnitude ops: their outputs feed the rule instance through tanh, so values stay small.
const NOISE_OPS: readonly OpKey[] = ['add', 'sub', 'mul', 'neg', 'abs', 'tanh', 'sigmoid', 'reshape', 'transpose', 'sum', 'matmul', 'linear'];

/** Copies `g` into `b`, returning the new value of each old value id. */
function replay(b: GraphBuilder, g: Graph): Value[] {
  const map: Value[] = [];
  for (const n of g.nodes) {
    if (n.kind === 'input' || n.kind === 'param') {
      const t = g.values[n.results[0]!]!.type;
      map[n.results[0]!] = n.kind === 'input' ? b.input(n.name, t) : b.param(n.name, t);
      continue;
    }
    const res = b.apply(n.op, n.operands.map((v) => map[v]!), n.attrs);
    n.results.forEach((r, k) => (map[r] = res[k]!));
  }
  return map;
}

/** How a builder callback receives noise: `couple(v)` adds a bounded scalar computed by the noise graph to `v`. */
export type Couple = (v: Value) => Value;

/**
 * Random instances of a rule's pattern built by `build` (from random `params`), embedded in a
 * small random noise graph from `arbGraphWithData`: the noise graph's outputs stay outputs, and
 * `couple` lets the instance read a value computed by the noise. Symbols are `batch` (2 or 3).
 */
export function arbCase<P>(params: fc.Arbitrary<P>, build: (b: GraphBuilder, p: P, couple: Couple) => Record<string, Value>, opts: { noise?: boolean; maxAbs?: number } = {}): fc.Arbitrary<Case & { readonly params: P }> {
  const noiseArb = opts.noise === false ? fc.constant(undefined) : arbGraphWithData({ maxNodes: 4, maxInputs: 2, ops: NOISE_OPS, symbols: ['batch'] });
  return fc.tuple(noiseArb, params, fc.integer({ min: 2, max: 3 })).chain(([noise, p, batchSize]) => {
    const bindings = { batch: noise?.bindings['batch'] ?? batchSize };
    const b = new GraphBuilder('case');
    const map = noise === undefined ? [] : replay(b, noise.graph);
    const floats = map.filter((v) => v.type.dtype === 'f32' && v.type.shape.length > 0);
    const scalar = floats.length === 0 ? undefined : b.mean(b.tanh(floats[floats.length - 1]!));
    const couple: Couple = (v) => (scalar !== undefined && v.type.dtype === 'f32' ? b.add(v, scalar) : v);
    const outs = build(b, p, couple);
    for (const o of noise?.graph.outputs ?? []) b.output(`noise.${o.name}`, map[o.value]!);
    for (const [k, v] of Object.entries(outs)) b.output(k, v);
    const graph = b.build();
    const known = { ...noise?.inputs, ...noise?.weights };
    const fresh = [...graphInputs(graph), ...graphParams(graph)].filter((n) => !Object.hasOwn(known, n.name));
    const typeOf = (n: { results: readonly number[] }): Graph['values'][number]['type'] => graph.values[n.results[0]!]!.type;
    return fc.tuple(...fresh.map((n) => arbHostTensor(typeOf(n), { bindings, maxAbs: opts.maxAbs ?? 1 }))).map((data) => {
      const inputs: Record<string, HostTensor> = { ...noise?.inputs };
      const weights: Record<string, HostTensor> = { ...noise?.weights };
      fresh.forEach((n, i) => {
        (n.kind === 'input' ? inputs : weights)[n.name] = data[i]!;
      });
      return { graph, inputs, weights, bindings, params: p };
    });
  });
}

/** Options of `checkRewrite`. */
export interface CheckOptions {
  /** A rule that must have fired. */
  readonly fires?: string;
  /** A rule that must not have fired anywhere. */
  readonly notFires?: string;
  /** A value no rewrite may have replaced (the root of an instance the rules must leave alone). */
  readonly notAt?: string;
  /** Rewrite context (sizes default to the case's bindings). */
  readonly context?: RewriteContextOptions;
  /** Tolerances (default: rtol 1e-4, atol 1e-5 for fp32 re-association, or the dtype's default if looser). */
  readonly rtol?: number;
  readonly atol?: number;
}

/**
 * Rewrites `c.graph` with `rules` (verifying after every rewrite) and checks the rule contract:
 * the input is untouched, the result verifies and computes the same outputs under the reference
 * interpreter, the residual is no slower per request, and rewriting the result again changes
 * nothing (idempotence).
 */
export function checkRewrite(c: Case, rules: readonly (Rule | RuleSet)[], opts: CheckOptions = {}): RewriteResult {
  const context: RewriteContextOptions = { sizes: c.bindings, ...opts.context };
  const snapshot = JSON.stringify(c.graph);
  const r = rewriteGreedy(c.graph, rules, { verifyEach: true, context });
  expect(JSON.stringify(c.graph)).toBe(snapshot);
  verifyGraph(r.graph);
  expect(r.stop).toBe('fixpoint');
  if (opts.fires !== undefined) expect(r.applied[opts.fires], `${opts.fires} fired\n${printGraph(c.graph)}`).toBeGreaterThan(0);
  if (opts.notFires !== undefined) expect(r.applied[opts.notFires]).toBe(0);
  if (opts.notAt !== undefined) expect(r.log.filter((e) => e.node === opts.notAt)).toEqual([]);
  const expected = interpret(c.graph, { inputs: c.inputs, weights: c.weights });
  const got = interpret(r.graph, { inputs: c.inputs, weights: c.weights });
  // Half-precision results of both graphs evaluated again in f32, taken only where the
  // half-precision ones differ: a re-association rounds its intermediates differently, and where
  // terms cancel (noise graphs are random) that difference exceeds any tolerance of the result's
  // own size, while the rewrite is still exact in real arithmetic.
  let wide: { expected: Record<string, HostTensor>; got: Record<string, HostTensor> } | undefined;
  for (const o of c.graph.outputs) {
    const want = expected[o.name]!;
    const tol = defaultTolerance(want.dtype);
    const close = { rtol: opts.rtol ?? Math.max(1e-4, tol.rtol), atol: opts.atol ?? Math.max(1e-5, tol.atol) };
    const what = `output ${o.name} after ${JSON.stringify(r.applied)}\n${printGraph(c.graph)}\n${printGraph(r.graph)}`;
    if ((want.dtype === 'bf16' || want.dtype === 'f16') && !allcloseReport(got[o.name]!, want, close).pass) {
      wide ??= { expected: interpretWidened(c.graph, c), got: interpretWidened(r.graph, c) };
      const f32 = defaultTolerance('f32');
      expect(wide.got[o.name], `${what}\n(in f32, half precision widened)`).toBeAllclose(wide.expected[o.name]!, { rtol: Math.max(1e-4, f32.rtol), atol: Math.max(1e-5, f32.atol) });
      continue;
    }
    expect(got[o.name], what).toBeAllclose(want, close);
  }
  const before = residualCost(c.graph, context);
  const after = residualCost(r.graph, context);
  expect(after.seconds).toBeLessThanOrEqual(before.seconds * (1 + 1e-9));
  const again = rewriteGreedy(r.graph, rules, { verifyEach: true, context });
  expect(Object.values(again.applied).every((n) => n === 0), `idempotent: ${JSON.stringify(again.applied)}`).toBe(true);
  expect(printGraph(again.graph)).toBe(printGraph(r.graph));
  return r;
}

/** `g` interpreted with every bf16 and f16 type, constant, cast and tensor of `c` widened to f32. */
function interpretWidened(g: Graph, c: Case): Record<string, HostTensor> {
  const widen = <T>(x: T): T => JSON.parse(JSON.stringify(x).replaceAll('"bf16"', '"f32"').replaceAll('"f16"', '"f32"')) as T;
  const tensors = (m: Record<string, HostTensor>): Record<string, HostTensor> =>
    Object.fromEntries(Object.entries(m).map(([k, t]) => [k, t.dtype === 'bf16' || t.dtype === 'f16' ? { ...t, dtype: 'f32' as const, data: Float32Array.from(t.data as ArrayLike<number>) } : t]));
  return interpret(widen(g), { inputs: tensors(c.inputs), weights: tensors(c.weights) });
}
