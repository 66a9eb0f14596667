import { readFile, stat } from 'node:fs/promises';
import { type Command, InvalidArgumentError } from 'commander';
import { parseRouterConfig } from '@stageml/router';
import { checkDeviceMemory } from '@stageml/engine';
import { createServer } from '@stageml/server';
import { errorMessage } from '@stageml/ir';
import { parseAutoOnOff, parseHost, parseNonNegativeInt, parsePort, parsePositiveInt, parseSeconds } from '../args.js';
import { CliCode, CliError } from '../errors.js';
import { EXECUTOR_NAMES, probeShapeOf, resolveExecutor } from '../executors.js';
import type { CliIo } from '../io.js';
import { inPhase } from '../progress.js';
import { parseBytes } from './plan.js';
import { parseMaxError, quantizeOptions } from '../quantize.js';
import { type VllmServeFlags, dtypeOf, vllmServeOptions } from '../vllm-flags.js';

interface ServeOptions {
  model?: string;
  servedModelName?: string[];
  enableLora?: boolean;
  loraModules?: string[];
  maxModelLen?: number;
  apiKey?: string;
  adapters?: string;
  host: string;
  port: number;
  config?: string;
  executor?: string;
  tensorParallelSize?: number;
  padTokenId?: number;
  maxBatch?: number;
  maxNumSeqs?: number;
  maxQueue?: number;
  prefillChunk?: number;
  prefillTokens?: number;
  maxNumBatchedTokens?: number;
  idlePrefillTokens?: number;
  adminKey?: string;
  adapterRoot?: string[];
  shutdownTimeout?: number;
  bodyTimeout?: number;
  log?: boolean;
  replicaName?: string;
  maxLoras?: number;
  maxLoraRank?: number;
  maxCpuLoras?: number;
  memoryBudget?: number;
  quantize?: string;
  packBase?: boolean;
  hostKvCopy?: boolean;
  executorPicks?: boolean | 'auto';
  maxError?: number;
  bundle?: string;
  dtype?: string;
  adapterDtype?: string;
  gpuMemoryUtilization?: number;
}

type ServeFlags = ServeOptions & VllmServeFlags;

/** `stageml serve --dtype` values: a compute dtype, or `checkpoint` (the float dtype the checkpoint stores). */
export const SERVE_DTYPES = ['f32', 'bf16', 'f16', 'checkpoint'] as const;

/**
 * `--tensor-parallel-size` checked before any worker starts: above 1 it needs `--executor torch`,
 * and the model's attention heads (and key/value heads, or their multiple) must split over the
 * ranks; else `CLI_USAGE` naming the numbers. Undefined when the flag is absent.
 */
export function checkTensorParallel(size: number | undefined, executor: string | undefined, shape: { readonly heads?: number; readonly kvHeads?: number } | undefined): number | undefined {
  if (size === undefined || size === 1) return size;
  if (executor !== 'torch') throw new CliError(CliCode.USAGE, `--tensor-parallel-size ${String(size)} needs --executor torch (got ${executor ?? 'auto'})`);
  const heads = shape?.heads;
  const kv = shape?.kvHeads ?? heads;
  if (heads !== undefined && heads % size !== 0) throw new CliError(CliCode.USAGE, `--tensor-parallel-size ${String(size)} does not divide the model's ${String(heads)} attention heads`);
  if (kv !== undefined && kv % size !== 0 && size % kv !== 0) throw new CliError(CliCode.USAGE, `--tensor-parallel-size ${String(size)} and the model's ${String(kv)} key/value heads: neither divides the other`);
  return size;
}

/** The value of a flag given under either of its names; both with different values is `CLI_USAGE`. */
export function aliased(name: string, value: number | undefined, alias: string, aliasValue: number | undefined): number | undefined {
  if (value !== undefined && aliasValue !== undefined && value !== aliasValue) throw new CliError(CliCode.USAGE, `${name} ${String(value)} and ${alias} ${String(aliasValue)} name the same setting: give one`);
  return value ?? aliasValue;
}

/**
 * vLLM's `--dtype` spellings and what they mean here: `auto` is the default choice (below),
 * `bfloat16`/`float16`/`float32` the compute dtypes.
 */
export const SERVE_DTYPE_ALIASES: Readonly<Record<string, (typeof SERVE_DTYPES)[number] | undefined>> = { auto: undefined, bfloat16: 'bf16', float16: 'f16', float32: 'f32' };

/** Every `--dtype` spelling `serveDtypes` accepts. */
const DTYPE_SPELLINGS = [...Object.keys(SERVE_DTYPE_ALIASES), ...SERVE_DTYPES];

/**
 * The engine dtype of `--dtype`/`--adapter-dtype`: `--dtype` if given (one of `SERVE_DTYPES`, or
 * vLLM's `bfloat16`, `float16`, `float32`; `auto` is the same as leaving it out), else
 * `checkpoint` on a torch executor (`torch-cpu`, `torch-cuda`) unless `quantized` (weight-only
 * quantization packs f32 weights), and f32 on the others; a bad value is
 * `CLI_USAGE`, as is `--adapter-dtype` (f32 or same) without a bf16/f16 dtype to apply to.
 */
export function serveDtypes(given: string | undefined, adapterDtype: string | undefined, executorName: string, quantized = false): { dtype: (typeof SERVE_DTYPES)[number]; adapterDtype?: 'f32' | 'same' } {
  if (given !== undefined && !DTYPE_SPELLINGS.includes(given)) throw new CliError(CliCode.USAGE, `--dtype must be one of ${DTYPE_SPELLINGS.join(', ')}, got '${given}'`);
  const dtype = given !== undefined && Object.hasOwn(SERVE_DTYPE_ALIASES, given) ? SERVE_DTYPE_ALIASES[given] : given;
  if (adapterDtype !== undefined && adapterDtype !== 'f32' && adapterDtype !== 'same') throw new CliError(CliCode.USAGE, `--adapter-dtype must be one of f32, same, got '${adapterDtype}'`);
  if (adapterDtype !== undefined && dtype === 'f32') throw new CliError(CliCode.USAGE, '--adapter-dtype applies to a bf16/f16 --dtype (f32 factors are the f32 engine\'s own)');
  const chosen = (dtype ?? (executorName.startsWith('torch-') && !quantized ? 'checkpoint' : 'f32')) as (typeof SERVE_DTYPES)[number];
  return { dtype: chosen, ...(adapterDtype === undefined ? {} : { adapterDtype }) };
}

/** Parses `--gpu-memory-utilization`: a number in (0, 1]. */
export function parseUtilization(value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n <= 0 || n > 1) throw new InvalidArgumentError(`expected a share of the device's memory in (0, 1], got '${value}'`);
  return n;
}

/** Fails with `CLI_IO` naming the flag unless `path` is an existing directory. */
async function requireDir(path: string, flag: string): Promise<void> {
  const s = await stat(path).catch(() => undefined);
  if (s === undefined) throw new CliError(CliCode.IO, `${flag} '${path}' does not exist`);
  if (!s.isDirectory()) throw new CliError(CliCode.IO, `${flag} '${path}' is not a directory`);
}

/** `stageml serve`: the reference server (OpenAI-compatible API) on a model and its adapters. */
export function registerServe(program: Command, io: CliIo): void {
  program
    .command('serve')
    .description('serve a model and its adapters behind an OpenAI-compatible HTTP API (vLLM-style flags)')
    .argument('[model]', 'Hugging Face model directory (as `vllm serve MODEL`)')
    .option('--model <dir>', 'Hugging Face model directory (instead of the positional MODEL)')
    .option('--served-model-name <names...>', 'names clients use for the base model; the first is the main one (default: the directory name)')
    .option('--enable-lora', 'serve LoRA adapters (needed for --lora-modules, as in vLLM)')
    .option('--lora-modules <modules...>', "adapters to load at start: name=path, or JSON {\"name\": …, \"path\": …}")
    .option('--max-model-len <n>', 'prompt + completion tokens (default: the model\'s max_position_embeddings)', parsePositiveInt)
    .option('--api-key <key>', 'require Authorization: Bearer <key> on every /v1 request')
    .option('--adapters <dir>', 'a PEFT adapter directory, or a directory of them, loaded at start')
    .option('--host <host>', 'address to listen on', parseHost, '127.0.0.1')
    .option('--port <n>', 'port (0: any free port)', parsePort, 8000)
    .option('--config <file>', 'tenants, API keys, adapters and staged plans (JSON, docs/server.md)')
    .option('--executor <name>', `executor: ${EXECUTOR_NAMES.join(', ')} (default: auto, the fastest measured here)`, 'auto')
    .option('--pad-token-id <id>', 'mask prompt tokens equal to this id (HF pad_token_id semantics)', parseNonNegativeInt)
    .option('--tensor-parallel-size <n>', 'with --executor torch: run the worker as n ranks, one per GPU (cuda:0..n-1, NCCL) or on the CPU (gloo), each holding its shard of the weights, adapter slots and KV (vLLM\'s flag; alias -tp; default 1; docs/gpu.md)', parsePositiveInt)
    .option('--max-batch <n>', 'most sequences decoded together (default: the executor\'s, 256 on CUDA, 32 on the CPU)', parsePositiveInt)
    .option('--max-num-seqs <n>', 'vLLM\'s name for --max-batch', parsePositiveInt)
    .option('--max-queue <n>', 'most queued requests before 429', parsePositiveInt)
    .option('--prefill-chunk <n>', 'most prompt tokens of one sequence prefilled per step (chunked prefill; default 32)', parsePositiveInt)
    .option('--prefill-tokens <n>', 'most prompt tokens prefilled per step over all arriving sequences together (default: the executor\'s, 8192 on CUDA, 64 on the CPU)', parsePositiveInt)
    .option('--max-num-batched-tokens <n>', 'vLLM\'s name for --prefill-tokens', parsePositiveInt)
    .option('--idle-prefill-tokens <n>', 'the same budget while nothing decodes, each prompt\'s chunk included (default 512)', parsePositiveInt)
    .option('--admin-key <key>', 'key guarding load/unload (always when set), /metrics and /ready details')
    .option('--adapter-root <dir...>', 'adapter roots (repeatable): admin loads must read from inside one (default: --adapters), and a request for an adapter not loaded loads <root>/<name> on demand')
    .option('--shutdown-timeout <s>', 'seconds to drain in-flight requests on SIGTERM before closing connections (default 30)', parseSeconds)
    .option('--body-timeout <s>', 'seconds a client may take to send a request body (default 30)', parseSeconds)
    .option('--log', 'log every request')
    .option('--replica-name <name>', 'name sent in the x-stageml-replica header (default: hostname:port)')
    .option('--max-loras <n>', 'adapters resident in engine slots at once (default 16)', parsePositiveInt)
    .option('--max-lora-rank <n>', 'rank of every slot; higher-rank adapters are refused (default 64)', parsePositiveInt)
    .option('--max-cpu-loras <n>', 'parsed adapters kept on the host (default: --max-loras; 1 when the weights and slot tables live on the torch worker\'s device)', parsePositiveInt)
    .option('--memory-budget <bytes>', 'bytes the planner may spend on merged weight copies (64MiB, 2GB; default: no planning, all adapters in slots)', parseBytes)
    .option('--quantize <spec>', 'weight-only quantization of the linear layers: int8, int4 (blocks of 32), int8:g128, int4:channel, …:asym, or auto (with --max-error)')
    .option('--max-error <e>', 'with --quantize auto: the largest relative weight error per projection', parseMaxError)
    .option('--pack-base', 'give base-only batches a program with its own pre-packed copy of the f32 weights (~1.4x faster decode on onnxruntime, one more copy of the weights in memory)')
    .option('--host-kv-copy', 'with --executor torch: keep a host copy of every sequence\'s KV cache (f32, appended each step), from which a restarted worker is restored; default: the worker\'s cache is the only copy and a restarted worker rebuilds it by prefilling the tokens again')
    .option('--executor-picks <when>', 'auto, on or off: draw sampled tokens (temperature / top-k / top-p, penalties and bias; not with logprobs) on the executor, one id per row back instead of the logits (auto: where the executor says it pays, the torch worker on CUDA); the same tokens either way', parseAutoOnOff)
    .option('--bundle <dir>', 'serve a bundle of `stageml stage --model`: its source model and adapters, with its plan.json applied as written (instead of MODEL)')
    .option('--dtype <dtype>', `compute dtype of the engine: auto, bfloat16, float16, float32 (as vLLM) or ${SERVE_DTYPES.join(', ')} (checkpoint: the one it stores; auto, the default: checkpoint on --executor torch, else f32). bf16/f16 compute as transformers + PEFT do and need an executor that runs them (torch, interpreter)`)
    .option('--gpu-memory-utilization <f>', 'with --executor torch: the share of the device\'s memory (0, 1] the weights, slot tables, KV of --max-batch sequences at --max-model-len and a step\'s workspace must fit in (as vLLM; checked at start, ENGINE_DEVICE_MEMORY naming the sizes when they do not fit)', parseUtilization)
    .option('--adapter-dtype <dtype>', 'with a bf16/f16 --dtype: LoRA factors f32 (default, as PEFT computes them) or same (rounded to the compute dtype)')
    .option('--enable-prefix-caching', 'not implemented yet: refused')
    .option('--no-enable-prefix-caching', 'no prefix caching (the only mode)')
    .option('--chat-template <file>', 'the chat template for requests that give none: a file, or the template text')
    .option('--generation-config <src>', "request defaults (temperature, top_p, top_k, repetition_penalty): auto (the model's generation_config.json, default), vllm (none), or a directory holding one")
    .option('--enable-auto-tool-choice', 'allow tool_choice "auto" (needs --tool-call-parser)')
    .option('--tool-call-parser <name>', 'how auto tool calls are read from the output: hermes (also Qwen 2.5/3), llama3_json, mistral')
    .option('--quantization <method>', "vLLM's quantized checkpoint methods are refused; see --quantize")
    .action(async (positional: string | undefined, flags: ServeFlags) => {
      const modelDirGiven = positional ?? flags.model;
      const vllm = await vllmServeOptions(flags, { modelDir: modelDirGiven });
      const opts: ServeOptions = { ...flags };
      // vLLM's dtype names (auto, bfloat16, half, float16, float32) as ours.
      const dtype = dtypeOf(flags.dtype);
      if (dtype === undefined) delete opts.dtype;
      else opts.dtype = dtype;
      if (opts.bundle !== undefined && (positional !== undefined || opts.model !== undefined)) throw new CliError(CliCode.USAGE, '--bundle gives the model: drop MODEL / --model');
      if (opts.bundle !== undefined && opts.memoryBudget !== undefined) throw new CliError(CliCode.USAGE, '--bundle applies its plan.json as written: --memory-budget does not apply');
      if (opts.bundle === undefined && (positional === undefined) === (opts.model === undefined)) throw new CliError(CliCode.USAGE, 'give the model directory once: `stageml serve MODEL` or `--model MODEL` (or `--bundle DIR`)');
      const modelDir = positional ?? opts.model;
      if (opts.loraModules !== undefined && opts.enableLora !== true) throw new CliError(CliCode.USAGE, '--lora-modules needs --enable-lora');
      const loraModules = parseLoraModules(opts.loraModules ?? []);
      const [servedName, ...aliases] = opts.servedModelName ?? [];
      if (modelDir !== undefined) await requireDir(modelDir, '--model');
      if (opts.bundle !== undefined) await requireDir(opts.bundle, '--bundle');
      if (opts.adapters !== undefined) await requireDir(opts.adapters, '--adapters');
      for (const r of opts.adapterRoot ?? []) await requireDir(r, '--adapter-root');
      const maxBatch = aliased('--max-batch', opts.maxBatch, '--max-num-seqs', opts.maxNumSeqs);
      const prefillTokens = aliased('--prefill-tokens', opts.prefillTokens, '--max-num-batched-tokens', opts.maxNumBatchedTokens);
      const quantize = quantizeOptions(opts.quantize, opts.maxError);
      // Checked before the executor starts; the executor's name decides the default.
      serveDtypes(opts.dtype, opts.adapterDtype, '');
      let config: ReturnType<typeof parseRouterConfig> | undefined;
      if (opts.config !== undefined) {
        let text: string;
        try {
          text = await readFile(opts.config, 'utf8');
        } catch (e) {
          throw new CliError(CliCode.IO, `cannot read '${opts.config}': ${errorMessage(e)}`, { cause: e });
        }
        config = parseRouterConfig(text, opts.config);
      }
      const shapeDir = modelDir ?? opts.bundle;
      const shape = shapeDir === undefined ? undefined : await probeShapeOf(shapeDir, { quantize, maxBatch });
      const tensorParallelSize = checkTensorParallel(opts.tensorParallelSize, opts.executor, shape);
      const executor = await inPhase(io, "measuring the executors on this model's step", () => resolveExecutor(opts.executor, { log: (line) => { io.out(line); }, shape, ...(tensorParallelSize === undefined ? {} : { tensorParallelSize }) }));
      const deviceTotal = (executor as { readonly info?: { readonly memory?: { readonly total: number } } }).info?.memory?.total;
      if (opts.gpuMemoryUtilization !== undefined && deviceTotal === undefined) throw new CliError(CliCode.USAGE, `--gpu-memory-utilization needs an executor that reports its device's memory (--executor torch); '${executor.name}' does not`);
      const server = await inPhase(io, `loading ${shapeDir ?? 'the model'}: weights, adapters, programs${quantize === undefined ? '' : ', quantizing'}`, () => createServer({
        ...(modelDir === undefined ? {} : { modelDir }),
        ...(opts.bundle === undefined ? {} : { bundle: opts.bundle }),
        // vLLM's default served name is the model path as typed.
        ...(servedName === undefined ? (modelDir === undefined ? {} : { modelName: modelDir }) : { modelName: servedName, modelAliases: aliases }),
        ...(Object.keys(loraModules).length === 0 ? {} : { loraModules }),
        ...(opts.maxModelLen === undefined ? {} : { maxModelLen: opts.maxModelLen }),
        ...(opts.apiKey === undefined ? {} : { apiKey: opts.apiKey }),
        executor,
        ...serveDtypes(opts.dtype, opts.adapterDtype, executor.name, quantize !== undefined),
        ...(quantize === undefined ? {} : { quantize }),
        ...(opts.packBase === true ? { packBase: true } : {}),
        ...(opts.hostKvCopy === true ? { hostKvCopy: true } : {}),
        ...(typeof opts.executorPicks === 'boolean' ? { executorPicks: opts.executorPicks } : {}),
        ...(opts.adapters === undefined ? {} : { adaptersDir: opts.adapters }),
        ...(config === undefined ? {} : { config }),
        ...(opts.padTokenId === undefined ? {} : { padTokenId: opts.padTokenId }),
        ...(maxBatch === undefined ? {} : { maxBatch }),
        ...(opts.maxQueue === undefined ? {} : { maxQueue: opts.maxQueue }),
        ...(opts.prefillChunk === undefined ? {} : { prefillChunk: opts.prefillChunk }),
        ...(prefillTokens === undefined ? {} : { prefillTokens }),
        ...(opts.idlePrefillTokens === undefined ? {} : { idlePrefillTokens: opts.idlePrefillTokens }),
        ...(opts.adminKey === undefined ? {} : { adminKey: opts.adminKey }),
        ...(opts.shutdownTimeout === undefined ? {} : { shutdownTimeoutMs: opts.shutdownTimeout }),
        ...(opts.bodyTimeout === undefined ? {} : { bodyTimeoutMs: opts.bodyTimeout }),
        logger: opts.log === true,
        ...(opts.adapterRoot === undefined ? {} : { adapterRoots: opts.adapterRoot }),
        ...(opts.replicaName === undefined ? {} : { replicaName: opts.replicaName }),
        ...(opts.maxLoras === undefined ? {} : { maxLoras: opts.maxLoras }),
        ...(opts.maxLoraRank === undefined ? {} : { maxLoraRank: opts.maxLoraRank }),
        ...(opts.maxCpuLoras === undefined ? {} : { maxCpuLoras: opts.maxCpuLoras }),
        ...(opts.memoryBudget === undefined ? {} : { memoryBudget: opts.memoryBudget }),
        ...(vllm.chatTemplate === undefined ? {} : { chatTemplate: vllm.chatTemplate }),
        ...(vllm.generationDefaults === undefined ? {} : { generationDefaults: vllm.generationDefaults }),
        ...(vllm.enableAutoToolChoice === true ? { enableAutoToolChoice: true, toolCallParser: vllm.toolCallParser! } : {}),
      }));
      if (opts.gpuMemoryUtilization !== undefined) {
        // The server's defaults (--max-batch 32, --max-model-len the model's, the larger prefill budget).
        try {
          const plan = checkDeviceMemory(server.lm, {
            deviceBytes: deviceTotal!,
            utilization: opts.gpuMemoryUtilization,
            maxBatch: opts.maxBatch ?? 32,
            maxModelLen: opts.maxModelLen ?? server.lm.config.maxPositions,
            stepTokens: Math.max(opts.prefillTokens ?? 64, opts.idlePrefillTokens ?? 512),
          });
          const gib = (n: number): string => `${(n / 2 ** 30).toFixed(2)} GiB`;
          io.out(`device memory: ${gib(plan.total)} of ${gib(plan.limit)} (${String(plan.utilization)} × ${gib(plan.device)}): weights ${gib(plan.weights)}, slot tables ${gib(plan.slots)}, KV ${gib(plan.kv)}, workspace ${gib(plan.workspace)}`);
        } catch (e) {
          await server.shutdown().catch(() => undefined);
          throw e;
        }
      }
      for (const note of vllm.notes) io.out(note);
      let address: string;
      try {
        address = await server.listen(opts.host, opts.port);
      } catch (e) {
        await server.shutdown().catch(() => undefined);
        const code = (e as { code?: unknown }).code;
        const why = code === 'EADDRINUSE' ? 'the address is already in use' : code === 'EADDRNOTAVAIL' || code === 'ENOTFOUND' || code === 'EAI_AGAIN' ? 'the address is not available on this machine' : code === 'EACCES' ? 'permission denied (ports below 1024 need privileges)' : errorMessage(e);
        throw new CliError(CliCode.LISTEN, `cannot listen on ${opts.host}:${String(opts.port)}: ${why}`, { cause: e });
      }
      const models = [server.modelName, ...server.lm.adapterNames];
      io.out(`stageml server ready on ${address} · model ${server.modelName} · adapters: ${server.lm.adapterNames.join(', ') || 'none'} · executor ${server.lm.executorName} (${server.lm.dtype}${server.lm.residentKv ? ', KV on the executor' : ''})`);
      io.out(`try: curl -s ${address}/v1/completions -H 'content-type: application/json'${opts.apiKey === undefined ? '' : ' -H "authorization: Bearer $KEY"'} -d '{"model": "${models[1] ?? models[0]!}", "prompt": "The staged program", "max_tokens": 12, "temperature": 0}'`);
      await new Promise<void>((resolve) => {
        const stop = (signal: string): void => {
          io.out(`${signal}: draining in-flight requests…`);
          void server.shutdown().then(async () => {
            // The CLI created the executor: it closes it (the torch worker stops).
            await executor.dispose();
            io.out('stopped');
            resolve();
            // Shutdown is bounded by --shutdown-timeout whatever is in flight: work still running
            // past it (an adapter file being read) does not keep the process alive.
            setTimeout(() => process.exit(), 100).unref();
          });
        };
        process.once('SIGTERM', () => {
          stop('SIGTERM');
        });
        process.once('SIGINT', () => {
          stop('SIGINT');
        });
      });
    });
}

/** `--lora-modules` entries: `name=path`, or vLLM's JSON form `{"name": …, "path": …}`. */
export function parseLoraModules(entries: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of entries) {
    let name: string | undefined;
    let path: string | undefined;
    if (e.trimStart().startsWith('{')) {
      try {
        const j = JSON.parse(e) as { name?: unknown; path?: unknown };
        if (typeof j.name === 'string') name = j.name;
        if (typeof j.path === 'string') path = j.path;
      } catch {
        // reported below
      }
    } else {
      const at = e.indexOf('=');
      if (at > 0) [name, path] = [e.slice(0, at), e.slice(at + 1)];
    }
    if (name === undefined || path === undefined || path === '') throw new CliError(CliCode.USAGE, `--lora-modules: expected name=path or {"name": …, "path": …}, got '${e}'`);
    if (name in out) throw new CliError(CliCode.USAGE, `--lora-modules: '${name}' is given twice`);
    out[name] = path;
  }
  return out;
}
