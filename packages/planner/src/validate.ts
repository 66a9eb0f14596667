import { PlanCode, PlanError } from './errors.js';
import { type ExecutorCapabilities, whyNotExecutable } from './executor-caps.js';
import type { Plan } from './plan.js';
import type { PreparedGroup, Planner } from './planner.js';
import { PLAN_KINDS, forEachUnit, unitKey, unitLabel } from './workload.js';

/** Relative tolerance for recorded seconds (sums of floats in different orders differ in the last bits). */
const REL = 1e-9;

function close(a: number, b: number): boolean {
  return Math.abs(a - b) <= REL * Math.max(Math.abs(a), Math.abs(b)) + Number.MIN_VALUE;
}

function fail(code: (typeof PlanCode)[keyof typeof PlanCode], path: string, msg: string): never {
  throw new PlanError(code, msg, { path });
}

/**
 * Checks a plan on its own: adapters unique with shares summing to 1, every unit's adapter listed,
 * no unit twice, the recorded memory equal to the sum of the charged units' bytes and within the
 * budget, the expected seconds equal to Σ share · unit seconds, and (with `executor`) every kind
 * executable. Throws the first violation as a `PlanError` (`PLAN_DUPLICATE_UNIT`,
 * `PLAN_UNKNOWN_UNIT`, `PLAN_ACCOUNTING_MISMATCH`, `PLAN_OVER_BUDGET`, `PLAN_NOT_EXECUTABLE`)
 * naming the JSON path.
 */
export function validatePlanDocument(plan: Plan, executor?: ExecutorCapabilities): void {
  const shares = new Map<string, number>();
  plan.adapters.forEach((a, i) => {
    if (shares.has(a.name)) fail(PlanCode.DUPLICATE_UNIT, `$.adapters[${String(i)}]`, `adapter '${a.name}' is listed twice`);
    shares.set(a.name, a.share);
  });
  const total = [...shares.values()].reduce((x, y) => x + y, 0);
  if (plan.adapters.length > 0 && Math.abs(total - 1) > 1e-9) fail(PlanCode.ACCOUNTING_MISMATCH, '$.adapters', `shares sum to ${String(total)}, not 1`);
  const seen = new Map<string, number>();
  let memory = 0;
  let expected = 0;
  plan.units.forEach((u, i) => {
    const path = `$.units[${String(i)}]`;
    const share = shares.get(u.adapter);
    if (share === undefined) fail(PlanCode.UNKNOWN_UNIT, `${path}.adapter`, `adapter '${u.adapter}' is not in $.adapters`);
    const key = unitKey(u);
    const first = seen.get(key);
    if (first !== undefined) fail(PlanCode.DUPLICATE_UNIT, path, `unit ${unitLabel(u)} is planned twice (first at $.units[${String(first)}])`);
    seen.set(key, i);
    if (executor !== undefined) {
      const why = whyNotExecutable(executor, u.kind);
      if (why !== undefined) fail(PlanCode.NOT_EXECUTABLE, `${path}.kind`, `${unitLabel(u)}: ${why}`);
    }
    if (plan.budgetCovers === 'all' || u.kind === 'materialize') memory += u.memoryBytes;
    expected += share * u.seconds;
  });
  if (memory !== plan.memoryBytes)
    fail(PlanCode.ACCOUNTING_MISMATCH, '$.memoryBytes', `records ${String(plan.memoryBytes)} bytes, but the charged units add up to ${String(memory)}`);
  if (plan.memoryBytes > plan.budgetBytes) fail(PlanCode.OVER_BUDGET, '$.memoryBytes', `${String(plan.memoryBytes)} bytes exceed the budget of ${String(plan.budgetBytes)}`);
  if (!close(expected, plan.expectedSeconds))
    fail(PlanCode.ACCOUNTING_MISMATCH, '$.expectedSeconds', `records ${String(plan.expectedSeconds)} s, but Σ share · unit seconds is ${String(expected)}`);
}

/** Options of `validatePlan`. */
export interface ValidatePlanOptions {
  /** Also require each unit's recorded seconds to equal the planner's cost model's (default true). */
  readonly checkCosts?: boolean;
}

/**
 * Checks a plan against the workload, executor and cost model of `planner`: everything
 * `validatePlanDocument` checks, plus the same dtype, batch, seq and budget accounting; every
 * unit of the workload planned exactly once (`PLAN_MISSING_UNIT`, `PLAN_UNKNOWN_UNIT`,
 * `PLAN_DUPLICATE_UNIT`); each unit's in/out/rank as in the workload (`PLAN_SHAPE_MISMATCH`);
 * its kind allowed there (`PLAN_KIND_NOT_ALLOWED`) and executable (`PLAN_NOT_EXECUTABLE`); its
 * memory (and seconds, unless `checkCosts` is false) as the planner prices them
 * (`PLAN_ACCOUNTING_MISMATCH`).
 */
export function validatePlan(plan: Plan, planner: Planner, opts: ValidatePlanOptions = {}): void {
  const w = planner.workload;
  for (const [field, have, want] of [
    ['dtype', plan.dtype, w.dtype],
    ['batch', plan.batch, w.batch],
    ['seq', plan.seq, w.seq],
    ['budgetCovers', plan.budgetCovers, planner.budgetCovers],
  ] as const) {
    if (have !== want) fail(PlanCode.ACCOUNTING_MISMATCH, `$.${field}`, `the plan was priced with ${field} ${String(have)}, the planner uses ${String(want)}`);
  }
  const names = new Set(w.adapters.map((a) => a.name));
  plan.adapters.forEach((a, i) => {
    if (!names.has(a.name)) fail(PlanCode.UNKNOWN_UNIT, `$.adapters[${String(i)}].name`, `adapter '${a.name}' is not in the workload`);
  });
  const listed = new Set(plan.adapters.map((a) => a.name));
  for (const n of names) if (!listed.has(n)) fail(PlanCode.MISSING_UNIT, '$.adapters', `workload adapter '${n}' is missing from the plan`);
  validatePlanDocument(plan, planner.executor);
  const groupOf = new Map<string, PreparedGroup>();
  for (const g of planner.groups) forEachUnit(g.adapter, g.group, (u) => groupOf.set(unitKey(u), g));
  const checkCosts = opts.checkCosts ?? true;
  plan.units.forEach((u, i) => {
    const path = `$.units[${String(i)}]`;
    const g = groupOf.get(unitKey(u));
    if (g === undefined) fail(PlanCode.UNKNOWN_UNIT, path, `unit ${unitLabel(u)} is not in the workload`);
    const want = g.group;
    for (const f of ['inFeatures', 'outFeatures', 'rank'] as const) {
      if (u[f] !== want[f]) fail(PlanCode.SHAPE_MISMATCH, `${path}.${f}`, `${unitLabel(u)}: ${f} is ${String(u[f])}, the workload has ${String(want[f])}`);
    }
    const allowed = want.allowed ?? PLAN_KINDS;
    if (!allowed.includes(u.kind)) fail(PlanCode.KIND_NOT_ALLOWED, `${path}.kind`, `${unitLabel(u)}: '${u.kind}' is not allowed here (allowed: ${allowed.join(', ')})`);
    const priced = g.costs.kinds[u.kind];
    if (u.memoryBytes !== priced.memoryBytes)
      fail(
        PlanCode.ACCOUNTING_MISMATCH,
        `${path}.memoryBytes`,
        `${unitLabel(u)}: records ${String(u.memoryBytes)} bytes for '${u.kind}', the planner prices ${String(priced.memoryBytes)}`,
      );
    if (checkCosts && !close(u.seconds, priced.seconds))
      fail(PlanCode.ACCOUNTING_MISMATCH, `${path}.seconds`, `${unitLabel(u)}: records ${String(u.seconds)} s for '${u.kind}', the planner prices ${String(priced.seconds)}`);
  });
  if (plan.units.length !== groupOf.size) {
    const planned = new Set(plan.units.map(unitKey));
    for (const g of planner.groups) {
      forEachUnit(g.adapter, g.group, (u) => {
        if (!planned.has(unitKey(u))) fail(PlanCode.MISSING_UNIT, '$.units', `unit ${unitLabel(u)} of the workload has no decision`);
      });
    }
  }
}
