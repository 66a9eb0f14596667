// Kept so `@stageml/triton-gen/patterns` goes on working: the recognizer moved to
// @stageml/kernel-patterns, which every GPU backend shares.
export { recognizeResidual } from '@stageml/kernel-patterns';
export type * from '@stageml/kernel-patterns';
