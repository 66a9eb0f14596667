/**
 * @packageDocumentation
 * `@stageml/peft`: LoRA adapters as PEFT writes them.
 *
 * - `parseLoraConfig` / `loadLoraAdapter`: every `adapter_config.json` field PEFT 0.21 writes that
 *   changes numerics (r, lora_alpha, use_rslora, rank_pattern, alpha_pattern, target_modules as a
 *   list or regex, exclude_modules, layers_to_transform, fan_in_fan_out, bias, lora_bias,
 *   modules_to_save, target_parameters); DoRA and non-LoRA types are refused with a coded error.
 *   Regexes match in linear time (RE2, `re.fullmatch` semantics); tensors are converted to f32
 *   and checked finite and bounded at load.
 * - `checkAdapterAgainstBase`: shape checks naming the key and both shapes.
 * - `loraLinear`: a linear with a LoRA delta in residual or merged form, as plain IR.
 * - `bankLinearGrouped` / `bankLinearGathered`: mixed-adapter batches (SGMV / BGMV style) as IR ops
 *   with reference semantics, so every executor and lowering sees them.
 * - `AdapterCache`: executor-resident adapter tensors under a byte budget (LRU, pinning,
 *   single-flight loads, never evicting an adapter in use).
 */
export { PeftCode, PeftError } from './errors.js';
export type { PeftErrorCode } from './errors.js';
export { MAX_CONFIG_DEPTH, MAX_LORA_ALPHA, MAX_PATTERN_LENGTH, alphaFor, matchPatternKey, parseLoraConfig, rankFor, scalingFor, targetsModule } from './config.js';
export type { LoraConfig } from './config.js';
export { MAX_ADAPTER_VALUE, checkAdapterAgainstBase, checkedAdapterTensor, loadLoraAdapter } from './adapter.js';
export { findAdapterDirs } from './adapter-dirs.js';
export type { AdapterDir } from './adapter-dirs.js';
export type { LoraAdapter, LoraModule, LoraParameterFactors, TokenRows } from './adapter.js';
export { loraLinear } from './attach.js';
export type { LoraForm, LoraValues } from './attach.js';
export { bankLinearGathered, bankLinearGrouped, chooseBankForm } from './bank.js';
export type { BankGroup, StackedLora } from './bank.js';
export { AdapterCache, loraDirectoryLoader } from './cache.js';
export type { AcquireOptions, AdapterCacheOptions, AdapterCacheStats, CacheEntryInfo, CacheLease, CacheLoad, CacheLoader } from './cache.js';
