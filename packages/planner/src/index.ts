/**
 * @packageDocumentation
 * `@stageml/planner`: cost-based residual planning for LoRA (and MoE expert) adapters.
 *
 * - Units are (adapter, layer, projection[, expert]); each runs as `materialize` (merged weight),
 *   `residual` (compiled low-rank path), `grouped-bank` (shared SGMV/BGMV bank) or `fallback`
 *   (generic path, factors bound at request time).
 * - Per-kind memory and per-request seconds come from a cost model implementing
 *   `@stageml/rewrite`'s `CostModel`: calibrated from measurements of the executor
 *   (`stageml.calibration` v1), or the analytic roofline when none exists.
 * - `Planner.plan(budget, traffic)` returns the plan of minimum traffic-weighted expected seconds
 *   within the memory budget, exactly (a multiple-choice knapsack solved by Lagrangian reduction
 *   and a Pareto DP over the core), or `infeasible` with the least memory any plan needs.
 * - Plans are versioned JSON (`stageml.plan` v1), validated with coded `PLAN_*` errors.
 * - `analyzeQuantization` / `acceptQuantization`: a sound bound on the output error of quantizing
 *   a merged weight instead of the base plus an exact delta (int8/int4, per channel or group).
 *
 * Invariants: every unit is planned exactly once; charged memory ≤ budget; each kind is allowed by
 * the workload and executable by the executor; the optimizer's cost equals brute force's.
 */
export { PlanCode, PlanError } from './errors.js';
export type { PlanErrorCode } from './errors.js';
export { PLAN_KINDS, checkWorkload, forEachUnit, groupUnitCount, isPlanKind, unitKey, unitLabel, workloadUnitCount } from './workload.js';
export type { AdapterWorkload, PlanKind, UnitGroup, UnitRef, Workload } from './workload.js';
export { KIND_OPS, executableKinds, executorCapabilities, whyNotExecutable } from './executor-caps.js';
export type { ExecutorCapabilities } from './executor-caps.js';
export {
  CALIBRATION_FORMAT,
  CALIBRATION_VERSION,
  DEFAULT_CALIBRATION_SHAPES,
  calibrate,
  calibrationToJson,
  checkCalibration,
  gemmShapeClass,
  parseCalibration,
} from './calibration.js';
export type { CalibrateOptions, Calibration, GemmMeasurement, GemmShapeClass } from './calibration.js';
export { plannerCostModel } from './cost-model.js';
export type { PlannerCostModel, PlannerCostOptions } from './cost-model.js';
export { KindCostTable } from './options.js';
export type { BankForm, GroupCosts, KindCost, KindCostOptions } from './options.js';
export { TRAFFIC_FORMAT, TRAFFIC_VERSION, TrafficCounter, checkTraffic, parseTraffic, traffic, trafficShares, zipfTraffic } from './traffic.js';
export type { Traffic } from './traffic.js';
export { solveKnapsack } from './knapsack.js';
export type { KnapsackClass, KnapsackOption, KnapsackResult, KnapsackStats } from './knapsack.js';
export { Planner } from './planner.js';
export type { PlanOutcome, PlannerOptions, PreparedGroup } from './planner.js';
export { popularityPlan } from './baseline.js';
export type { PopularityOptions } from './baseline.js';
export { PLAN_FORMAT, PLAN_VERSION, checkPlan, parsePlan, planToJson } from './plan.js';
export type { BudgetCovers, Plan, PlanAdapter, PlannedUnit } from './plan.js';
export { validatePlan, validatePlanDocument } from './validate.js';
export type { ValidatePlanOptions } from './validate.js';
export { explainPlan, formatBytes, formatExplanation, formatMicros, paretoSvg, paretoSweep } from './explain.js';
export type { ExplanationRow, SweepPoint } from './explain.js';
export { MOE_UNIT_KINDS, llamaWorkload } from './llama.js';
export type { ModelWorkloadOptions } from './llama.js';
export { toMoePlan } from './moe-bridge.js';
export { acceptQuantization, analyzeQuantization, dequantizedAt, kindsAfterGate, outputErrorBound, parseQuantConfig, quantizeSymmetric, quantizedLinearErrorBound, roundHalfEven, weightQuantChooser, weightQuantizationError } from './quant.js';
export { FACTOR_CODE_MAX, loraFactorQuantBound, quantizeFactorRows } from './lora-factor-quant.js';
export type { LoraFactorQuantBound, LoraFactorsInput } from './lora-factor-quant.js';
export type { OutputErrorBound, QuantAnalysis, QuantAnalysisInput, QuantConfig, QuantDecision, QuantizedMatrix, WeightQuantCandidate, WeightQuantError } from './quant.js';
