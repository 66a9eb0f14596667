/**
 * @packageDocumentation
 * `@stageml/engine`: the staged serving engine between `@stageml/models` (graph builders) and
 * `@stageml/router` (scheduling).
 *
 * - `Engine`: one prepared program per (model, executor, slot-table shape) holding the base weights
 *   once; LoRA adapters are data in slot tables (run-time inputs) managed by an `AdapterCache`;
 *   per-sequence KV caches resident and appended in place; chunked prefill with last-position
 *   logits; its own accounting of executor-held bytes.
 * - `generateWithEngine`: `generate` of @stageml/models (greedy or sampled continuation) on an engine.
 * - `slotLinear` / `slotExperts`: the BGMV slot projection and the slot-indexed MoE expert LoRA the
 *   program is built from.
 * - `SequenceKv` / `Staging` / `DecodeStaging`: the resident KV layout, the reusable multi-row
 *   staging buffers and the decode batch's staging kept across steps.
 */
export { EngineCode, EngineError } from './errors.js';
export type { EngineErrorCode } from './errors.js';
export { Engine } from './engine.js';
export { generateWithEngine } from './generate.js';
export { checkDeviceMemory, planDeviceMemory } from './device-plan.js';
export type { DeviceMemoryPlan, DeviceMemoryRequest } from './device-plan.js';
/** How `Engine.decodeSample` draws one row's token (of @stageml/runtime). */
export type { RowSample } from '@stageml/runtime';
export { Sequence } from './sequence.js';
export { engineGraph } from './graph.js';
export { ENGINE_CUTOFF, foldProgram, isWeightParam, servingAnnotations, stageEnginePrograms, stageProgram } from './stage-program.js';
export type { ProgramReport, StagedProgram, StagedPrograms } from './stage-program.js';
export { ENGINE_ADAPTER_DTYPES, ENGINE_DTYPES, castEngineGraph, lowestOf } from './dtype.js';
export type { CastEngineOptions, EngineAdapterDType, EngineDType } from './dtype.js';
export { windowKeys, windowedQueries } from './masks.js';
export type { EngineMemory, EngineOptions, EnginePlan, EngineStats, PrefixCachingOptions, PrefillOptions, StepDecode, StepPart, StepPrefill, StepRecord, StepResult } from './options.js';
export { GROUP_SLOT_INPUT, ROW_GROUP_INPUT, ROW_SLOT_INPUT, TOKEN_SLOT_INPUT, chooseSlotForm, slotExperts, slotInputNames, slotLinear } from './slot-linear.js';
export type { SlotForm, SlotModule } from './slot-linear.js';
export { SlotTables } from './slots.js';
export type { ExpertSlotFactors } from './slots.js';
export { DecodeStaging, MASKED, SequenceKv, Staging } from './kv.js';
export { DEFAULT_PREFIX_KV_BUDGET, PrefixCache, adapterReachesKv, moduleReachesKv, prefixCacheOf } from './prefix-cache.js';
export type { PrefixCacheStats, PrefixHit } from './prefix-cache.js';
export { writeRandomAdapter, writeRandomLlama } from './random-checkpoint.js';
export type { RandomAdapterSpec } from './random-checkpoint.js';
