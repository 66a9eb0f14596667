import type { PrefixCacheStats } from './prefix-cache.js';
import type { Executor, QuantizeLinearsOptions, RowSample, WeightQuantSpec } from '@stageml/runtime';
import type { Sequence } from './sequence.js';
import type { Plan } from '@stageml/planner';
import { EngineCode, EngineError } from './errors.js';
import type { SlotForm } from './slot-linear.js';
import type { EngineAdapterDType, EngineDType } from './dtype.js';

/** Options of `Engine.prefill` / `prefillMany`. */
export interface PrefillOptions {
  /**
   * Most prompt tokens per sequence in this run, overriding `prefillChunk` (a scheduler with no
   * running stream to stall lets an arriving prompt through in fewer, larger runs).
   */
  readonly maxChunk?: number;
}

/** The programs an engine runs: the slot forms, and `base` for batches of base rows only. */
export type ProgramForm = SlotForm | 'base';

/** Options of `Engine.load`. */
export interface EngineOptions {
  /** Executor that runs the program (default: the reference interpreter). */
  readonly executor?: Executor;
  /** Adapters resident in slots at once (vLLM `--max-loras`; default 16). */
  readonly maxLoras?: number;
  /** Rank of every slot; higher-rank adapters are refused at load (vLLM `--max-lora-rank`; default 64). */
  readonly maxLoraRank?: number;
  /**
   * Parsed adapters kept on the host beside the slots (default `maxLoras`; 1 with `deviceWeights`,
   * where the host keeps no factors it has sent). On host slot tables an adapter written into a
   * slot leaves this cache — the slot holds its factors already — so it keeps adapters without a
   * slot; a re-plan or a return to a slot reads the adapter's directory again.
   */
  readonly maxCpuLoras?: number;
  /**
   * Most prompt tokens one prefill run takes (chunked prefill; default 32: on the CPU a 64-token
   * chunk beside 8 decoding streams raised their p99 inter-token latency 2.4×, 32 tokens 1.5×).
   */
  readonly prefillChunk?: number;
  /**
   * Where the base weights live: `inputs` (default for f32) keeps one host copy that every run
   * feeds as zero-copy inputs, so any number of programs share it; `program` hands them to each
   * prepared program as parameters (the executor may pre-pack them; one copy per program).
   */
  readonly weights?: 'program' | 'inputs';
  /**
   * Give the base program (base-only batches) its own copy of the f32 weights as parameters, which
   * the executor may pre-pack: onnxruntime's f32 GEMM on pre-packed weights measured ~1.4× faster
   * than on weights fed as inputs (SmolLM2 shape, engine decode: batch 1 19–21 → 16.8 ms/token,
   * 8 rows 34 → 25.5 ms). Costs a second copy of the weights (counted in `memory().weights`;
   * onnxruntime's session measured about 2× their f32 bytes). With `weights: 'inputs'` (the f32
   * default) the slot programs keep sharing the host copy; with `weights: 'program'` it adds the
   * base program those engines otherwise skip; quantized engines already pack their base program,
   * so it changes nothing there. Default false.
   */
  readonly packBase?: boolean;
  /**
   * Weight-only quantization of the base model's linear layers (`quantizeLinears` of
   * `@stageml/runtime`: int8/int4 codes with f32 scales; slot factors stay f32, as QLoRA keeps
   * them). Quantized weights are packed once and handed to the programs as parameters, so it
   * implies `weights: 'program'` (and so no `memoryBudget` plans or prompt logits).
   */
  readonly quantize?: WeightQuantSpec | QuantizeLinearsOptions;
  /**
   * Slot form: `auto` (default) prepares the gathered, the grouped and the single program and
   * picks per step (single when the batch has one adapter, else `chooseSlotForm`); `gathered` or
   * `grouped` prepares only that one (`single` alone cannot serve two adapters in a batch and is
   * refused). Beside them the engine prepares a `base` program without slot tables for batches of
   * base rows only (not with f32 `weights: 'program'` unless `packBase`, as it would hold another
   * copy of the weights): four preparations for the engine's lifetime by default.
   */
  readonly slotForm?: 'auto' | Exclude<SlotForm, 'single'>;
  /**
   * Bytes the planner may spend on merged weight copies (W + s·B·A of a projection, served in the
   * adapter's lane); undefined: no planning, every adapter is a slot residual. Re-planned on load,
   * unload and every `replanEvery` runs with live traffic, applied between steps.
   */
  readonly memoryBudget?: number;
  /** Runs between periodic re-plans (default 512). */
  readonly replanEvery?: number;
  /**
   * A fixed plan (`stageml.plan` v1, e.g. a bundle's `plan.json`) applied as written instead of
   * planning: its `materialize` units of loaded adapters are served merged, everything else stays
   * in slots; it is never replaced (no re-plans). Checked at load (`PLAN_BAD_DOCUMENT` and the
   * planner's other document codes); excludes `memoryBudget`; needs `weights: 'inputs'`.
   */
  readonly plan?: Plan;
  /**
   * Compute dtype of the programs (default `f32`; `checkpoint`: the float dtype the checkpoint
   * stores). In bf16/f16 the programs compute as transformers does for a bf16/f16 Llama with PEFT
   * (the rounding points of `stageml stage --dtype`, docs/gpu.md §1): weights are held in that
   * dtype, and so is the KV cache (`past_*`/`new_*`: bf16 values in the IR's f32 host storage on the
   * host, 2 bytes an element on a device); logits stay f32 (exact). An executor that cannot run
   * the dtype is `ENGINE_UNSUPPORTED_DTYPE` at load; bf16/f16 exclude `quantize`. MoE expert LoRA
   * (f32 factors) is computed in f32 and added in f32 the same way (not checked against PEFT's
   * expert forms bit for bit).
   */
  readonly dtype?: EngineDType | 'checkpoint';
  /**
   * With a bf16/f16 `dtype`, the LoRA factors' dtype: `f32` (default) keeps the slot tables f32
   * and computes each LoRA term in f32 as PEFT does (`autocast_adapter_dtype`); `same` rounds the
   * factors to the compute dtype (half the slot bytes; not bit-equal to PEFT). `int8` (f32 engines,
   * host slot tables, no MoE expert adapters; opt-in, `--adapter-dtype int8`) stores A and B as int8
   * codes with an f32 scale per rank row — a quarter of the f32 bytes a many-adapter step reads —
   * read in place by cpu-native's bank kernel (other executors dequantize the gathered rows through
   * the op's decomposition); its logit error is bounded by `@stageml/planner`'s
   * `loraFactorQuantBound`. Other combinations are `ENGINE_BAD_OPTIONS` at load.
   */
  readonly adapterDtype?: EngineAdapterDType;
  /**
   * Keep each sequence's KV cache on the executor (`Executor.caches`, the torch worker's device):
   * a step sends token ids, positions, slot ids and the new positions' key mask, never the cached
   * context; the host keeps each sequence's length and key mask (its keys and values too with
   * `hostKvCopy`). Default: whenever the executor has caches and the model has no
   * sliding window (whose per-query mask is built on the host); `true` on an executor without
   * caches, or with a sliding window, is `ENGINE_BAD_OPTIONS`.
   */
  readonly residentKv?: boolean;
  /**
   * Keep the base weights and the slot tables on the executor's device only (the torch executor,
   * `TorchExecutor.device`): the worker reads each weight from the checkpoint's safetensors file
   * itself (memory-mapped, in the stored dtype, converted on the device to the compute dtype as the
   * host would convert it), and the slot tables are made there and written one slot's rows at a
   * time; the host keeps handles (and, for an occupied slot, its adapter's directory to reload
   * from). Tensors the checkpoint does not store as the program wants them (legacy MoE experts,
   * transposed expert stacks) are read on the host as before. Default: on for an executor with
   * device tensors when the weights are inputs (`weights: 'inputs'`, no `quantize`, `packBase`,
   * `memoryBudget` or `plan`, which need the weights' values on the host); `true` where one of
   * those holds is `ENGINE_BAD_OPTIONS`. Adapters that replace whole tensors need a host copy of
   * the weights: with device weights they are refused (`ENGINE_BAD_ADAPTER`).
   */
  readonly deviceWeights?: boolean;
  /**
   * With resident KV, keep a host copy of each sequence's keys and values as well (f32, appended
   * from every step's outputs), from which the caches of a restarted worker are restored. Default
   * false: the executor's cache is the only copy, so a step's new keys and values never cross to
   * the host (`RunOptions.omit`; 16.8 MB per 64-row Llama-3-8B step) nor take host memory (f32, 256
   * KB per position at that shape), and a restarted worker's lost caches are rebuilt by prefilling
   * each sequence's tokens again (its prompt, then its decoded tokens) before the step runs
   * (`EngineStats.cacheRebuilds`). Host-fed KV is on the host anyway.
   */
  readonly hostKvCopy?: boolean;
  /**
   * Automatic prefix caching (vLLM's `--enable-prefix-caching`): sequences' KV is indexed by
   * chained hashes of `blockSize`-token blocks under a key of everything else it depends on (the
   * compute dtype, and an adapter with its load version and its plan merges when the adapter
   * reaches some layer's K/V; one that reaches none shares the base model's blocks), and kept
   * after release within `kvBudget` bytes (live and retained KV together, least recently used
   * retained caches evicted first). A new sequence whose prompt starts with indexed blocks copies
   * those positions instead of prefilling them (never its last prompt token, whose logits are
   * needed): `Sequence.cachedTokens`, `EngineStats.prefixCache`. `true`: the defaults (blocks of
   * 16, a 1 GiB budget). Default off. With resident KV and no `hostKvCopy` the KV stays on the
   * executor: a finished sequence's cache is kept there (`CacheStore.keep`, trimmed to its indexed
   * blocks) and a hit forks the holder's cache on the device (`CacheStore.fork`; the torch worker),
   * the live and retained KV counted at the executor's size per position; an executor without
   * `fork` takes no hits there. A restarted worker's lost caches are dropped from the index before
   * a lookup (`PrefixCacheStats.invalidations`). A longrope model (whose long prompts are one run)
   * takes no hits.
   */
  readonly prefixCaching?: boolean | PrefixCachingOptions;
  /**
   * Where `decodeSample` draws each row's token: `true` on the executor (`RunOptions.sample`: one
   * id per row comes back instead of the vocabulary's logits), `false` on the host from the
   * logits, with the same arithmetic and so the same tokens. Default: the executor's
   * `devicePicks` capability (the torch worker on CUDA; on the CPU torch worker the host is faster,
   * bench/results/torch-sample.md). Greedy picks are made on the executor either way
   * (`RunOptions.argmax`).
   */
  readonly executorPicks?: boolean;
  /**
   * Logits (and the engine's other run outputs) are written into the storage of the previous
   * run's outputs instead of fresh buffers, on executors that can (`RunOptions.recycle`; the
   * cpu-native executor): no allocation per decode step, which on a small heap otherwise drives a
   * major garbage collection every few steps. The cost: logits returned by `decode`, `prefill` or
   * `prefillMany` stay valid only until the engine's next call of one of them (read or copy them
   * first, as the router's scheduler does when it samples). Default false.
   */
  readonly recycleOutputs?: boolean;
  /**
   * `Engine.step`'s bounded-padding rule: a step with decode rows and prefill chunks runs them as
   * one program run (decode rows as one-token chunks, left-padded to the longest chunk C) when the
   * padding that adds, decode rows × (C − 1) token rows, is at most this fraction of the token
   * rows the two runs would take apart (decode rows + prefill rows × C); otherwise the decode rows
   * run first and the prefill chunks second, in the same call. 0 merges only where nothing is
   * padded (every chunk one token); default 0.25.
   */
  readonly stepMergeWaste?: number;
}

/** The plan the engine applies now (what `GET /v1/plan` shows). */
export interface EnginePlan {
  /** The budget of merged copies, or undefined when the engine does not plan. */
  readonly memoryBudget: number | undefined;
  /** The planner's plan (`stageml.plan` v1) last applied. */
  readonly plan: Plan | undefined;
  /** Per adapter, the modules served merged in its lane; all other modules are in its slot. */
  readonly merged: Readonly<Record<string, readonly string[]>>;
  /** Plans applied so far. */
  readonly applied: number;
}

/** `EngineOptions.prefixCaching` in detail. */
export interface PrefixCachingOptions {
  /** Tokens per block, the unit of reuse (default 16). */
  readonly blockSize?: number;
  /** Bytes the live sequences' KV and the retained caches may hold together (default 1 GiB). */
  readonly kvBudget?: number;
}

/** Bytes the engine holds for the executor, by kind (its own accounting). */
export interface EngineMemory {
  /** Base weights: every copy the engine and its programs hold (one; two with `packBase`; one per program with f32 `weights: 'program'`), at the compute dtype's size (2 bytes an element in bf16/f16). */
  readonly weights: number;
  /**
   * Slot tables reserved (A and B of every projection, all slots at the slot rank): address space
   * fixed at load; only the rows adapters write become resident memory.
   */
  readonly slots: number;
  /** Factors of the adapters in slots now, unpadded (rank r, not the slot rank): the tables' resident part. */
  readonly slotFactors: number;
  /** KV buffers of live sequences on the host (capacity, not just the filled part). */
  readonly kv: number;
  /** KV of finished sequences the prefix cache retains for reuse: host buffers at their capacity, or (resident KV without a host copy) the executor's caches kept at their indexed blocks. */
  readonly prefixKv: number;
  /** KV the executor holds for live sequences (resident KV: keys and values at the compute dtype's size, the f32 key mask; filled positions). */
  readonly executorKv: number;
  /** Reusable staging buffers of multi-row steps. */
  readonly staging: number;
  /** Lanes of adapters that cannot vary by row: their override tensors and the plan's merged copies. */
  readonly lanes: number;
  /**
   * Parsed adapters the host cache keeps (`maxCpuLoras`), their tensors' bytes: on host slot
   * tables only adapters not in a slot (a slot holds its adapter's factors already); on device
   * tables at most `maxCpuLoras` (default 1), whatever the number of slots.
   */
  readonly hostAdapters: number;
  /** Sum of the above. */
  readonly total: number;
  /** The part of `total` that lives only on the executor's device (`deviceWeights`: the weights the worker read and the slot tables, plus `executorKv`, and `prefixKv` where the prefix cache keeps it there); the rest is host memory. */
  readonly onDevice: number;
}

/** The decode rows of a step (`StepRecord.decode`). */
export interface StepDecode {
  /** Prefilled, attached sequences. */
  readonly seqs: readonly Sequence[];
  /** Per row, the token it is fed (its last one). */
  readonly tokens: readonly number[];
  /** Per row, how its next token is picked (`decodeSample`); absent: the step returns logits (`decode`). */
  readonly rows?: readonly RowSample[];
}

/** The prefill chunks of a step (`StepRecord.prefill`). */
export interface StepPrefill {
  /** Attached sequences whose prompts are not prefilled yet. */
  readonly seqs: readonly Sequence[];
  /** Per row, how its first token is picked when this step finishes its prompt (`prefillSample`); absent: logits (`prefillMany`). */
  readonly rows?: readonly RowSample[];
  /** The chunk limit (`PrefillOptions.maxChunk`). */
  readonly maxChunk?: number;
}

/**
 * One scheduler step handed to `Engine.step` (the shape of vLLM V1's scheduler output): the
 * decode rows with their next tokens and sampling rows, the prefill chunks; each sequence names
 * its slot (adapter) and its cache.
 */
export interface StepRecord {
  readonly decode?: StepDecode;
  readonly prefill?: StepPrefill;
}

/** A part of a step's result: per row its value, or the error that failed the whole part. */
export type StepPart<T> = { readonly values: readonly T[]; readonly error?: undefined } | { readonly values?: undefined; readonly error: unknown };

/** What `Engine.step` gives back. */
export interface StepResult {
  /** Per decode row, its token (with `rows`) or its logits f32[vocab]; absent without decode rows. */
  readonly decode?: StepPart<number | Float32Array>;
  /** Per prefill row whose prompt this step finished, its first token or its logits, else undefined. */
  readonly prefill?: StepPart<number | Float32Array | undefined>;
  /** Whether decode rows and prefill chunks ran as one program run. */
  readonly merged: boolean;
  /** Program runs the step took (one when merged or of one kind; more with lanes or two kinds). */
  readonly runs: number;
}

/** Counters of the engine. */
export interface EngineStats {
  /**
   * Executor preparations made: one per program, and once per slot form more when the first
   * adapter with DoRA scales or LoRA biases loads (the forms that read the output tables); plain
   * LoRA adapters never add one.
   */
  readonly preparations: number;
  /** Program runs (prefill chunks and decode steps). */
  readonly runs: number;
  /** Runs by slot form. */
  readonly runsByForm: Readonly<Record<ProgramForm, number>>;
  /** Of the slot-form runs, those of the forms with the output tables (a row on a DoRA or LoRA-bias adapter). */
  readonly outTableRuns: number;
  /** Adapters resident in slots now. */
  readonly residentAdapters: number;
  /** Live sequences. */
  readonly sequences: number;
  /** Adapter slots holding no adapter. */
  readonly freeSlots: number;
  /** Sequences whose executor cache was lost (a restarted worker) and rebuilt from their tokens (resident KV without `hostKvCopy`). */
  readonly cacheRebuilds: number;
  /** Steps run again because the executor's worker died under them (`RT_WORKER_FAILED`; the next run starts a new worker). */
  readonly workerRetries: number;
  /** `Engine.step` calls (one per scheduler step). */
  readonly steps: number;
  /** Of those, steps whose decode rows and prefill chunks ran as one program run (`stepMergeWaste`). */
  readonly mergedSteps: number;
  /**
   * The executor's own counters of its caches and step graphs (`CacheStore.stats`: the torch
   * worker's re-stagings, joins, gathers, graph captures and replays), as last reported; empty
   * where the executor keeps none.
   */
  readonly executor: Readonly<Record<string, number>>;
  /** The prefix cache's counters (`EngineOptions.prefixCaching`); absent where it is off. */
  readonly prefixCache?: PrefixCacheStats;
}

/**
 *
 */
export function positiveInt(name: string, v: number | undefined, dflt: number): number {
  const x = v ?? dflt;
  if (!Number.isSafeInteger(x) || x < 1) throw new EngineError(EngineCode.BAD_OPTIONS, `${name} must be a positive integer, got ${String(v)}`);
  return x;
}
