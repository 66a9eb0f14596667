/**
 * The onnxruntime executor of `@stageml/runtime`: `createOrtExecutor` runs IR graphs on
 * onnxruntime-node (an optional peer dependency, detected at run time) through `@stageml/onnx-lower`,
 * and `selectExecutor` picks the fastest executor available on this machine.
 */
export { createOrtExecutor, isOrtAvailable, ortCapabilities } from './executor.js';
export type { OrtExecutorOptions } from './executor.js';
export { DEFAULT_CANDIDATES, DEFAULT_FALLBACKS, DEFAULT_PROBE_SHAPE, EXECUTOR_ENV, EXECUTOR_NAMES, createExecutorByName, isExecutorName, selectExecutor } from './select.js';
export type { CreateExecutorOptions, ExecutorName, ExecutorProbeMoe, ExecutorProbeShape, ExecutorSelection, SelectExecutorOptions } from './select.js';
