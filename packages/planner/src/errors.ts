import { StageError, type StageErrorOptions, registerErrorCodes } from '@stageml/ir';

/**
 * Error codes of `@stageml/planner`. Codes are public API: never renamed or reused. Expected
 * outcomes (an infeasible budget, a rejected quantization) are returned as discriminated unions,
 * never thrown; these codes are for invalid input and violated plan invariants.
 */
export const PlanCode = registerErrorCodes({
  /** An option is out of range (a budget that is not a non-negative integer, batch ≤ 0, a penalty < 1, …). */
  BAD_OPTION: 'PLAN_BAD_OPTION',
  /** The workload is malformed: duplicate adapters or units, non-positive dims or ranks, an empty allowed-kind set. */
  BAD_WORKLOAD: 'PLAN_BAD_WORKLOAD',
  /** A traffic document is malformed (not `stageml.traffic` v1, negative or non-finite counts, unknown adapters). */
  BAD_TRAFFIC: 'PLAN_BAD_TRAFFIC',
  /** A calibration document is malformed (not `stageml.calibration` v1, missing or non-positive measurements). */
  BAD_CALIBRATION: 'PLAN_BAD_CALIBRATION',
  /** A plan document is malformed (not JSON, not `stageml.plan` v1, a field of the wrong type or an unknown field). */
  BAD_DOCUMENT: 'PLAN_BAD_DOCUMENT',
  /** A plan names a unit (adapter, layer, projection, expert) the workload does not have. */
  UNKNOWN_UNIT: 'PLAN_UNKNOWN_UNIT',
  /** A plan decides one unit twice. */
  DUPLICATE_UNIT: 'PLAN_DUPLICATE_UNIT',
  /** A unit of the workload has no decision in the plan. */
  MISSING_UNIT: 'PLAN_MISSING_UNIT',
  /** A unit's recorded shape (in, out, rank) disagrees with the workload. */
  SHAPE_MISMATCH: 'PLAN_SHAPE_MISMATCH',
  /** The plan's resident memory exceeds its budget. */
  OVER_BUDGET: 'PLAN_OVER_BUDGET',
  /** A unit's kind is not among the kinds the workload allows for it (e.g. materialize rejected by the quantization gate). */
  KIND_NOT_ALLOWED: 'PLAN_KIND_NOT_ALLOWED',
  /** A unit's kind needs an op the chosen executor cannot run. */
  NOT_EXECUTABLE: 'PLAN_NOT_EXECUTABLE',
  /** Recorded memory or cost (per unit or in total) disagrees with what the plan's own units add up to. */
  ACCOUNTING_MISMATCH: 'PLAN_ACCOUNTING_MISMATCH',
  /** A quantization configuration or its operands are invalid (bits, group size, tensor shapes). */
  BAD_QUANT_CONFIG: 'PLAN_BAD_QUANT_CONFIG',
  /**
   * No plan fits the budget. The library returns this outcome as `{ kind: 'infeasible', minMemory }`;
   * the code exists for callers that must turn it into an error (the `stageml plan` command).
   */
  INFEASIBLE: 'PLAN_INFEASIBLE',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  BAD_OPTION: 'input',
  BAD_WORKLOAD: 'input',
  BAD_TRAFFIC: 'input',
  BAD_CALIBRATION: 'input',
  BAD_DOCUMENT: 'input',
  UNKNOWN_UNIT: 'input',
  DUPLICATE_UNIT: 'input',
  MISSING_UNIT: 'input',
  SHAPE_MISMATCH: 'input',
  OVER_BUDGET: 'input',
  KIND_NOT_ALLOWED: 'input',
  NOT_EXECUTABLE: 'input',
  ACCOUNTING_MISMATCH: 'internal',
  BAD_QUANT_CONFIG: 'input',
  INFEASIBLE: 'input',
});

/** Union of `@stageml/planner` error codes. */
export type PlanErrorCode = (typeof PlanCode)[keyof typeof PlanCode];

/** An error raised by the planner: invalid input, or a plan that violates an invariant. */
export class PlanError extends StageError<PlanErrorCode> {
  /** JSON path of the offending entry when the error is about a document (`$.units[3].kind`), else undefined. */
  readonly path: string | undefined;

  /** Creates a coded planner error; `path` (a JSON path) prefixes the message when given. */
  constructor(code: PlanErrorCode, message: string, opts: StageErrorOptions & { readonly path?: string } = {}) {
    super(code, opts.path === undefined ? message : `${opts.path}: ${message}`, opts);
    this.path = opts.path;
  }
}
