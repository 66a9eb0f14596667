/**
 * The TensorFlow.js executor of `@stageml/runtime`: `createTfjsExecutor` runs IR graphs on tfjs
 * (node-gpu, node, wasm or cpu backend) through the exhaustive lowering table `TFJS_RULES`.
 */
export { TFJS_BACKENDS, availableTfjsBackends, isTfjsBackend } from './backend.js';
export type { TfjsBackend } from './backend.js';
export { createTfjsExecutor } from './executor.js';
export type { TfjsExecutorOptions } from './executor.js';
export { exactLowering, lowering, unsupported } from './rule.js';
export type { Kernel, LowerContext, Lowering, TfDType, TfRule, TfRuleTable, Unsupported } from './rule.js';
export { TFJS_RULES } from './rules.js';
