/**
 * @packageDocumentation
 * `@stageml/models`: model families as StageML IR. Today: Llama-family decoders built from a
 * config as shape-only graphs (parameters named as in Hugging Face checkpoints, so a weight store
 * over a checkpoint binds them directly), optionally with LoRA factors on any projection.
 */
export { LLAMA_7B_GQA_SHAPE, LLAMA_PROJECTIONS, buildLlamaGraph, ropeInvFreq } from './llama-graph.js';
export type { LlamaGraphOptions, LlamaLoraShape, LlamaProjection, LlamaShape } from './llama-graph.js';
