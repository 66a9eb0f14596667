import client from 'prom-client';
import type { FastifyRequest } from 'fastify';
import { StageError, dtypeBytes } from '@stageml/ir';
import { Engine } from '@stageml/engine';
import { findAdapterDirs } from '@stageml/peft';
import { type Route, RouterCode, RouterError, Scheduler, TenantRegistry } from '@stageml/router';
import { checkAdapterPath, hidePaths } from './adapter-guard.js';
import { AdapterLoads } from './adapter-loads.js';
import { TokenizerWorker } from './tokenize-worker.js';
import { bearer, sameKey } from './auth.js';
import { ServerCode, ServerError } from './errors.js';
import type { Limits } from './generation.js';
import { ServerMetrics, registerResolverMetrics } from './metrics.js';
import type { ServerOptions } from './options.js';
import { AdapterResolver } from './resolver.js';
import { type ServingBundle, checkPlanAdapters, readServingBundle } from './serving-bundle.js';

/** State of a server that changes while it runs. */
export interface ServerState {
  /** Set by `shutdown`: new requests are refused (503), `/ready` says draining. */
  draining: boolean;
  /** Name sent in `x-stageml-replica` (set from the listening port when not given). */
  replicaName: string | undefined;
}

/**
 * Everything the route modules share: the engine, the scheduler and tenants, limits, metrics, the
 * resolver, and the access checks. Built once by `createServerContext`; each route module
 * registers its routes over it.
 */
export interface ServerContext {
  readonly opts: ServerOptions;
  readonly lm: Engine;
  readonly modelName: string;
  /** More names of the base model (`modelAliases`, without `modelName`). */
  readonly aliases: ReadonlySet<string>;
  readonly registry: TenantRegistry;
  readonly scheduler: Scheduler;
  readonly metrics: ServerMetrics;
  readonly resolver: AdapterResolver | undefined;
  readonly limits: Limits;
  /** Directories runtime adapter loads may read from. */
  readonly adapterRoots: readonly string[];
  /** Every runtime adapter load (admin and on-demand): one per name, bounded bytes, failures remembered. */
  readonly loads: AdapterLoads;
  /** Long texts tokenized off the event loop (undefined: the model has no tokenizer). */
  readonly tokenizeWorker: TokenizerWorker | undefined;
  /** Whether access is guarded (tenants configured or an admin key given). */
  readonly guarded: boolean;
  /** The tenant each admitted generation request was authenticated as. */
  readonly tenantOf: WeakMap<FastifyRequest, string>;
  readonly state: ServerState;
  /** The name a request's `model` routes to: aliases of the base model route as the base model. */
  resolveName(model: string): string;
  /** The base model and the loaded adapters. */
  known(): { baseModel: string; adapters: Set<string> };
  /** The route (tenant, adapter) of `model` for the request's key. */
  routeOf(req: FastifyRequest, model: string): Route;
  /** Throws `ROUTER_DRAINING` while shutting down. */
  ensureOpen(): void;
  /** Throws 401/403 unless the request carries the admin key (when access is guarded). */
  requireAdmin(req: FastifyRequest): void;
  /** Whether the request carries the admin key. */
  isAdmin(req: FastifyRequest): boolean;
  /** A message with server paths and operator detail removed, for a tenant's eyes. */
  redactForTenant(message: string): string;
}

/** Loads the engine of `opts` (or of its bundle). */
async function loadEngine(opts: ServerOptions, modelDir: string, bundle: ServingBundle | undefined): Promise<Engine> {
  return Engine.load(modelDir, {
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
    prefixCaching: opts.prefixCaching ?? true,
    ...(opts.executorPicks === undefined ? {} : { executorPicks: opts.executorPicks }),
    ...(opts.dtype === undefined ? {} : { dtype: opts.dtype }),
    ...(opts.adapterDtype === undefined ? {} : { adapterDtype: opts.adapterDtype }),
    // The scheduler is the engine's only caller here, and it samples each step's logits before
    // the next step: their storage is reused (no allocation per step on the cpu-native executor).
    recycleOutputs: true,
  });
}

/** Loads the adapters named at start: `adaptersDir`, the config's, `loraModules` and the bundle's. */
async function loadStartAdapters(lm: Engine, opts: ServerOptions, bundle: ServingBundle | undefined): Promise<void> {
  if (opts.adaptersDir !== undefined) {
    // One adapter directory, or a directory of them (PEFT_BAD_CONFIG when it is neither). In a
    // directory of adapters one that cannot be served is reported on one line and skipped: it
    // must not keep the server, and every other tenant's adapter, from starting. An adapter named
    // alone (the directory itself) still fails the start, as --lora-modules entries do.
    const found = await findAdapterDirs(opts.adaptersDir);
    const alone = found.length === 1 && found[0]!.dir === opts.adaptersDir;
    const warn = opts.warn ?? ((line: string) => process.stderr.write(`${line}\n`));
    for (const a of found) {
      try {
        await lm.loadAdapter(a.dir, a.name);
      } catch (e) {
        if (alone || !(e instanceof StageError)) throw e;
        warn(`adapter '${a.name}' skipped: error[${e.code}]: ${e.message}`);
      }
    }
  }
  for (const [name, dir] of Object.entries(opts.config?.adapters ?? {})) await lm.loadAdapter(dir, name);
  for (const [name, dir] of Object.entries(opts.loraModules ?? {})) await lm.loadAdapter(dir, name);
  for (const [name, dir] of Object.entries(bundle?.adapters ?? {})) await lm.loadAdapter(dir, name);
  if (bundle !== undefined) checkPlanAdapters(opts.bundle!, bundle.plan, lm.adapterNames);
}

function newScheduler(lm: Engine, opts: ServerOptions, registry: TenantRegistry): Scheduler {
  const staged = opts.config?.staged === undefined ? undefined : new Set(opts.config.staged);
  return new Scheduler(lm, {
    ...(opts.maxBatch === undefined ? {} : { maxBatch: opts.maxBatch }),
    ...(opts.maxQueue === undefined ? {} : { maxQueue: opts.maxQueue }),
    ...(opts.prefillTokens === undefined ? {} : { prefillTokens: opts.prefillTokens }),
    ...(opts.idlePrefillTokens === undefined ? {} : { idlePrefillTokens: opts.idlePrefillTokens }),
    tenantCap: (t) => registry.tenant(t)?.maxRunning,
    tenantQueue: (t) => registry.tenant(t)?.maxQueue,
    tenantWeight: (t) => registry.tenant(t)?.weight,
    isStaged: (a) => staged === undefined || staged.has(a),
  });
}

function newResolver(lm: Engine, opts: ServerOptions, scheduler: Scheduler, metrics: ServerMetrics, loads: AdapterLoads): AdapterResolver | undefined {
  if (opts.adapterRoots === undefined || opts.adapterRoots.length === 0) return undefined;
  // On-demand loads go through the same gate as the admin's (one load per name, byte budget, failure cache).
  const host = {
    get adapterNames() {
      return lm.adapterNames;
    },
    loadAdapter: (dir: string, name: string) => loads.loadOnDemand(dir, name),
    unloadAdapter: (name: string) => lm.unloadAdapter(name),
  };
  const resolver = new AdapterResolver(host, {
    pending: (name) => loads.inFlight(name),
    roots: opts.adapterRoots,
    capacity: opts.maxLoras ?? 16,
    check: (dir) => checkAdapterPath(dir, { roots: opts.adapterRoots ?? [], ...(opts.maxAdapterBytes === undefined ? {} : { maxWeightsBytes: opts.maxAdapterBytes }) }),
    isBusy: (name) => {
      const s = scheduler.snapshot();
      return (s.runningByAdapter[name] ?? 0) + (s.waitingByAdapter[name] ?? 0) > 0;
    },
  });
  registerResolverMetrics(metrics.registry, resolver);
  return resolver;
}

/** The start-up line saying whether prefix caching serves hits and where its KV lives. */
function prefixCachingLine(lm: Engine, hostKvCopy: boolean): string {
  if (lm.prefixCaching) {
    return lm.residentKv && !hostKvCopy
      ? `prefix caching: on — the ${lm.executorName} executor keeps the cached blocks' KV on its device (hits copy them there; no host copy)`
      : `prefix caching: on — the cached blocks' KV is kept on the host${lm.residentKv ? ' (--host-kv-copy)' : ''}`;
  }
  if (lm.config.rope.type === 'longrope') return 'prefix caching: off — the model is longrope (long prompts prefill in one run)';
  return `prefix caching: off — the ${lm.executorName} executor holds the only copy of each sequence's KV and cannot copy its caches (give --host-kv-copy to reuse prefixes)`;
}

/**
 * The engine's gauges, read at scrape time: KV usage (unless given), bytes by kind, merged
 * modules of the applied plan, and the engine's counters.
 */
function registerEngineGauges(lm: Engine, opts: ServerOptions, metrics: ServerMetrics, maxModelLen: number): void {
  // The KV the server may hold: every batch row at the full length — the live sequences' and the
  // prefix cache's retained caches together.
  lm.setPrefixKvBudget((opts.maxBatch ?? lm.scheduling.maxBatch) * maxModelLen * lm.kvBytesPerToken);
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
  new client.Gauge({
    name: 'stageml_engine_bytes',
    help: 'Executor-held bytes by kind (weights at their dtype\'s size, slots reserved, slot_factors resident in slots, kv on the host, prefix_kv retained by the prefix cache, executor_kv resident on the executor, staging, lanes, host_adapters: parsed adapters the host cache keeps), as the engine accounts them.',
    labelNames: ['kind'],
    registers: [metrics.registry],
    collect() {
      const m = lm.memory();
      for (const kind of ['weights', 'slots', 'kv', 'staging', 'lanes'] as const) this.set({ kind }, m[kind]);
      this.set({ kind: 'slot_factors' }, m.slotFactors);
      this.set({ kind: 'executor_kv' }, m.executorKv);
      this.set({ kind: 'prefix_kv' }, m.prefixKv);
      this.set({ kind: 'host_adapters' }, m.hostAdapters);
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
    help: "The executor's counters of its cache batch and step graphs, by kind (torch worker: restages, joins, gathers, dummyRows, graphEager, graphCaptures, graphReplays, graphFailures, graphFirstSight (captures made at a key's first sight), graphCaptureUs, graphPrimeUs, graphPassUs (the captures' host time, priming and the program's run under capture), runs, runBusyUs: microseconds spent on run requests, and its parts stageUs, launchUs, pickUs, replyUs; waitUs: microseconds between a reply and the next run's request; kernelBuilds, kernelBuildUs, kernelCacheHits: GPU kernels compiled, their build time and images read from the disk cache instead), as of its last run.",
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
}

/** The access checks of a context: admin key, draining, routing and tenant-facing redaction. */
function accessOf(opts: ServerOptions, ctx: Pick<ServerContext, 'registry' | 'state' | 'modelName' | 'lm' | 'adapterRoots'>) {
  const guarded = ctx.registry.authEnabled || opts.adminKey !== undefined;
  const known = () => ({ baseModel: ctx.modelName, adapters: new Set(ctx.lm.adapterNames) });
  return {
    guarded,
    known,
    routeOf: (req: FastifyRequest, model: string): Route => ctx.registry.route(bearer(req), model, known()),
    ensureOpen: (): void => {
      if (ctx.state.draining) throw new RouterError(RouterCode.DRAINING, 'the server is shutting down and accepts no new requests');
    },
    requireAdmin: (req: FastifyRequest): void => {
      if (!guarded) return;
      const key = bearer(req);
      if (key === undefined) throw new RouterError(RouterCode.UNAUTHORIZED, 'an API key is required');
      if (opts.adminKey === undefined || !sameKey(key, opts.adminKey)) throw new RouterError(RouterCode.FORBIDDEN, 'only the admin key may do this');
    },
    isAdmin: (req: FastifyRequest): boolean => {
      const key = bearer(req);
      return opts.adminKey !== undefined && key !== undefined && sameKey(key, opts.adminKey);
    },
    redactForTenant: (message: string): string => hidePaths(message).replace(/ \((?:loaded|serving)[^)]*\)/g, ''),
  };
}

/** Loads the model, adapters and tenants of `opts` and builds the context the routes share. */
export async function createServerContext(opts: ServerOptions): Promise<ServerContext> {
  if ((opts.modelDir === undefined) === (opts.bundle === undefined)) throw new ServerError(ServerCode.BAD_REQUEST, 'give exactly one of modelDir or bundle');
  if (opts.bundle !== undefined && opts.memoryBudget !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'a bundle applies its plan.json as written: memoryBudget does not apply');
  const bundle = opts.bundle === undefined ? undefined : await readServingBundle(opts.bundle);
  const modelDir = bundle?.modelDir ?? opts.modelDir!;
  const lm = await loadEngine(opts, modelDir, bundle);
  const log = opts.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  // The residual's input names (hundreds with many slots) are counted, not listed: Engine.programReport has them.
  for (const report of Object.values(lm.programReports)) {
    const { residualInputs, ...spec } = report.specialize;
    log(`program ${JSON.stringify({ ...report, specialize: { ...spec, residualInputs: residualInputs.length } })}`);
  }
  if (opts.prefixCaching ?? true) log(prefixCachingLine(lm, opts.hostKvCopy === true));
  const modelName = opts.modelName ?? (modelDir.replace(/[/\\]+$/, '').split(/[/\\]/).pop() ?? 'model');
  await loadStartAdapters(lm, opts, bundle);
  const aliases = new Set((opts.modelAliases ?? []).filter((a) => a !== modelName));
  const registry = new TenantRegistry(opts.config?.tenants ?? []);
  const scheduler = newScheduler(lm, opts, registry);
  const maxLoras = opts.maxLoras ?? 16;
  const metrics = new ServerMetrics(modelName, () => scheduler.snapshot(), () => maxLoras);
  if (opts.kvCacheUsage !== undefined) metrics.setKvCacheUsage(opts.kvCacheUsage);
  const loads = new AdapterLoads(lm, opts.maxAdapterBytesInFlight === undefined ? {} : { maxBytesInFlight: opts.maxAdapterBytesInFlight });
  new client.Gauge({
    name: 'stageml_adapter_load_refusals_cached',
    help: 'Adapter loads refused from the failure cache, without reading their files (the directory failed before and has not changed).',
    registers: [metrics.registry],
    collect() {
      this.set(loads.cachedRefusals);
    },
  });
  new client.Gauge({
    name: 'stageml_scheduler_host_seconds',
    help: "Seconds the step loop spent, by part, since start (schedule: admission, pruning, building each step; engine: inside Engine.step — input building, the executor's round trip, readback, overlapped with the previous step's detokenizing and SSE writes; emit: taking each step's tokens; yield: the event-loop turn between steps).",
    labelNames: ['part'],
    registers: [metrics.registry],
    collect() {
      for (const [part, ms] of Object.entries(scheduler.stepStats().hostMs)) this.set({ part }, ms / 1000);
    },
  });
  const resolver = newResolver(lm, opts, scheduler, metrics, loads);
  const maxModelLen = opts.maxModelLen ?? lm.config.maxPositions;
  if (!(Number.isInteger(maxModelLen) && maxModelLen >= 2 && maxModelLen <= lm.config.maxPositions)) {
    throw new ServerError(ServerCode.BAD_REQUEST, `max model length ${String(maxModelLen)} must be an integer in [2, ${String(lm.config.maxPositions)}] (the model's max_position_embeddings)`);
  }
  registerEngineGauges(lm, opts, metrics, maxModelLen);
  const limits: Limits = { maxModelLen, maxPromptTokens: opts.maxPromptTokens, maxNewTokens: opts.maxNewTokens, padTokenId: opts.padTokenId };
  const adapterRoots = opts.adapterRoots ?? (opts.adaptersDir === undefined ? [] : [opts.adaptersDir]);
  const state: ServerState = { draining: false, replicaName: opts.replicaName };
  const base = { opts, lm, modelName, aliases, registry, scheduler, metrics, resolver, loads, limits, adapterRoots, state };
  return {
    ...base,
    ...accessOf(opts, base),
    tenantOf: new WeakMap<FastifyRequest, string>(),
    tokenizeWorker: lm.tokenizer === undefined ? undefined : new TokenizerWorker(modelDir, (text, add) => lm.tokenizer!.encode(text, { addSpecialTokens: add })),
    resolveName: (model: string): string => (aliases.has(model) ? modelName : model),
  };
}
