import { GraphBuilder, type OpKey, type Value, graphOps } from '@stageml/ir';
import { type LoraValues, bankLinearGathered, bankLinearGrouped, loraLinear } from '@stageml/peft';
import { type ExecutorCapabilities, executorCapabilities as knownExecutorCapabilities } from '@stageml/runtime';
import { PlanCode, PlanError } from './errors.js';
import { PLAN_KINDS, type PlanKind } from './workload.js';

export type { ExecutorCapabilities } from '@stageml/runtime';

/** The ops of the graph `build` traces, in first-use order (constants included). */
function formOps(build: (b: GraphBuilder) => Value): OpKey[] {
  const b = new GraphBuilder('form');
  b.output('y', build(b));
  return [...new Set(graphOps(b.build()).map((n) => n.op))];
}

const factors = (b: GraphBuilder, r: number): LoraValues => ({ A: b.param('A', ['f32', [r, 4]]), B: b.param('B', ['f32', [4, r]]), scale: 2 });
const residualForm = (b: GraphBuilder): Value => loraLinear(b, b.input('x', ['f32', ['n', 4]]), b.param('W', ['f32', [4, 4]]), undefined, factors(b, 2), 'residual');

/**
 * The IR ops each kind's form executes per request, traced from the forms `@stageml/peft` builds
 * (so they cannot drift from them): merged linear; linear + scaled low-rank linears; the SGMV and
 * BGMV bank forms; the generic path is the residual form with late-bound factors.
 */
export const KIND_OPS: Readonly<Record<PlanKind, readonly OpKey[]>> = {
  materialize: formOps((b) => b.linear(b.input('x', ['f32', ['n', 4]]), b.param('W', ['f32', [4, 4]]))),
  residual: formOps(residualForm),
  'grouped-bank': [
    ...new Set([
      ...formOps((b) => {
        const x = b.input('x', ['f32', ['n', 4]]);
        return bankLinearGrouped(b, x, b.param('W', ['f32', [4, 4]]), undefined, [{ rows: b.input('rows', ['i64', ['m']]), lora: factors(b, 2) }]);
      }),
      ...formOps((b) => {
        const stacked = { A: b.param('A', ['f32', [3, 2, 4]]), B: b.param('B', ['f32', [3, 4, 2]]), scales: b.param('S', ['f32', [3]]) };
        return bankLinearGathered(b, b.input('x', ['f32', ['n', 1, 4]]), b.param('W', ['f32', [4, 4]]), undefined, stacked, b.input('ids', ['i64', ['n']]));
      }),
    ]),
  ],
  fallback: formOps(residualForm),
};

/**
 * Capabilities of a known executor by name, as the executors declare them (`interpreter`,
 * `onnxruntime`, `tfjs-<backend>`, and any executor added with `registerExecutorCapabilities`).
 * Unknown names are `PLAN_BAD_OPTION`; a custom executor can be described with an
 * `ExecutorCapabilities` object instead of a name.
 */
export function executorCapabilities(name: string): ExecutorCapabilities {
  const caps = knownExecutorCapabilities(name);
  if (caps !== undefined) return caps;
  throw new PlanError(PlanCode.BAD_OPTION, `unknown executor '${name}' (known: interpreter, onnxruntime, tfjs-<backend>)`, {
    hint: 'describe a custom executor with an ExecutorCapabilities object',
  });
}

/** The plan kinds `caps` can execute: every op of the kind's form is supported (and late binding for `fallback`). */
export function executableKinds(caps: ExecutorCapabilities): PlanKind[] {
  return PLAN_KINDS.filter((k) => KIND_OPS[k].every((op) => caps.supportsOp(op)) && (k !== 'fallback' || caps.lateBinding));
}

/** Why `caps` cannot execute `kind`, or undefined when it can. */
export function whyNotExecutable(caps: ExecutorCapabilities, kind: PlanKind): string | undefined {
  const missing = KIND_OPS[kind].filter((op) => !caps.supportsOp(op));
  if (missing.length > 0) return `executor '${caps.name}' cannot run ${missing.join(', ')}, which '${kind}' needs`;
  if (kind === 'fallback' && !caps.lateBinding) return `executor '${caps.name}' cannot bind factors at request time, which 'fallback' needs`;
  return undefined;
}
