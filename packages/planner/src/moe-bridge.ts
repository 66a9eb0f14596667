import { EXPERT_PROJECTIONS, MOE_PLAN_FORMAT, MOE_PLAN_VERSION, type MoePlan, type MoePlanChoice, type MoePlanUnit } from '@stageml/moe';
import { PlanCode, PlanError } from './errors.js';
import type { Plan } from './plan.js';
import { unitLabel } from './workload.js';

/**
 * The MoE part of a plan as a `stageml.moe-plan` v1 document, which `@stageml/moe` executes
 * (`moeBlockWithPlan`, `buildStagedMoeLayer`): every expert unit (a unit with an `expert`) becomes
 * a unit of layer `model.layers.<L>.mlp.experts` with the same choice. Expert units can only be
 * `materialize`, `residual` or `fallback` (`llamaWorkload` allows no other kind there); any other
 * kind, or a projection the MoE plan cannot name, is `PLAN_KIND_NOT_ALLOWED`.
 */
export function toMoePlan(plan: Plan): MoePlan {
  const units: MoePlanUnit[] = [];
  for (const u of plan.units) {
    if (u.expert === undefined) continue;
    const projection = EXPERT_PROJECTIONS.find((p) => p === u.projection);
    if (projection === undefined)
      throw new PlanError(PlanCode.KIND_NOT_ALLOWED, `${unitLabel(u)}: '${u.projection}' is not an expert projection (${EXPERT_PROJECTIONS.join(', ')})`);
    if (u.kind === 'grouped-bank') throw new PlanError(PlanCode.KIND_NOT_ALLOWED, `${unitLabel(u)}: expert units have no bank form`);
    const choice: MoePlanChoice = u.kind;
    units.push({
      adapter: u.adapter,
      layer: `model.layers.${String(u.layer)}.mlp.experts`,
      projection,
      expert: u.expert,
      choice,
      reason: `planner: ${u.kind}`,
    });
  }
  return {
    format: MOE_PLAN_FORMAT,
    version: MOE_PLAN_VERSION,
    ...(plan.model === undefined ? {} : { model: plan.model }),
    units,
  };
}
