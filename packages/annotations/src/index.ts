/**
 * @packageDocumentation
 * `@stageml/annotations`: binding times for the StageML IR.
 *
 * - Stage lattices: totally ordered named chains — `TWO_STAGE` (`static < dynamic`),
 *   `SERVING_STAGES` (`base < adapter < tenant < request < routing < token`) and user chains.
 * - Annotations: a stage for every input and parameter (defaults: parameters earliest, inputs
 *   latest), by exact name or glob. Unknown stages and names are errors, never silently static.
 * - Binding-time analysis: one forward pass using each op's registry facts; every operand position
 *   and every symbolic dim counts; random and stateful ops are never early. Monotone: making an
 *   input later never makes any node earlier.
 */
export { BtaCode, BtaError } from './errors.js';
export type { BtaErrorCode } from './errors.js';
export { BUILTIN_LATTICES, SERVING_STAGES, StageLattice, TWO_STAGE, defineLattice } from './lattice.js';
export type { StageIndex } from './lattice.js';
export { annotate, annotationsToSpec } from './annotate.js';
export type { AnnotationSpec, Annotations } from './annotate.js';
export { analyzeBindingTimes, stageReport } from './bta.js';
export type { BindingTimes, StageSummary } from './bta.js';
