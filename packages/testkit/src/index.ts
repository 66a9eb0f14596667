/**
 * @packageDocumentation
 * `@stageml/testkit` (private): the shared test harness of StageML.
 *
 * - fast-check arbitraries: dtypes, tensor types, host tensors (`arbHostTensor`), random
 *   well-typed graphs built through `GraphBuilder` (`arbGraph`), the same with bindings, inputs and
 *   weights (`arbGraphWithData`), and valid samples of every registry op (`opSamples`);
 * - the `toBeAllclose` matcher (registered by `setup.ts`, which also sets the global property-test
 *   effort) and the report behind it (`allcloseReport`).
 *
 * Invariants: generators are deterministic functions of fast-check's choices (failures replay from
 * their seed and shrink); every generated graph verifies; generated data is finite, and index
 * operands are in range.
 */
export { allcloseReport, defaultTolerance, formatAllcloseReport, toBeAllclose } from './allclose.js';
export type { AllcloseOptions, AllcloseReport } from './allclose.js';
export { arbDType, arbDim, arbHostTensor, arbTensorType } from './arb-tensor.js';
export type { HostTensorOptions, TensorTypeOptions } from './arb-tensor.js';
export { GRAPH_OPS, arbGraph, arbGraphWithData, arbStagedGraph, graphSymbols } from './arb-graph.js';
export type { GraphArbOptions, GraphWithData, StagedGraph } from './arb-graph.js';
export { Chooser } from './chooser.js';
export { opSamples } from './op-samples.js';
export type { OpSample, OpSamplers } from './op-samples.js';
export { expectCode, thrownBy } from './errors.js';
export { expectMatchesInterpreter } from './conformance.js';
export { describeNeeding } from './needs.js';
export type { CaseExecutor, ExecutorCase, ExecutorCaseOptions } from './conformance.js';
