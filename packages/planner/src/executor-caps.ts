import type { OpKey } from '@stageml/ir';
import { type ExecutorCapabilities, executorCapabilities as knownExecutorCapabilities } from '@stageml/runtime';
import { PlanCode, PlanError } from './errors.js';
import { PLAN_KINDS, type PlanKind } from './workload.js';

export type { ExecutorCapabilities } from '@stageml/runtime';

/**
 * The IR ops each kind's form executes per request (as `@stageml/peft` builds them): merged linear;
 * linear + scaled low-rank linears; the SGMV and BGMV bank forms; the generic path is the residual
 * form with late-bound factors.
 */
export const KIND_OPS: Readonly<Record<PlanKind, readonly OpKey[]>> = {
  materialize: ['linear'],
  residual: ['linear', 'mul', 'add'],
  'grouped-bank': ['linear', 'indexSelect', 'scatterAdd', 'gather', 'matmul', 'reshape', 'mul', 'add'],
  fallback: ['linear', 'mul', 'add'],
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
