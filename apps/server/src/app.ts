import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import { hostname } from 'node:os';
import { readFile } from 'node:fs/promises';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import client from 'prom-client';
import { StageError, dtypeBytes, errorMessage } from '@stageml/ir';
import { type PickInfo, chatTemplateOf, logSoftmax, topOf } from '@stageml/models';
import { Engine, type EngineOptions } from '@stageml/engine';
import { PeftCode, PeftError, findAdapterDirs } from '@stageml/peft';
import { type Route, RouterCode, type RouterConfig, RouterError, Scheduler, TenantRegistry } from '@stageml/router';
import type { Executor } from '@stageml/runtime';
import type { z } from 'zod';
import { chatPromptIds, renderChat } from './chat-template.js';
import { checkAdapterPath, redactPaths } from './adapter-guard.js';
import { ServerCode, ServerError, errorType, statusOf } from './errors.js';
import { type GenerationFields, type Limits, type Outcome, type RunOptions, SseStream, maxTokensFor, runGeneration } from './generation.js';
import { type CompletionLogprobs, chatLogprobs, completionLogprobs, mergeCompletionLogprobs } from './logprobs.js';
import { ServerMetrics, registerResolverMetrics } from './metrics.js';
import { AdapterResolver } from './resolver.js';
import { checkPlanAdapters, readServingBundle } from './serving-bundle.js';
import {
  type ChatRequest,
  type CompletionRequest,
  chatSchema,
  completionSchema,
  contentText,
  describeIssue,
  detokenizeSchema,
  loadAdapterSchema,
  tokenizeChatSchema,
  tokenizePromptSchema,
  unloadAdapterSchema,
  unsupportedField,
} from './schemas.js';

/** This package's version, for `GET /version`. */
const SERVER_VERSION = (JSON.parse(await readFile(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }).version;

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
  /** Where sampled tokens are drawn (`stageml serve --executor-picks`; `EngineOptions.executorPicks`; default: the executor's `devicePicks`). */
  readonly executorPicks?: boolean;
  /** Compute dtype of the engine's programs (`stageml serve --dtype`; default f32). */
  readonly dtype?: EngineOptions['dtype'];
  /** LoRA factors' dtype in a bf16/f16 engine (`stageml serve --adapter-dtype`; default f32). */
  readonly adapterDtype?: EngineOptions['adapterDtype'];
  /** Most sequences decoded together (vLLM's `--max-num-seqs`; default the executor's hint: 256 on a CUDA GPU, 32 on the host CPU). */
  readonly maxBatch?: number;
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
}

/** A running (or ready to listen) reference server. */
export interface StageServer {
  readonly app: FastifyInstance;
  /** The serving engine (program, weights, adapter slots, resident KV). */
  readonly lm: Engine;
  readonly scheduler: Scheduler;
  readonly registry: TenantRegistry;
  readonly modelName: string;
  /** On-demand adapter loading from `adapterRoots` (undefined without roots). */
  readonly resolver: AdapterResolver | undefined;
  /** Listens on host:port; resolves to the address. */
  listen(host: string, port: number): Promise<string>;
  /** Stops accepting requests (ready → 503), waits for in-flight ones, then closes. */
  shutdown(): Promise<void>;
}

/**
 * The API key of `Authorization: Bearer <key>`: the scheme (case-insensitive, RFC 7235), one
 * space, and a key of visible characters, nothing else. No header: undefined. Any other form is
 * `''` — a key that matches no tenant, so a malformed header is refused, never read as a key.
 */
function bearer(req: FastifyRequest): string | undefined {
  const h = req.headers.authorization;
  if (h === undefined) return undefined;
  const m = /^Bearer ([!-~]+)$/i.exec(h);
  return m === null ? '' : m[1];
}

function sameKey(a: string, b: string): boolean {
  const d = (x: string) => createHash('sha256').update(x).digest();
  return timingSafeEqual(d(a), d(b));
}

const QUEUE_FULL_BODY = JSON.stringify({ error: { message: "this tenant's queue is full; retry after the Retry-After seconds", type: 'rate_limit_error', code: 'ROUTER_QUEUE_FULL' } });
const GENERATION_ROUTES = new Set(['/v1/completions', '/v1/chat/completions']);
const ADMIN_ROUTES = new Set(['/v1/load_lora_adapter', '/v1/unload_lora_adapter']);

function parse<T>(schema: z.ZodType<T>, body: unknown): T {
  const r = schema.safeParse(body);
  if (!r.success) throw new ServerError(ServerCode.BAD_REQUEST, describeIssue(r.error));
  return r.data;
}

/** Builds the server: loads the model, adapters and tenants, and registers every route. */
export async function createServer(opts: ServerOptions): Promise<StageServer> {
  if ((opts.modelDir === undefined) === (opts.bundle === undefined)) throw new ServerError(ServerCode.BAD_REQUEST, 'give exactly one of modelDir or bundle');
  if (opts.bundle !== undefined && opts.memoryBudget !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'a bundle applies its plan.json as written: memoryBudget does not apply');
  const bundle = opts.bundle === undefined ? undefined : await readServingBundle(opts.bundle);
  const modelDir = bundle?.modelDir ?? opts.modelDir!;
  const lm = await Engine.load(modelDir, {
    ...(opts.executor === undefined ? {} : { executor: opts.executor }),
    ...(opts.maxLoras === undefined ? {} : { maxLoras: opts.maxLoras }),
    ...(opts.maxLoraRank === undefined ? {} : { maxLoraRank: opts.maxLoraRank }),
    ...(opts.maxCpuLoras === undefined ? {} : { maxCpuLoras: opts.maxCpuLoras }),
    ...(opts.prefillChunk === undefined ? {} : { prefillChunk: opts.prefillChunk }),
    ...(opts.memoryBudget === undefined ? {} : { memoryBudget: opts.memoryBudget }),
    ...(bundle?.plan === undefined ? {} : { plan: bundle.plan }),
    ...(opts.quantize === undefined ? {} : { quantize: opts.quantize }),
    ...(opts.packBase === undefined ? {} : { packBase: opts.packBase }),
    ...(opts.hostKvCopy === undefined ? {} : { hostKvCopy: opts.hostKvCopy }),
    ...(opts.executorPicks === undefined ? {} : { executorPicks: opts.executorPicks }),
    ...(opts.dtype === undefined ? {} : { dtype: opts.dtype }),
    ...(opts.adapterDtype === undefined ? {} : { adapterDtype: opts.adapterDtype }),
    // The scheduler is the engine's only caller here, and it samples each step's logits before
    // the next step: their storage is reused (no allocation per step on the cpu-native executor).
    recycleOutputs: true,
  });
  const modelName = opts.modelName ?? (modelDir.replace(/[/\\]+$/, '').split(/[/\\]/).pop() ?? 'model');
  if (opts.adaptersDir !== undefined) {
    // One adapter directory, or a directory of them (PEFT_BAD_CONFIG when it is neither).
    for (const a of await findAdapterDirs(opts.adaptersDir)) await lm.loadAdapter(a.dir, a.name);
  }
  for (const [name, dir] of Object.entries(opts.config?.adapters ?? {})) await lm.loadAdapter(dir, name);
  for (const [name, dir] of Object.entries(opts.loraModules ?? {})) await lm.loadAdapter(dir, name);
  for (const [name, dir] of Object.entries(bundle?.adapters ?? {})) await lm.loadAdapter(dir, name);
  if (bundle !== undefined) checkPlanAdapters(opts.bundle!, bundle.plan, lm.adapterNames);
  const aliases = new Set((opts.modelAliases ?? []).filter((a) => a !== modelName));
  /** The name a request's `model` routes to: aliases of the base model route as the base model. */
  const resolveName = (model: string): string => (aliases.has(model) ? modelName : model);
  const registry = new TenantRegistry(opts.config?.tenants ?? []);
  const staged = opts.config?.staged === undefined ? undefined : new Set(opts.config.staged);
  const scheduler = new Scheduler(lm, {
    ...(opts.maxBatch === undefined ? {} : { maxBatch: opts.maxBatch }),
    ...(opts.maxQueue === undefined ? {} : { maxQueue: opts.maxQueue }),
    ...(opts.prefillTokens === undefined ? {} : { prefillTokens: opts.prefillTokens }),
    ...(opts.idlePrefillTokens === undefined ? {} : { idlePrefillTokens: opts.idlePrefillTokens }),
    tenantCap: (t) => registry.tenant(t)?.maxRunning,
    tenantQueue: (t) => registry.tenant(t)?.maxQueue,
    tenantWeight: (t) => registry.tenant(t)?.weight,
    isStaged: (a) => staged === undefined || staged.has(a),
  });
  const maxLoras = opts.maxLoras ?? 16;
  const metrics = new ServerMetrics(modelName, () => scheduler.snapshot(), () => maxLoras);
  if (opts.kvCacheUsage !== undefined) metrics.setKvCacheUsage(opts.kvCacheUsage);
  const resolver = opts.adapterRoots === undefined || opts.adapterRoots.length === 0 ? undefined : new AdapterResolver(lm, {
    roots: opts.adapterRoots,
    capacity: maxLoras,
    check: (dir) => checkAdapterPath(dir, { roots: opts.adapterRoots ?? [], ...(opts.maxAdapterBytes === undefined ? {} : { maxWeightsBytes: opts.maxAdapterBytes }) }),
    isBusy: (name) => {
      const s = scheduler.snapshot();
      return (s.runningByAdapter[name] ?? 0) + (s.waitingByAdapter[name] ?? 0) > 0;
    },
  });
  if (resolver !== undefined) registerResolverMetrics(metrics.registry, resolver);
  let replicaName = opts.replicaName;
  const maxModelLen = opts.maxModelLen ?? lm.config.maxPositions;
  if (!(Number.isInteger(maxModelLen) && maxModelLen >= 2 && maxModelLen <= lm.config.maxPositions)) {
    throw new ServerError(ServerCode.BAD_REQUEST, `max model length ${String(maxModelLen)} must be an integer in [2, ${String(lm.config.maxPositions)}] (the model's max_position_embeddings)`);
  }
  if (opts.kvCacheUsage === undefined) {
    // vllm:kv_cache_usage_perc from the engine: KV bytes held by live sequences ÷ the KV the server may hold (every batch row at the full length).
    // Resident KV is counted where it lives (the executor, at the engine's dtype): the host may hold no copy.
    const tokens = (opts.maxBatch ?? lm.scheduling.maxBatch) * maxModelLen;
    const executorPerToken = 2 * lm.config.numLayers * lm.config.numKvHeads * lm.config.headDim * dtypeBytes(lm.dtype) + 4;
    metrics.setKvCacheUsage(() => {
      const m = lm.memory();
      return Math.min(1, lm.residentKv ? m.executorKv / (tokens * executorPerToken) : m.kv / (tokens * lm.kvBytesPerToken));
    });
  }
  // The engine's own accounting and the applied plan, read at scrape time.
  new client.Gauge({
    name: 'stageml_engine_bytes',
    help: 'Executor-held bytes by kind (weights at their dtype\'s size, slots reserved, slot_factors resident in slots, kv on the host, executor_kv resident on the executor, staging, lanes), as the engine accounts them.',
    labelNames: ['kind'],
    registers: [metrics.registry],
    collect() {
      const m = lm.memory();
      for (const kind of ['weights', 'slots', 'kv', 'staging', 'lanes'] as const) this.set({ kind }, m[kind]);
      this.set({ kind: 'slot_factors' }, m.slotFactors);
      this.set({ kind: 'executor_kv' }, m.executorKv);
    },
  });
  new client.Gauge({
    name: 'stageml_engine_merged_modules',
    help: 'Projections the applied plan serves merged, by adapter (the others are slot residuals).',
    labelNames: ['adapter'],
    registers: [metrics.registry],
    collect() {
      this.reset();
      for (const [adapter, modules] of Object.entries(lm.plan().merged)) this.set({ adapter }, modules.length);
    },
  });
  // Engine counters, read at scrape time.
  const counters: [string, string, (st: ReturnType<Engine['stats']>) => number][] = [
    ['stageml_engine_cache_rebuilds', 'Sequences whose KV cache the executor lost (a restarted torch worker) and the engine rebuilt by prefilling their tokens again (resident KV without --host-kv-copy).', (st) => st.cacheRebuilds],
    ['stageml_engine_worker_retries', "Steps the engine ran again because the executor's worker died under them (a torch worker killed or out of memory; the next run starts a new one).", (st) => st.workerRetries],
    ['stageml_engine_preparations', 'Executor preparations the engine made (constant: one per slot form and the base program, plus the scoring program once prompt logits are asked for).', (st) => st.preparations],
    ['stageml_engine_runs', 'Program runs the engine made (prefill chunks, decode steps and merged steps).', (st) => st.runs],
    ['stageml_engine_steps', 'Scheduler steps the engine ran (one Engine.step call each).', (st) => st.steps],
    ['stageml_engine_merged_steps', 'Steps whose decode rows and prefill chunks ran as one program run.', (st) => st.mergedSteps],
  ];
  // The executor's counters of its caches and step graphs (the torch worker: re-stagings of the
  // decode batch, rows joining it, gathered runs, CUDA graph captures and replays, eager steps).
  new client.Gauge({
    name: 'stageml_executor_counter',
    help: "The executor's counters of its cache batch and step graphs, by kind (torch worker: restages, joins, gathers, graph_captures, graph_replays, eager_steps, ...), as of its last run.",
    labelNames: ['kind'],
    registers: [metrics.registry],
    collect() {
      this.reset();
      for (const [kind, v] of Object.entries(lm.stats().executor)) this.set({ kind }, v);
    },
  });
  for (const [name, help, read] of counters) {
    new client.Gauge({
      name,
      help,
      registers: [metrics.registry],
      collect() {
        this.set(read(lm.stats()));
      },
    });
  }
  const limits: Limits = {
    maxModelLen,
    maxPromptTokens: opts.maxPromptTokens,
    maxNewTokens: opts.maxNewTokens,
    padTokenId: opts.padTokenId,
  };
  const gen = { lm, scheduler, metrics, limits, modelName };
  // A token's text in context (a SentencePiece `▁of` is ' of', not 'of' as decoded alone): decoded
  // after an anchor token, as vLLM decodes logprob tokens after the sequence so far.
  const anchor = lm.tokenizer?.encode('a', { addSpecialTokens: false })[0];
  const anchorText = anchor === undefined ? '' : (lm.tokenizer?.decode([anchor], true) ?? '');
  const tokenText = (t: number): string => {
    if (lm.tokenizer === undefined) return '';
    if (anchor === undefined) return lm.tokenizer.decode([t], true);
    const both = lm.tokenizer.decode([anchor, t], true);
    return both.startsWith(anchorText) ? both.slice(anchorText.length) : lm.tokenizer.decode([t], true);
  };
  const known = () => ({ baseModel: modelName, adapters: new Set(lm.adapterNames) });
  let draining = false;

  const app = Fastify({ logger: opts.logger ?? false, bodyLimit: opts.bodyLimit ?? 1024 * 1024 });
  const tenantOf = new WeakMap<FastifyRequest, string>();
  const adapterRoots = opts.adapterRoots ?? (opts.adaptersDir === undefined ? [] : [opts.adaptersDir]);
  const loading = new Set<string>();
  const guarded = registry.authEnabled || opts.adminKey !== undefined;
  const hidden = [modelDir, ...adapterRoots, ...(opts.adaptersDir === undefined ? [] : [opts.adaptersDir])].map((d) => d.replace(/[/\\]+$/, ''));
  const redactForTenant = (message: string): string => redactPaths(message, hidden).replace(/ \((?:loaded|serving)[^)]*\)/g, '');
  app.setErrorHandler((err: unknown, _req, reply) => {
    const fe = err as { code?: string; statusCode?: number; message?: string };
    let status = statusOf(err);
    let code = err instanceof StageError ? String(err.code) : 'SERVER_ERROR';
    let message = errorMessage(err);
    if (!(err instanceof StageError) && fe.code === 'FST_ERR_CTP_BODY_TOO_LARGE') [status, code, message] = [413, ServerCode.BODY_TOO_LARGE, 'the request body is too large'];
    else if (!(err instanceof StageError) && typeof fe.statusCode === 'number' && fe.statusCode < 500) [status, code] = [fe.statusCode, ServerCode.BAD_REQUEST];
    if (status === 429) void reply.header('retry-after', String(scheduler.retryAfterSeconds(tenantOf.get(_req))));
    // Lower layers word their errors for operators (adapter lists, file paths); a tenant sees
    // them without either, and never an internal error's text.
    if (!isAdmin(_req)) message = status >= 500 && !(err instanceof StageError) ? 'internal server error' : redactForTenant(message);
    void reply.status(status).send({ error: { message, type: errorType(status), code } });
  });
  app.setNotFoundHandler((req, reply) => {
    void reply.status(404).send({ error: { message: `no route ${req.method} ${req.url}`, type: 'not_found_error', code: ServerCode.NOT_FOUND } });
  });

  const routeOf = (req: FastifyRequest, model: string): Route => registry.route(bearer(req), model, known());
  const ensureOpen = (): void => {
    if (draining) throw new RouterError(RouterCode.DRAINING, 'the server is shutting down and accepts no new requests');
  };
  const requireAdmin = (req: FastifyRequest): void => {
    if (!guarded) return;
    const key = bearer(req);
    if (key === undefined) throw new RouterError(RouterCode.UNAUTHORIZED, 'an API key is required');
    if (opts.adminKey === undefined || !sameKey(key, opts.adminKey)) throw new RouterError(RouterCode.FORBIDDEN, 'only the admin key may do this');
  };
  const isAdmin = (req: FastifyRequest): boolean => {
    const key = bearer(req);
    return opts.adminKey !== undefined && key !== undefined && sameKey(key, opts.adminKey);
  };

  // Authentication, admission and the body timeout run on the request line and headers, before
  // the body is read: an unauthenticated or over-limit request costs no parsing or tokenizing.
  const bodyTimeoutMs = opts.bodyTimeoutMs ?? 30_000;
  const rejectDelayMs = opts.rejectDelayMs ?? 1000;
  let held = 0;
  app.addHook('onRequest', (req, reply, done) => {
    if (!req.raw.complete) {
      const timer = setTimeout(() => {
        if (req.raw.complete || req.raw.socket.destroyed) return;
        const body = JSON.stringify({ error: { message: 'the request body did not arrive in time', type: 'invalid_request_error', code: ServerCode.BODY_TIMEOUT } });
        req.raw.socket.end(`HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: ${String(Buffer.byteLength(body))}\r\n\r\n${body}`);
        req.raw.socket.destroySoon();
      }, bodyTimeoutMs);
      timer.unref();
      req.raw.once('end', () => {
        clearTimeout(timer);
      });
      reply.raw.once('close', () => {
        clearTimeout(timer);
      });
    }
    const path = req.url.split('?')[0]!;
    try {
      if (ADMIN_ROUTES.has(path) || (guarded && path === '/metrics')) requireAdmin(req);
      else if (GENERATION_ROUTES.has(path) || path === '/v1/models') {
        let tenant = 'anonymous';
        if (registry.authEnabled) {
          const key = bearer(req);
          if (key === undefined || key === '') throw new RouterError(RouterCode.UNAUTHORIZED, 'an API key is required (Authorization: Bearer <key>)');
          const t = registry.tenantOfKey(key);
          if (t === undefined) throw new RouterError(RouterCode.UNAUTHORIZED, 'the API key is not valid');
          tenant = t.name;
        }
        tenantOf.set(req, tenant);
        if (GENERATION_ROUTES.has(path)) {
          ensureOpen();
          // The cheap 429 path: a full tenant queue is refused before its body is read, with a
          // prebuilt body and no error object, and held a while (see `rejectDelayMs`).
          if (scheduler.isFull(tenant)) {
            const send = (): void => {
              if (!reply.sent) void reply.code(429).header('retry-after', String(scheduler.retryAfterSeconds(tenant))).header('content-type', 'application/json; charset=utf-8').send(QUEUE_FULL_BODY);
            };
            if (rejectDelayMs > 0 && held < 4096) {
              held++;
              setTimeout(() => {
                held--;
                send();
              }, rejectDelayMs);
            } else send();
            return;
          }
        }
      }
    } catch (e) {
      done(e as Error);
      return;
    }
    done();
  });
  const clientGone = (req: FastifyRequest, reply: FastifyReply): AbortSignal => {
    const ac = new AbortController();
    req.raw.on('close', () => {
      if (!req.raw.complete) ac.abort();
    });
    // The request body is complete long before the answer: a client gone mid-generation shows as the
    // response's connection closing before the response finished (plain and SSE alike).
    reply.raw.on('close', () => {
      if (!reply.raw.writableFinished) ac.abort();
    });
    return ac.signal;
  };

  app.addHook('onRequest', (_req, reply, done) => {
    reply.raw.setHeader('x-stageml-replica', replicaName ?? hostname());
    done();
  });
  if (opts.apiKey !== undefined) {
    // vLLM's --api-key: every /v1 route needs the key.
    const key = opts.apiKey;
    app.addHook('onRequest', async (req, reply) => {
      if (!req.url.startsWith('/v1') || bearer(req) === key) return;
      await reply.status(401).send({ error: { message: 'Unauthorized: a valid API key is required', type: 'authentication_error', code: 'ROUTER_UNAUTHORIZED' } });
    });
  }

  app.get('/health', () => ({ status: 'ok' }));
  app.get('/ready', (req, reply) => {
    if (draining) return reply.status(503).send({ status: 'draining' });
    // Adapter names are tenants' business: shown only to the admin when access is guarded.
    if (guarded && !isAdmin(req)) return reply.send({ status: 'ready' });
    return reply.send({ status: 'ready', model: modelName, adapters: lm.adapterNames });
  });
  app.get('/v1/plan', () => ({ ...lm.plan(), memory: lm.memory(), stats: lm.stats() }));
  app.get('/metrics', async (_req, reply) => reply.header('content-type', metrics.registry.contentType).send(await metrics.registry.metrics()));
  const modelCards = (req: FastifyRequest) =>
    registry.visibleModels(bearer(req), known()).flatMap((id) => (id === modelName ? [id, ...aliases] : [id])).map((id) => ({
      id,
      object: 'model',
      created: 0,
      owned_by: 'stageml',
      root: id,
      parent: id === modelName || aliases.has(id) ? null : modelName,
      max_model_len: limits.maxModelLen,
    }));
  app.get('/v1/models', (req) => ({ object: 'list', data: modelCards(req) }));
  app.get<{ Params: { id: string } }>('/v1/models/:id', (req) => {
    const card = modelCards(req).find((m) => m.id === req.params.id);
    if (card === undefined) throw new ServerError(ServerCode.NOT_FOUND, `The model '${req.params.id}' does not exist`);
    return card;
  });

  const completion = async (req: FastifyRequest, reply: FastifyReply, chat: boolean): Promise<unknown> => {
    ensureOpen();
    const unsupported = unsupportedField(req.body);
    if (unsupported !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, `'${unsupported}': this field is not supported by this server`);
    const tok = lm.tokenizer;
    let prompts: number[][];
    let body: (ChatRequest | CompletionRequest) & GenerationFields;
    let topLogprobs: number | undefined;
    let echo = false;
    if (chat) {
      const c = parse(chatSchema, req.body);
      if (tok === undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'this model has no tokenizer: chat needs one');
      const messages = c.messages.map((m) => ({ ...m, role: m.role, content: contentText(m.content) }));
      prompts = [chatPromptIds(tok, messages, { ...(c.add_generation_prompt === undefined ? {} : { addGenerationPrompt: c.add_generation_prompt }), ...(c.chat_template_kwargs === undefined ? {} : { variables: c.chat_template_kwargs }) })];
      if (c.top_logprobs != null && c.logprobs !== true) throw new ServerError(ServerCode.BAD_REQUEST, "'top_logprobs': needs 'logprobs': true");
      topLogprobs = c.logprobs === true ? (c.top_logprobs ?? 0) : undefined;
      body = { ...c, max_tokens: c.max_completion_tokens ?? c.max_tokens };
    } else {
      const c = parse(completionSchema, req.body);
      const p = c.prompt;
      const list: (string | number[])[] = typeof p === 'string' ? [p] : typeof p[0] === 'number' ? [p as number[]] : (p as (string | number[])[]);
      prompts = list.map((one) => {
        if (typeof one !== 'string') return one;
        if (tok === undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'this model has no tokenizer: send token ids');
        return tok.encode(one);
      });
      topLogprobs = c.logprobs ?? undefined;
      echo = c.echo === true;
      body = c;
    }
    for (const [i, p] of prompts.entries()) {
      const bad = p.find((t) => t >= lm.config.vocabSize);
      if (bad !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, `'prompt'${prompts.length > 1 ? `[${String(i)}]` : ''}: token id ${String(bad)} is outside the vocabulary [0, ${String(lm.config.vocabSize)})`);
      maxTokensFor(limits, p.length, body.max_tokens);
    }
    const biased = Object.keys(body.logit_bias ?? {}).find((k) => Number(k) >= lm.config.vocabSize);
    if (biased !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, `'logit_bias': token id ${biased} is outside the vocabulary [0, ${String(lm.config.vocabSize)})`);
    const n = body.n ?? 1;
    const bestOf = chat ? n : ((body as CompletionRequest).best_of ?? n);
    if (bestOf < n) throw new ServerError(ServerCode.BAD_REQUEST, `'best_of': must be at least n (${String(n)}), got ${String(bestOf)}`);
    if (body.stream_options != null && body.stream !== true) throw new ServerError(ServerCode.BAD_REQUEST, "'stream_options': only allowed with 'stream': true");
    if (bestOf > n && body.stream === true) throw new ServerError(ServerCode.BAD_REQUEST, "'best_of': cannot be larger than n when streaming");
    const route = routeOf(req, resolveName(body.model));
    const fields: GenerationFields = body;
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${randomUUID()}`;
    const created = Math.floor(Date.now() / 1000);
    const withIds = body.return_token_ids === true;
    const decodeOne = (t: number): string => tokenText(t);
    const echoText = prompts.map((p) => (echo ? (tok?.decode(p) ?? '') : ''));
    const promptPicks = echo && topLogprobs !== undefined ? await Promise.all(prompts.map((p) => promptLogprobs(p, route.adapter, topLogprobs))) : prompts.map(() => []);
    const logprobsOf = (picks: readonly (PickInfo | null)[], ids: readonly number[], offset0: number) =>
      chat ? chatLogprobs(picks as PickInfo[], decodeOne) : completionLogprobs(picks, ids, decodeOne, offset0);
    const usage = (outs: readonly Outcome[]) => {
      const promptTokens = prompts.reduce((a, p) => a + p.length, 0);
      const completionTokens = outs.reduce((a, o) => a + o.ids.length, 0);
      return { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens };
    };
    const run = (pi: number, j: number, onDelta?: RunOptions['onDelta']) =>
      runGeneration(gen, route, prompts[pi]!, fields, {
        ...(topLogprobs === undefined && bestOf === n ? {} : { logprobs: topLogprobs ?? 0 }),
        seedOffset: j,
        ...(onDelta === undefined ? {} : { onDelta }),
        signal: clientGone(req, reply),
      });
    if (body.stream === true) {
      const sse = new SseStream(reply);
      const chunk = (index: number, choice: Record<string, unknown>) => ({ id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model: body.model, choices: [{ index, ...choice }] });
      const outs: Outcome[] = [];
      try {
        await Promise.all(
          prompts.flatMap((_, pi) =>
            Array.from({ length: n }, async (_u, j) => {
              const index = pi * n + j;
              let text = '';
              if (chat) sse.preamble(chunk(index, { delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }));
              if (echo) {
                text = echoText[pi]!;
                sse.preamble(chunk(index, { text, logprobs: topLogprobs === undefined ? null : logprobsOf(promptPicks[pi]!, prompts[pi]!, 0), finish_reason: null }));
              }
              const out = await run(pi, j, (delta, ids, picks) => {
                const lp = topLogprobs === undefined ? null : logprobsOf(picks, ids, text.length);
                text += delta;
                const tokenIds = withIds ? { token_ids: ids } : {};
                sse.send(chunk(index, chat ? { delta: { content: delta }, logprobs: lp, finish_reason: null, ...tokenIds } : { text: delta, logprobs: lp, finish_reason: null, ...tokenIds }));
              });
              outs.push(out);
              sse.send(chunk(index, chat ? { delta: {}, logprobs: null, finish_reason: out.finishReason } : { text: '', logprobs: null, finish_reason: out.finishReason }));
            }),
          ),
        );
        if (body.stream_options?.include_usage === true) sse.send({ id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model: body.model, choices: [], usage: usage(outs) });
      } catch (e) {
        // Nothing sent yet (validation, admission, a failure before the first token): a plain
        // HTTP error with its status, never a 200 with an error event.
        if (!sse.started) throw e;
        const status = statusOf(e);
        sse.send({ error: { message: errorMessage(e), type: errorType(status), code: e instanceof StageError ? String(e.code) : 'SERVER_ERROR' } });
      }
      sse.done();
      return reply;
    }
    const perPrompt = await Promise.all(
      prompts.map(async (_, pi) => {
        const all = await Promise.all(Array.from({ length: bestOf }, (_u, j) => run(pi, j)));
        return bestOf > n ? [...all].sort((a, b) => b.cumulativeLogprob - a.cumulativeLogprob).slice(0, n) : all;
      }),
    );
    const choices = perPrompt.flatMap((outs, pi) =>
      outs.map((out, j) => {
        const index = pi * n + j;
        const ids = withIds ? { token_ids: out.ids } : {};
        if (chat) {
          return { index, message: { role: 'assistant', content: out.text }, logprobs: topLogprobs === undefined ? null : logprobsOf(out.picks, out.ids, 0), finish_reason: out.finishReason, ...ids };
        }
        const head = echoText[pi]!;
        const logprobs = topLogprobs === undefined ? null : mergeCompletionLogprobs(logprobsOf(promptPicks[pi]!, prompts[pi]!, 0) as CompletionLogprobs, logprobsOf(out.picks, out.ids, head.length) as CompletionLogprobs, echo);
        return { index, text: head + out.text, logprobs, finish_reason: out.finishReason, ...ids };
      }),
    );
    return { id, object: chat ? 'chat.completion' : 'text_completion', created, model: body.model, choices, usage: usage(perPrompt.flat()) };
  };
  /** Leases the request's adapter from the resolver (loading it on demand) while the request runs. */
  const withAdapter = async (req: FastifyRequest, run: () => Promise<unknown>): Promise<unknown> => {
    const model = (req.body as { model?: unknown } | null)?.model;
    if (resolver === undefined || draining || typeof model !== 'string' || model === modelName) return run();
    // Only a key that may use the adapter may make the replica load it.
    if (!lm.adapterNames.includes(model)) registry.route(bearer(req), model, { baseModel: modelName, adapters: new Set([...lm.adapterNames, model]) });
    const release = await resolver.acquire(model);
    try {
      return await run();
    } finally {
      release();
    }
  };
  app.post('/v1/completions', (req, reply) => withAdapter(req, () => completion(req, reply, false)));
  app.post('/v1/chat/completions', (req, reply) => withAdapter(req, () => completion(req, reply, true)));

  // Log-probabilities of the prompt's own tokens (echo with logprobs), from one prefill.
  const promptLogprobs = async (prompt: readonly number[], adapter: string | undefined, top: number): Promise<(PickInfo | null)[]> => {
    const logits = await lm.promptLogits(adapter, prompt);
    const V = lm.config.vocabSize;
    return prompt.map((t, i) => {
      if (i === 0) return null;
      const lp = logSoftmax(logits.data.subarray((i - 1) * V, i * V));
      return { id: t, logprob: lp[t]!, top: topOf(lp, top) };
    });
  };

  // vLLM extras: tokenizer endpoints and the server version.
  app.post('/tokenize', (req) => {
    if (lm.tokenizer === undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'this model has no tokenizer');
    const isChat = typeof req.body === 'object' && req.body !== null && 'messages' in req.body;
    let tokens: number[];
    if (isChat) {
      const body = parse(tokenizeChatSchema, req.body);
      if (body.model !== undefined) routeOf(req, resolveName(body.model));
      const messages = body.messages.map((m) => ({ ...m, content: contentText(m.content) }));
      tokens = body.add_special_tokens === true
        ? lm.tokenizer.encode(renderChat(messages, chatTemplateOf(lm.tokenizer), lm.tokenizer.specialTokens))
        : chatPromptIds(lm.tokenizer, messages, body.add_generation_prompt === undefined ? {} : { addGenerationPrompt: body.add_generation_prompt });
    } else {
      const body = parse(tokenizePromptSchema, req.body);
      if (body.model !== undefined) routeOf(req, resolveName(body.model));
      tokens = lm.tokenizer.encode(body.prompt, { addSpecialTokens: body.add_special_tokens ?? true });
    }
    return { count: tokens.length, max_model_len: limits.maxModelLen, tokens, token_strs: null };
  });
  app.post('/detokenize', (req) => {
    const body = parse(detokenizeSchema, req.body);
    if (lm.tokenizer === undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'this model has no tokenizer');
    if (body.model !== undefined) routeOf(req, resolveName(body.model));
    const bad = body.tokens.find((t) => t >= lm.config.vocabSize);
    if (bad !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, `'tokens': token id ${String(bad)} is outside the vocabulary [0, ${String(lm.config.vocabSize)})`);
    return { prompt: lm.tokenizer.decode(body.tokens) };
  });
  app.get('/version', () => ({ version: SERVER_VERSION }));

  const loadTimeoutMs = opts.loadTimeoutMs ?? 30_000;
  app.post('/v1/load_lora_adapter', { bodyLimit: 64 * 1024 }, async (req) => {
    ensureOpen();
    requireAdmin(req);
    const body = parse(loadAdapterSchema, req.body);
    const name = body.lora_name;
    // The name is reserved for its in-flight load: concurrent loads of one name get 409.
    if (name === modelName || lm.adapterNames.includes(name) || loading.has(name)) {
      throw new ServerError(ServerCode.ADAPTER_EXISTS, `an adapter named '${name}' is already loaded or loading`);
    }
    const tenants = body.tenants ?? [];
    if (tenants.length > 0 && !registry.authEnabled) throw new ServerError(ServerCode.BAD_REQUEST, "'tenants': no tenants are configured on this server");
    const missing = tenants.find((t) => registry.tenant(t) === undefined);
    if (missing !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, `'tenants': no tenant named '${missing.slice(0, 64)}'`);
    loading.add(name);
    const dirs: string[] = [];
    const state = { timedOut: false };
    const work = (async () => {
      const dir = await checkAdapterPath(body.lora_path, { roots: adapterRoots, ...(opts.maxAdapterBytes === undefined ? {} : { maxWeightsBytes: opts.maxAdapterBytes }) });
      dirs.push(dir);
      await lm.loadAdapter(dir, name);
      // A load that outlived its timeout is undone: the client was told nothing changed.
      if (state.timedOut) lm.unloadAdapter(name);
    })();
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        state.timedOut = true;
        reject(new ServerError(ServerCode.ADAPTER_TIMEOUT, `loading adapter '${name}' took longer than ${String(loadTimeoutMs)} ms; nothing was changed`));
      }, loadTimeoutMs);
    });
    try {
      await Promise.race([work, timeout]);
      registry.grant(name, tenants);
    } catch (e) {
      if (e instanceof StageError && !state.timedOut) {
        const dirsToHide = [...dirs, body.lora_path, ...adapterRoots.map((r) => r.replace(/[/\\]+$/, ''))];
        throw new StageError(e.code, redactPaths(e.message, dirsToHide), e.hint === undefined ? {} : { hint: e.hint });
      }
      throw e;
    } finally {
      clearTimeout(timer);
      if (state.timedOut) void work.catch(() => undefined).finally(() => loading.delete(name));
      else loading.delete(name);
    }
    return { status: 'ok', message: `Success: LoRA adapter '${name}' added successfully.` };
  });
  app.post('/v1/unload_lora_adapter', { bodyLimit: 64 * 1024 }, (req) => {
    requireAdmin(req);
    const body = parse(unloadAdapterSchema, req.body);
    if (loading.has(body.lora_name)) throw new ServerError(ServerCode.ADAPTER_BUSY, `adapter '${body.lora_name}' is being loaded; try again when the load finishes`);
    if (!lm.adapterNames.includes(body.lora_name)) throw new PeftError(PeftCode.UNKNOWN_ADAPTER, `adapter '${body.lora_name}' is not loaded`);
    const s = scheduler.snapshot();
    if ((s.runningByAdapter[body.lora_name] ?? 0) + (s.waitingByAdapter[body.lora_name] ?? 0) > 0) {
      throw new ServerError(ServerCode.ADAPTER_BUSY, `adapter '${body.lora_name}' has requests in flight; try again when they finish`);
    }
    lm.unloadAdapter(body.lora_name);
    // Grants die with the adapter: a later adapter of this name is granted afresh or to nobody.
    registry.revoke(body.lora_name);
    return { status: 'ok', message: `Success: LoRA adapter '${body.lora_name}' removed successfully.` };
  });

  return {
    app,
    lm,
    scheduler,
    registry,
    modelName,
    resolver,
    async listen(host, port) {
      const address = await app.listen({ host, port });
      replicaName ??= `${hostname()}:${new URL(address).port}`;
      return address;
    },
    async shutdown() {
      draining = true;
      const deadline = Date.now() + (opts.shutdownTimeoutMs ?? 30_000);
      const until = (p: Promise<unknown>): Promise<boolean> => {
        let timer: NodeJS.Timeout | undefined;
        return Promise.race([
          p.then(() => true),
          new Promise<boolean>((resolve) => (timer = setTimeout(() => { resolve(false); }, Math.max(0, deadline - Date.now())))),
        ]).finally(() => { clearTimeout(timer); });
      };
      await until(scheduler.drain());
      const closed = app.close();
      // Past the deadline every connection is closed: a client holding a half-sent body (or a
      // stream) cannot keep the process alive.
      if (!(await until(closed))) app.server.closeAllConnections();
      await closed;
    },
  };
}
