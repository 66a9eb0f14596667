import type { OpKey } from '@stageml/ir';
import { TFJS_RULES, type TfRuleTable, isTfjsBackend } from '@stageml/runtime';
import { PlanCode, PlanError } from './errors.js';
import { PLAN_KINDS, type PlanKind } from './workload.js';

/** What an executor can run, as far as plan kinds are concerned. */
export interface ExecutorCapabilities {
  /** Executor name (`interpreter`, `tfjs-wasm`, …). */
  readonly name: string;
  /** Whether the executor lowers op `op`. */
  readonly supportsOp: (op: OpKey) => boolean;
  /** Whether factors may be bound at request time (the generic path `fallback` needs). */
  readonly lateBinding: boolean;
}

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
 * Capabilities of a known executor by name: `interpreter` runs every op; `tfjs-<backend>` runs the
 * ops whose `TFJS_RULES` entry is a lowering. Both bind late inputs. Unknown names are
 * `PLAN_BAD_OPTION`.
 */
export function executorCapabilities(name: string): ExecutorCapabilities {
  if (name === 'interpreter') return { name, supportsOp: () => true, lateBinding: true };
  const backend = name.startsWith('tfjs-') ? name.slice('tfjs-'.length) : undefined;
  if (backend !== undefined && isTfjsBackend(backend)) {
    const rules: TfRuleTable = TFJS_RULES;
    return {
      name,
      supportsOp: (op) => rules[op].kind !== 'unsupported',
      lateBinding: true,
    };
  }
  throw new PlanError(PlanCode.BAD_OPTION, `unknown executor '${name}' (known: interpreter, tfjs-<backend>)`, {
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
