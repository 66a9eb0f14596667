import { type RuleSet, ruleSet } from '../rule.js';
import { addDropZero, divDropOne, foldConstants, mulDropOne, negCancelDouble, subDropZero } from './algebra.js';
import { linearReorderChain, matmulReorderChain } from './chain.js';
import { addMergeLinears, addMergeLora, linearAssociateFactors, linearSplitFactors, subMergeLinears, subMergeLora } from './lora.js';
import { linearFoldInputScale, matmulAbsorbTranspose, matmulToLinear, matmulTransposeStaticWeight, mulFoldScaleIntoWeight } from './matmul.js';
import { reshapeCompose, reshapeDropIdentity, transposeCompose, transposeDropIdentity } from './shape.js';

/**
 * Canonicalization (MLIR's discipline): rules that always improve the IR or keep its cost, converge
 * and are cheap to match — constant folding, algebraic identities, shape-op composition, transposes
 * folded into matmul flags, matmul-with-transposed-matrix as `linear`.
 */
export const canonicalRules: RuleSet = ruleSet('canonicalize', [
  foldConstants,
  mulDropOne,
  divDropOne,
  addDropZero,
  subDropZero,
  negCancelDouble,
  transposeCompose,
  transposeDropIdentity,
  reshapeCompose,
  reshapeDropIdentity,
  matmulAbsorbTranspose,
  matmulToLinear,
]);

/**
 * Staging rules: cost-driven choices of what to compute ahead of time — static weights
 * transposed into `linear` form, static scales folded into weights, LoRA merging and
 * re-association, and matrix-chain ordering. Each asks the context's cost model and budget.
 */
export const stagingRules: RuleSet = ruleSet('staging', [
  matmulTransposeStaticWeight,
  mulFoldScaleIntoWeight,
  linearFoldInputScale,
  addMergeLora,
  subMergeLora,
  addMergeLinears,
  subMergeLinears,
  linearSplitFactors,
  linearAssociateFactors,
  matmulReorderChain,
  linearReorderChain,
]);

/** The full library: canonicalization first, then staging. */
export const defaultRules: RuleSet = ruleSet('default', [canonicalRules, stagingRules]);
