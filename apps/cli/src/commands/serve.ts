import { readFile, stat } from 'node:fs/promises';
import { type Command, Option } from 'commander';
import { parseRouterConfig } from '@stageml/router';
import { checkDeviceMemory } from '@stageml/engine';
import { type ServerOptions, createServer } from '@stageml/server';
import { errorMessage } from '@stageml/ir';
import { CliCode, CliError } from '../errors.js';
import { probeShapeOf, resolveExecutor } from '../executors.js';
import type { CliIo } from '../io.js';
import { inPhase } from '../progress.js';
import { quantizeOptions } from '../quantize.js';
import { SERVE_DTYPES, SERVE_FLAGS, passThroughOptions, plainHelp } from '../serve-flags.js';
import { type VllmServeFlags, dtypeOf, vllmServeOptions } from '../vllm-flags.js';

export { SERVE_DTYPES, parseUtilization } from '../serve-flags.js';

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
 * `--adapter-dtype auto` (the default) is `same` on a CUDA executor (`torch-cuda…`: the LoRA
 * factors in the compute dtype, as vLLM holds them, which the worker's bank kernel reads) and the
 * engine's default (f32 factors, as PEFT computes them) elsewhere. `--adapter-dtype int8` (opt-in
 * compressed factors: int8 codes with a scale per rank row) runs an f32 engine (`--dtype` left out
 * means f32 then, on every executor); with a bf16/f16 `--dtype` it is `CLI_USAGE`.
 */
export function serveDtypes(given: string | undefined, adapterDtype: string | undefined, executorName: string, quantized = false): { dtype: (typeof SERVE_DTYPES)[number]; adapterDtype?: 'f32' | 'same' | 'int8' } {
  if (given !== undefined && !DTYPE_SPELLINGS.includes(given)) throw new CliError(CliCode.USAGE, `--dtype must be one of ${DTYPE_SPELLINGS.join(', ')}, got '${given}'`);
  const dtype = given !== undefined && Object.hasOwn(SERVE_DTYPE_ALIASES, given) ? SERVE_DTYPE_ALIASES[given] : given;
  if (adapterDtype !== undefined && adapterDtype !== 'auto' && adapterDtype !== 'f32' && adapterDtype !== 'same' && adapterDtype !== 'int8') throw new CliError(CliCode.USAGE, `--adapter-dtype must be one of auto, f32, same, int8, got '${adapterDtype}'`);
  const explicit = adapterDtype === 'auto' ? undefined : adapterDtype;
  if (explicit === 'int8') {
    if (dtype === 'bf16' || dtype === 'f16') throw new CliError(CliCode.USAGE, `--adapter-dtype int8 stores int8 factors beside an f32 engine; --dtype ${dtype} computes in ${dtype} (use --adapter-dtype same for ${dtype} factors)`);
    return { dtype: (dtype ?? 'f32') as (typeof SERVE_DTYPES)[number], adapterDtype: 'int8' };
  }
  if (explicit !== undefined && dtype === 'f32') throw new CliError(CliCode.USAGE, '--adapter-dtype applies to a bf16/f16 --dtype (f32 factors are the f32 engine\'s own)');
  const chosen = (dtype ?? (executorName.startsWith('torch-') && !quantized ? 'checkpoint' : 'f32')) as (typeof SERVE_DTYPES)[number];
  const factors = explicit ?? (executorName.startsWith('torch-cuda') && chosen !== 'f32' ? 'same' : undefined);
  return { dtype: chosen, ...(factors === undefined ? {} : { adapterDtype: factors }) };
}

/** Fails with `CLI_IO` naming the flag unless `path` is an existing directory. */
async function requireDir(path: string, flag: string): Promise<void> {
  const s = await stat(path).catch(() => undefined);
  if (s === undefined) throw new CliError(CliCode.IO, `${flag} '${path}' does not exist`);
  if (!s.isDirectory()) throw new CliError(CliCode.IO, `${flag} '${path}' is not a directory`);
}

/** `stageml serve`: the reference server (OpenAI-compatible API) on a model and its adapters. */
export function registerServe(program: Command, io: CliIo): void {
  const serve = program.command('serve');
  // Every flag from the one table (serve-flags.ts), which docs/server.md's table is generated from too.
  for (const f of SERVE_FLAGS) {
    const option = new Option(f.spec, plainHelp(f.help));
    if (f.parse !== undefined) option.argParser(f.parse);
    if (f.default !== undefined) option.default(f.default);
    serve.addOption(option);
  }
  serve
    .description('serve a model and its adapters behind an OpenAI-compatible HTTP API (vLLM-style flags)')
    .argument('[model]', 'Hugging Face model directory (as `vllm serve MODEL`)')
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
        // The flags that pass through as given (serve-flags.ts `to`), then the ones read above.
        ...(passThroughOptions(opts as unknown as Readonly<Record<string, unknown>>) as Partial<ServerOptions>),
        ...(modelDir === undefined ? {} : { modelDir }),
        ...(opts.bundle === undefined ? {} : { bundle: opts.bundle }),
        // vLLM's default served name is the model path as typed.
        ...(servedName === undefined ? (modelDir === undefined ? {} : { modelName: modelDir }) : { modelName: servedName, modelAliases: aliases }),
        ...(Object.keys(loraModules).length === 0 ? {} : { loraModules }),
        executor,
        ...serveDtypes(opts.dtype, opts.adapterDtype, executor.name, quantize !== undefined),
        ...(quantize === undefined ? {} : { quantize }),
        ...(opts.packBase === true ? { packBase: true } : {}),
        ...(opts.hostKvCopy === true ? { hostKvCopy: true } : {}),
        prefixCaching: vllm.prefixCaching,
        ...(typeof opts.executorPicks === 'boolean' ? { executorPicks: opts.executorPicks } : {}),
        ...(config === undefined ? {} : { config }),
        ...(maxBatch === undefined ? {} : { maxBatch }),
        ...(prefillTokens === undefined ? {} : { prefillTokens }),
        logger: opts.log === true,
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
