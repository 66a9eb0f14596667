import type { ToolParserName } from './tool-parsers.js';
import type { EngineOptions } from '@stageml/engine';
import type { RouterConfig } from '@stageml/router';
import type { Executor } from '@stageml/runtime';

/** Options of `createServer`. */
export interface ServerOptions {
  /** Hugging Face model directory (required unless `bundle` gives it). */
  readonly modelDir?: string;
  /**
   * A bundle written by `stageml stage --model` (`stageml serve --bundle`): serves its source model
   * and adapters and applies its `plan.json` as written (never re-planned). Excludes `modelDir`
   * and `memoryBudget`; a missing or malformed bundle, or a plan naming adapters that are not
   * loaded, is `BUNDLE_INVALID` (a bad plan document: the planner's `PLAN_*` codes).
   */
  readonly bundle?: string;
  /** Name clients use for the base model (default: the directory name). */
  readonly modelName?: string;
  /** More names clients may use for the base model (vLLM's several `--served-model-name`s). */
  readonly modelAliases?: readonly string[];
  /** Adapters to load at start, name → PEFT directory (vLLM's `--lora-modules name=path`). */
  readonly loraModules?: Readonly<Record<string, string>>;
  /** Every `/v1` request must carry `Authorization: Bearer <apiKey>` (vLLM's `--api-key`). */
  readonly apiKey?: string;
  /** Prompt plus completion tokens (vLLM's `--max-model-len`; default and maximum: the model's positions). */
  readonly maxModelLen?: number;
  /** KV-cache usage in [0, 1] for `vllm:kv_cache_usage_perc` (default: the engine's KV bytes held ÷ maxBatch × maxModelLen × KV bytes per token). */
  readonly kvCacheUsage?: () => number;
  /** A PEFT adapter directory, or a directory of them (one per subdirectory), to load at start. */
  readonly adaptersDir?: string;
  /** Tenants, keys, adapter directories and staged plans. */
  readonly config?: RouterConfig;
  /** Executor running the model (default: the reference interpreter). */
  readonly executor?: Executor;
  /** Weight-only quantization of the model's linear layers (`stageml serve --quantize`). */
  readonly quantize?: EngineOptions['quantize'];
  /** Give the base program its own pre-packed copy of the f32 weights (`stageml serve --pack-base`; `EngineOptions.packBase`). */
  readonly packBase?: boolean;
  /** With KV resident on the executor, keep a host copy of it as well (`stageml serve --host-kv-copy`; `EngineOptions.hostKvCopy`). */
  readonly hostKvCopy?: boolean;
  /**
   * Automatic prefix caching (`stageml serve --enable-prefix-caching`, default true;
   * `EngineOptions.prefixCaching`), within a KV budget of `maxBatch` × `maxModelLen` positions.
   */
  readonly prefixCaching?: boolean;
  /** Where sampled tokens are drawn (`stageml serve --executor-picks`; `EngineOptions.executorPicks`; default: the executor's `devicePicks`). */
  readonly executorPicks?: boolean;
  /** Compute dtype of the engine's programs (`stageml serve --dtype`; default f32). */
  readonly dtype?: EngineOptions['dtype'];
  /** LoRA factors' dtype in a bf16/f16 engine (`stageml serve --adapter-dtype`; default f32). */
  readonly adapterDtype?: EngineOptions['adapterDtype'];
  /** Most sequences decoded together (vLLM's `--max-num-seqs`; default the executor's hint: 256 on a CUDA GPU, 32 on the host CPU). */
  readonly maxBatch?: number;
  /**
   * Most sequences one request may run (prompts × `best_of`/`n`; default half of `maxBatch`, at
   * least 1): a request asking more is refused with 400 before anything runs, so one request
   * cannot take the whole batch from other clients.
   */
  readonly maxRequestSequences?: number;
  /** Most queued requests before 429 (default 256). */
  readonly maxQueue?: number;
  /** Request body limit in bytes (default 1 MiB). */
  readonly bodyLimit?: number;
  /** Most prompt tokens (default: any that leave room under `maxModelLen`). */
  readonly maxPromptTokens?: number;
  /** Most new tokens per request (default: no cap beyond the context, as vLLM; `max_tokens` defaults to the remaining context). */
  readonly maxNewTokens?: number;
  /** Prompt tokens equal to this id are masked, as HF generate with `pad_token_id`. */
  readonly padTokenId?: number;
  /**
   * Key that guards the admin routes (load/unload) and, when set or when tenants are configured,
   * `/metrics` and the details of `/ready`. With it set, admin routes always need it (with or
   * without tenants); with tenants and no admin key they are closed.
   */
  readonly adminKey?: string;
  /**
   * Directories runtime adapter loads may read from (`--adapter-root`, repeatable). Default: the
   * `adaptersDir`, if any; none: `load_lora_adapter` is refused. When given explicitly, a request
   * for an adapter not loaded also loads `<root>/<name>` on demand (docs/scale-out.md).
   */
  readonly adapterRoots?: readonly string[];
  /** Largest `adapter_model.safetensors` a runtime load may read, in bytes (default 4 GiB). */
  readonly maxAdapterBytes?: number;
  /** Most adapter-file bytes runtime loads read at once, over all loads (default 4 GiB). */
  readonly maxAdapterBytesInFlight?: number;
  /** Milliseconds a runtime adapter load may take before it is abandoned and undone (default 30 s). */
  readonly loadTimeoutMs?: number;
  /** Milliseconds a client may take to send a request body (default 30 s); then 408 and the connection closes. */
  readonly bodyTimeoutMs?: number;
  /** Milliseconds `shutdown` waits for in-flight requests before closing every connection (default 30 s). */
  readonly shutdownTimeoutMs?: number;
  /**
   * Milliseconds a queue-full 429 is held before it is sent (default 1000, the Retry-After minimum; 0: at once). A client
   * that retries at once then costs the server a few rejections a second rather than thousands,
   * so a flood past capacity cannot starve the requests being served. At most 4096 are held; past
   * that they are sent at once.
   */
  readonly rejectDelayMs?: number;
  /** Log requests (pino through fastify). */
  readonly logger?: boolean;
  /**
   * Receives one line per problem the server survives at start (an adapter of `adaptersDir` that
   * cannot be served, skipped). Default: standard error.
   */
  readonly warn?: (line: string) => void;
  /**
   * Receives one line per program the engine prepared at start: its staging provenance (form,
   * lattice, cutoff, ops folded and left, how many inputs the residual takes), as JSON; the input
   * names are in `Engine.programReport`. Default: standard error.
   */
  readonly log?: (line: string) => void;
  /** Adapter slot capacity: most adapters loaded at once, `max_lora` in the metrics (default 16). */
  readonly maxLoras?: number;
  /** Name sent in every response's `x-stageml-replica` header (default `hostname:port`). */
  readonly replicaName?: string;
  /** Rank of every engine slot (vLLM `--max-lora-rank`; default 64). */
  readonly maxLoraRank?: number;
  /** Parsed adapters kept on the host (vLLM `--max-cpu-loras`; default `maxLoras`). */
  readonly maxCpuLoras?: number;
  /** Most prompt tokens per prefill chunk (default 32). */
  readonly prefillChunk?: number;
  /** Most prompt tokens one step prefills over all arriving sequences together (vLLM's `--max-num-batched-tokens`; default the executor's hint: 8192 on a CUDA GPU, 64 on the host CPU). */
  readonly prefillTokens?: number;
  /** The same budget while nothing decodes, each sequence's chunk included (default 512). */
  readonly idlePrefillTokens?: number;
  /** Bytes the engine's planner may spend on merged weight copies (default: no planning). */
  readonly memoryBudget?: number;
  /** The chat template used when a request gives none (vLLM's `--chat-template`: the template's text). */
  readonly chatTemplate?: string;
  /**
   * Request defaults for sampling fields a request leaves out or null (`temperature`, `top_p`,
   * `top_k`, `repetition_penalty`), as vLLM takes them from the model's `generation_config.json`.
   */
  readonly generationDefaults?: Readonly<Record<string, number>>;
  /** `tool_choice: "auto"` is allowed (vLLM's `--enable-auto-tool-choice`; needs `toolCallParser`). */
  readonly enableAutoToolChoice?: boolean;
  /** The format `auto` tool calls are read in (vLLM's `--tool-call-parser`: hermes, llama3_json, mistral). */
  readonly toolCallParser?: ToolParserName;
}
