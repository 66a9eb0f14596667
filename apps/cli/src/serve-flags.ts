import type { ServerOptions } from '@stageml/server';
import { parseAutoOnOff, parseHost, parseNonNegativeInt, parsePort, parsePositiveInt, parseSeconds } from './args.js';
import { EXECUTOR_NAMES } from './executors.js';
import { parseBytes } from './commands/plan.js';
import { parseMaxError } from './quantize.js';
import { InvalidArgumentError } from 'commander';

/**
 * One flag of `stageml serve`: the one place it is described. `stageml serve --help`, the flag table
 * of docs/server.md (`pnpm docs:serve-flags`) and the options `createServer` receives for a flag
 * that passes through unchanged (`to`) all come from this entry.
 */
export interface ServeFlag {
  /** Commander's spelling: `--name <value>`, `--name <values...>`, `--switch`, `--no-switch`. */
  readonly spec: string;
  /** What it does, in markdown (backticks and links are stripped for `--help`). */
  readonly help: string;
  /** A vLLM `serve` flag (the docs mark the others "not vLLM"). */
  readonly vllm: boolean;
  /** Parses and checks the value (commander's argument parser: bad values are usage errors naming the flag). */
  readonly parse?: (value: string, previous: unknown) => unknown;
  /** The value when the flag is not given. */
  readonly default?: unknown;
  /** The `createServer` option this flag sets as given, when it passes through unchanged. */
  readonly to?: keyof ServerOptions;
}

/** Parses `--gpu-memory-utilization`: a number in (0, 1]. */
export function parseUtilization(value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n <= 0 || n > 1) throw new InvalidArgumentError(`expected a share of the device's memory in (0, 1], got '${value}'`);
  return n;
}

/** `stageml serve --dtype` values: a compute dtype, or `checkpoint` (the float dtype the checkpoint stores). */
export const SERVE_DTYPES = ['f32', 'bf16', 'f16', 'checkpoint'] as const;

/** Every flag of `stageml serve`, in the order `--help` and docs/server.md list them. */
export const SERVE_FLAGS: readonly ServeFlag[] = [
  { spec: '--model <dir>', vllm: true, help: 'the Hugging Face model directory, instead of the positional `MODEL` (as `vllm serve MODEL`)' },
  { spec: '--served-model-name <names...>', vllm: true, help: 'names of the base model; responses echo the name asked for, `/v1/models` lists all (default: the model path as typed, as vLLM)' },
  { spec: '--enable-lora', vllm: true, help: 'allows `--lora-modules` (as vLLM, they need it); runtime loading (`/v1/load_lora_adapter`) is on for paths inside an `--adapter-root`' },
  { spec: '--lora-modules <modules...>', vllm: true, help: 'adapters loaded at start: `name=path …`, or vLLM\'s JSON form `{"name": …, "path": …}`' },
  { spec: '--max-model-len <n>', vllm: true, parse: parsePositiveInt, to: 'maxModelLen', help: 'prompt + completion tokens (default and maximum: `max_position_embeddings`)' },
  { spec: '--api-key <key>', vllm: true, to: 'apiKey', help: 'every `/v1` request, `/tokenize` and `/detokenize` need `Authorization: Bearer KEY` (401 otherwise); `/health` and `/metrics` stay open' },
  { spec: '--max-batch <n>', vllm: false, parse: parsePositiveInt, help: 'most sequences decoded together (default: the executor\'s, 256 on a CUDA torch worker, 32 on the CPU); `--max-num-seqs` is vLLM\'s name for it' },
  { spec: '--max-num-seqs <n>', vllm: true, parse: parsePositiveInt, help: 'vLLM\'s name for `--max-batch`' },
  { spec: '--enable-prefix-caching', vllm: true, help: 'automatic prefix caching, on by default (as vLLM): the KV of 16-token prompt blocks is kept (live sequences\' and, after they finish, least recently used first evicted within `--max-num-seqs` × `--max-model-len` positions of KV) and reused by any later prompt that starts with the same blocks under the same K/V (the base model, and adapters that reach no layer\'s K/V, share blocks; an adapter that does has its own, per load); `usage.prompt_tokens_details.cached_tokens`, `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits`. With `--executor torch` the cached blocks\' KV stays on the worker\'s device (a finished sequence\'s cache is kept there, a hit copies the blocks device to device; no host copy, unless `--host-kv-copy`) and a restarted worker\'s lost blocks are never served (docs/server.md)' },
  { spec: '--no-enable-prefix-caching', vllm: true, help: 'no prefix caching: every prompt is prefilled whole' },
  { spec: '--chat-template <file>', vllm: true, help: 'the chat template of requests that give none, a file or the template text (a request\'s `chat_template` wins)' },
  { spec: '--generation-config <src>', vllm: true, help: 'request defaults for `temperature`, `top_p`, `top_k`, `repetition_penalty` from the model\'s `generation_config.json` (`auto`, the default, as vLLM; `do_sample: false` means greedy), none with `vllm`, or from `DIR/generation_config.json`; a request\'s own values win' },
  { spec: '--enable-auto-tool-choice', vllm: true, help: 'allows `tool_choice: "auto"` (needs `--tool-call-parser`)' },
  { spec: '--tool-call-parser <name>', vllm: true, help: 'how auto tool calls are read from the output: `hermes` (also Qwen 2.5/3), `llama3_json`, `mistral` (docs/server.md, Tool calling)' },
  { spec: '--quantization <method>', vllm: true, help: 'refused: vLLM\'s quantized checkpoint formats are not read; our weight-only quantization of a float checkpoint is `--quantize`' },
  { spec: '--dtype <dtype>', vllm: true, help: `compute dtype: vLLM's \`auto\`, \`bfloat16\`, \`half\`/\`float16\`, \`float32\`, or ours (${SERVE_DTYPES.map((d) => `\`${d}\``).join(', ')}; \`checkpoint\`: the one the checkpoint stores). \`auto\`, the default, is \`checkpoint\` on \`--executor torch\`, else f32; bf16/f16 compute as transformers + PEFT do and need an executor that runs them (torch, interpreter)` },
  { spec: '--adapter-dtype <dtype>', vllm: false, help: 'LoRA factors\' storage. With a bf16/f16 `--dtype`: `f32` (as PEFT computes them), `same` (rounded to the compute dtype, as vLLM holds them: half the bytes, and what the torch worker\'s bank kernel reads) or `auto` (the default: `same` on `--executor torch` with CUDA, else `f32`). `int8` (opt-in, an f32 engine): int8 codes with an f32 scale per rank row, a quarter of the bytes a many-adapter decode step reads from the slot tables, read in place by cpu-native\'s bank kernel (other host executors dequantize the rows they gather; device slot tables and MoE expert adapters refuse it); the logit error is bounded by the planner\'s analysis (docs/adapters.md)' },
  { spec: '--gpu-memory-utilization <f>', vllm: true, parse: parseUtilization, help: 'with `--executor torch`: the share of the device\'s memory (0, 1] the weights, slot tables, KV of `--max-batch` sequences at `--max-model-len` and a step\'s workspace must fit in (as vLLM; checked at start, `ENGINE_DEVICE_MEMORY` naming the sizes when they do not fit)' },
  { spec: '--max-loras <n>', vllm: true, parse: parsePositiveInt, to: 'maxLoras', help: 'adapters resident in engine slots at once (default 16)' },
  { spec: '--max-lora-rank <n>', vllm: true, parse: parsePositiveInt, to: 'maxLoraRank', help: 'rank of every slot; higher-rank adapters are refused (default 64)' },
  { spec: '--max-cpu-loras <n>', vllm: true, parse: parsePositiveInt, to: 'maxCpuLoras', help: 'parsed adapters kept on the host beside the slots (default: `--max-loras`; 1 when the weights and slot tables live on the torch worker\'s device). On host slot tables an adapter written into a slot leaves this cache (the slot holds its factors already); the cache keeps adapters without a slot' },
  { spec: '--max-queue <n>', vllm: false, parse: parsePositiveInt, to: 'maxQueue', help: 'most requests **one tenant** may have waiting (default 256; a tenant\'s `max_queue` overrides it); then 429' },
  { spec: '--prefill-chunk <n>', vllm: false, parse: parsePositiveInt, to: 'prefillChunk', help: 'most prompt tokens of one sequence prefilled per step: a long prompt advances one chunk per step beside the running streams (default 32)' },
  { spec: '--prefill-tokens <n>', vllm: false, parse: parsePositiveInt, help: 'most prompt tokens prefilled per step over all arriving sequences together, rows × longest chunk (default: the executor\'s, 8192 on a CUDA torch worker, 64 on the CPU): a burst of arrivals is prefilled in one run; `--max-num-batched-tokens` is vLLM\'s name for it. A budget of at least `--idle-prefill-tokens` lets each prompt\'s chunk grow to that size while streams decode' },
  { spec: '--max-num-batched-tokens <n>', vllm: true, parse: parsePositiveInt, help: 'vLLM\'s name for `--prefill-tokens`' },
  { spec: '--idle-prefill-tokens <n>', vllm: false, parse: parsePositiveInt, to: 'idlePrefillTokens', help: 'the same budget while no sequence decodes, each prompt\'s chunk included (default 512): with no stream to stall, an arriving prompt is prefilled in one large run instead of `--prefill-chunk`-sized ones' },
  { spec: '--adapters <dir>', vllm: false, to: 'adaptersDir', help: 'a PEFT adapter directory, or a directory of them, loaded at start; in a directory of adapters, one that cannot be served is reported on one line and skipped' },
  { spec: '--host <host>', vllm: true, parse: parseHost, default: '127.0.0.1', help: 'address to listen on' },
  { spec: '--port <n>', vllm: true, parse: parsePort, default: 8000, help: 'port (0: any free port)' },
  { spec: '--config <file>', vllm: false, help: 'tenants, API keys, adapters and staged plans (JSON; docs/server.md, Tenants)' },
  { spec: '--executor <name>', vllm: false, default: 'auto', help: `what runs the programs: ${EXECUTOR_NAMES.map((n) => `\`${n}\``).join(', ')}. \`auto\` (default) measures cpu-native and onnxruntime on one decoder layer of this model once (cached) and takes the faster; the log names the choice and the times ([onnx.md](onnx.md#executor-selection)); \`torch\` is a Python worker on CUDA or CPU ([gpu.md](gpu.md)); \`interpreter\` is exact and slow` },
  { spec: '--pad-token-id <id>', vllm: false, parse: parseNonNegativeInt, to: 'padTokenId', help: 'mask prompt tokens equal to this id (`generate(pad_token_id=…)` semantics)' },
  { spec: '--tensor-parallel-size <n>', vllm: true, parse: parsePositiveInt, help: 'with `--executor torch` only: the torch worker runs as N ranks (processes), rank r on `cuda:r` (NCCL, NVLink multicast off) or on the CPU (gloo), each holding its shard of the weights, adapter slots and KV cache; the engine, router and server are unchanged above the executor. `-tp N` is its short name; default 1. A size that divides neither the model\'s attention heads nor (either way) its key/value heads is `CLI_USAGE` before the worker starts; more ranks than CUDA devices is `RT_TENSOR_PARALLEL` ([gpu.md](gpu.md) §2.9). Multi-GPU runs are not measured yet' },
  { spec: '--quantize <spec>', vllm: false, help: 'weight-only quantization of the linear layers: `int8`, `int4` (blocks of 32), `int8:g128`, `int4:channel`, `…:asym`, or `auto` (with `--max-error`) ([quantization.md](quantization.md))' },
  { spec: '--max-error <e>', vllm: false, parse: parseMaxError, help: 'with `--quantize auto`: the largest relative weight error per projection' },
  { spec: '--memory-budget <bytes>', vllm: false, parse: parseBytes, to: 'memoryBudget', help: 'bytes the planner may spend on merged weight copies (`64MiB`, `2GB`; default: no planning, all adapters in slots)' },
  { spec: '--pack-base', vllm: false, help: 'base-only batches run a program with its own pre-packed copy of the f32 weights (batch-1 decode ~1.2–1.4× faster on onnxruntime, a second copy of the weights in memory)' },
  { spec: '--host-kv-copy', vllm: false, help: 'with `--executor torch`: keep a host copy of every sequence\'s KV cache (f32, appended each step) from which a restarted worker is restored; by default the worker\'s cache is the only copy and a restarted worker rebuilds it by prefilling the tokens again (`stageml_engine_cache_rebuilds`)' },
  { spec: '--executor-picks <when>', vllm: false, parse: parseAutoOnOff, help: '`auto`, `on` or `off`: draw sampled tokens (temperature, top-k, top-p, penalties and bias; not with logprobs) on the executor, one id per row back instead of the logits (`auto`: where the executor says it pays, the torch worker on CUDA); the same tokens either way' },
  { spec: '--bundle <dir>', vllm: false, help: 'serve a bundle of `stageml stage --model`: its source model and adapters with its `plan.json` applied as written, never re-planned ([bundle.md](bundle.md)); excludes `MODEL` and `--memory-budget`' },
  { spec: '--admin-key <key>', vllm: false, to: 'adminKey', help: 'guards load/unload always when set (with or without `--config`), and `/metrics` and the details of `/ready`' },
  { spec: '--adapter-root <dir...>', vllm: false, to: 'adapterRoots', help: 'directories `load_lora_adapter` may read from (repeatable; default: `--adapters`; none: runtime loads refused); when given, a request for an adapter not loaded loads `DIR/<name>` on demand ([scale-out.md](scale-out.md))' },
  { spec: '--shutdown-timeout <s>', vllm: false, parse: parseSeconds, to: 'shutdownTimeoutMs', help: 'seconds SIGTERM waits for in-flight requests before closing every connection (default 30)' },
  { spec: '--body-timeout <s>', vllm: false, parse: parseSeconds, to: 'bodyTimeoutMs', help: 'seconds a client may take to send a request body, else 408 and the connection closes (default 30)' },
  { spec: '--log', vllm: false, help: 'log every request (pino)' },
  { spec: '--replica-name <name>', vllm: false, to: 'replicaName', help: 'name sent in the `x-stageml-replica` header (default: `hostname:port`)' },
];

/** The option key commander gives a flag's value: `--max-lora-rank` → `maxLoraRank` (`--no-x` → `x`). */
export function flagKey(spec: string): string {
  const name = spec.split(/[ =]/)[0]!.replace(/^--(no-)?/, '');
  return name.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());
}

/** `text` with markdown code spans, emphasis and links reduced to plain text (for `--help`). */
export function plainHelp(text: string): string {
  return text.replace(/\[([^\]]+)\]\([^)]+\)/g, '$1').replace(/`([^`]*)`/g, '$1').replace(/\*\*([^*]+)\*\*/g, '$1');
}

/** The `createServer` options of every given flag that passes through unchanged (`ServeFlag.to`). */
export function passThroughOptions(flags: Readonly<Record<string, unknown>>): Partial<Record<keyof ServerOptions, unknown>> {
  const out: Partial<Record<keyof ServerOptions, unknown>> = {};
  for (const f of SERVE_FLAGS) {
    if (f.to === undefined) continue;
    const v = flags[flagKey(f.spec)];
    if (v !== undefined) out[f.to] = v;
  }
  return out;
}

/** The flag table of docs/server.md: every flag, what it does, and which are not vLLM's. */
export function renderServeFlagTable(): string {
  const spelling = (spec: string): string => spec.replace(/ <([^>.]+)(\.\.\.)?>/, (_, name: string, more: string | undefined) => ` ${name.toUpperCase()}${more === undefined ? '' : ' …'}`);
  const rows = SERVE_FLAGS.map((f) => `| \`${spelling(f.spec)}\` | ${f.vllm ? '' : '(not vLLM) '}${f.help.replace(/\|/g, '\\|')} |`);
  return ['| flag | meaning here |', '| --- | --- |', '| `MODEL` (positional) | the Hugging Face model directory (or `--model`) |', ...rows].join('\n');
}
