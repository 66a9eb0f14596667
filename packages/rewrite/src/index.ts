/**
 * @packageDocumentation
 * `@stageml/rewrite`: graph rewriting for the StageML IR, before specialization.
 *
 * - Rules are data: a pattern (`m.op`, `m.commutative`, `m.capture`, `m.scalar`, `m.oneOf`), a pure
 *   guard and a builder that creates nodes only through the IR's `GraphBuilder` (hash-consed).
 * - `rewriteGreedy` applies rules with a worklist to a fixpoint, returning per-rule counts, the
 *   stop reason and a log of every rewrite (rule, node, before → after).
 * - Rules see an explicit context: binding times at a cutoff, per-request sizes, a cost model and
 *   a memory budget. Rules that trade memory for time are checked against the residual's
 *   per-request time and constant table before they fire.
 * - The library: constant folding, algebraic identities, shape-op composition, transposes into
 *   matmul flags, LoRA merge (every written form, alpha kept) and re-association, matrix-chain
 *   ordering, static scales folded into weights; plus DCE and CSE passes.
 *
 * Invariants: the input graph is never modified; every rewrite keeps the replaced value's type;
 * results are dead-code free and hash-consed; errors are `RewriteError`s with `RW_*` codes.
 */
export { RewriteError, RwCode } from './errors.js';
export type { RwErrorCode } from './errors.js';
export { m, patternAnchors } from './pattern.js';
export type {
  AnyPattern,
  Branded,
  CaptureNames,
  CaptureOptions,
  CapturePattern,
  Captures,
  OneOfPattern,
  OpPattern,
  OpPatternOptions,
  OptOf,
  Pattern,
  PatternNode,
  ReqOf,
  ReqOfAll,
  ScalarPattern,
  StageRequirement,
} from './pattern.js';
export { matchPattern } from './match.js';
export type { MatchResult, MatchView } from './match.js';
export { flattenRules, rule, ruleSet } from './rule.js';
export type { CostGuard, Rule, RuleContext, RuleSet, RuleSpec, ValueDef } from './rule.js';
export { analyticCostModel, evalDimAt } from './cost.js';
export type { AnalyticCostOptions, CostEstimate, CostModel } from './cost.js';
export { loraServingSpec, resolveContext } from './context.js';
export type { ResolvedContext, RewriteContextOptions } from './context.js';
export { rewriteGreedy, rewritePass } from './driver.js';
export type { ResidualEstimate, RewriteLogEntry, RewriteOptions, RewriteResult } from './driver.js';
export { csePass, dcePass, eliminateCommonSubexpressions, eliminateDeadCode } from './passes.js';
export { residualCost } from './residual.js';
export type { ResidualCost } from './residual.js';
export { addDropZero, divDropOne, foldConstants, isScalarLike, mulDropOne, negCancelDouble, subDropZero } from './rules/algebra.js';
export { isIdentityPerm, normalizePerm, reshapeCompose, reshapeDropIdentity, swapsLastTwo, transposeCompose, transposeDropIdentity } from './rules/shape.js';
export { asRank0, linearFoldInputScale, matmulAbsorbTranspose, matmulToLinear, matmulTransposeStaticWeight, mulFoldScaleIntoWeight } from './rules/matmul.js';
export { addMergeLinears, addMergeLora, linearAssociateFactors, linearSplitFactors, subMergeLinears, subMergeLora } from './rules/lora.js';
export { linearReorderChain, matmulReorderChain, planChain } from './rules/chain.js';
export type { ChainPlan } from './rules/chain.js';
export { canonicalRules, defaultRules, stagingRules } from './rules/index.js';
