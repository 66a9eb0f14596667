import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import { readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { StageError } from '@stageml/ir';
import { CausalLM } from '@stageml/models';
import { type Route, type RouterConfig, Scheduler, TenantRegistry } from '@stageml/router';
import type { Executor } from '@stageml/runtime';
import type { z } from 'zod';
import { renderChat } from './chat-template.js';
import { checkAdapterPath, redactPaths } from './adapter-guard.js';
import { ServerCode, ServerError, errorType, statusOf } from './errors.js';
import { type GenerationFields, type Limits, SseStream, runGeneration } from './generation.js';
import { ServerMetrics } from './metrics.js';
import { chatSchema, completionSchema, describeIssue, loadAdapterSchema, unloadAdapterSchema } from './schemas.js';

/** Options of `createServer`. */
export interface ServerOptions {
  /** Hugging Face model directory. */
  readonly modelDir: string;
  /** Name clients use for the base model (default: the directory name). */
  readonly modelName?: string;
  /** A directory of PEFT adapter directories to load at start (one per subdirectory). */
  readonly adaptersDir?: string;
  /** Tenants, keys, adapter directories and staged plans. */
  readonly config?: RouterConfig;
  /** Executor running the model (default: the reference interpreter). */
  readonly executor?: Executor;
  /** Most sequences decoded together (default 32). */
  readonly maxBatch?: number;
  /** Most queued requests before 429 (default 256). */
  readonly maxQueue?: number;
  /** Request body limit in bytes (default 1 MiB). */
  readonly bodyLimit?: number;
  /** Token limits (defaults: the model's positions; 256 new tokens; 16 when unspecified). */
  readonly maxPromptTokens?: number;
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
   * `adaptersDir`, if any; none: `load_lora_adapter` is refused.
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
}

/** A running (or ready to listen) reference server. */
export interface StageServer {
  readonly app: FastifyInstance;
  readonly lm: CausalLM;
  readonly scheduler: Scheduler;
  readonly registry: TenantRegistry;
  readonly modelName: string;
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
  const lm = await CausalLM.load(opts.modelDir, opts.executor === undefined ? {} : { executor: opts.executor });
  const modelName = opts.modelName ?? (opts.modelDir.replace(/[/\\]+$/, '').split(/[/\\]/).pop() ?? 'model');
  if (opts.adaptersDir !== undefined) {
    const dirs = (await readdir(opts.adaptersDir, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name).sort();
    for (const d of dirs) await lm.loadAdapter(join(opts.adaptersDir, d), d);
  }
  for (const [name, dir] of Object.entries(opts.config?.adapters ?? {})) await lm.loadAdapter(dir, name);
  let chatTemplate: string | undefined;
  let special: { bos_token?: string; eos_token?: string } = {};
  try {
    const tc = JSON.parse(await readFile(join(opts.modelDir, 'tokenizer_config.json'), 'utf8')) as { chat_template?: unknown; bos_token?: unknown; eos_token?: unknown };
    if (typeof tc.chat_template === 'string') chatTemplate = tc.chat_template;
    special = { ...(typeof tc.bos_token === 'string' ? { bos_token: tc.bos_token } : {}), ...(typeof tc.eos_token === 'string' ? { eos_token: tc.eos_token } : {}) };
  } catch {
    // No tokenizer config: the plain chat transcript is used.
  }
  const registry = new TenantRegistry(opts.config?.tenants ?? []);
  const staged = opts.config?.staged === undefined ? undefined : new Set(opts.config.staged);
  const scheduler = new Scheduler(lm, {
    ...(opts.maxBatch === undefined ? {} : { maxBatch: opts.maxBatch }),
    ...(opts.maxQueue === undefined ? {} : { maxQueue: opts.maxQueue }),
    tenantCap: (t) => registry.tenant(t)?.maxRunning,
    tenantQueue: (t) => registry.tenant(t)?.maxQueue,
    tenantWeight: (t) => registry.tenant(t)?.weight,
    isStaged: (a) => staged === undefined || staged.has(a),
  });
  const metrics = new ServerMetrics(modelName, () => scheduler.snapshot(), () => lm.adapterNames.length);
  const limits: Limits = {
    maxPromptTokens: opts.maxPromptTokens ?? lm.config.maxPositions,
    maxNewTokens: opts.maxNewTokens ?? 256,
    defaultMaxTokens: 16,
    padTokenId: opts.padTokenId,
  };
  const gen = { lm, scheduler, metrics, limits, modelName };
  const known = () => ({ baseModel: modelName, adapters: new Set(lm.adapterNames) });
  let draining = false;

  const app = Fastify({ logger: opts.logger ?? false, bodyLimit: opts.bodyLimit ?? 1024 * 1024 });
  const tenantOf = new WeakMap<FastifyRequest, string>();
  const adapterRoots = opts.adapterRoots ?? (opts.adaptersDir === undefined ? [] : [opts.adaptersDir]);
  const loading = new Set<string>();
  const guarded = registry.authEnabled || opts.adminKey !== undefined;
  const hidden = [opts.modelDir, ...adapterRoots, ...(opts.adaptersDir === undefined ? [] : [opts.adaptersDir])].map((d) => d.replace(/[/\\]+$/, ''));
  const redactForTenant = (message: string): string => redactPaths(message, hidden).replace(/ \((?:loaded|serving)[^)]*\)/g, '');
  app.setErrorHandler((err: unknown, _req, reply) => {
    const fe = err as { code?: string; statusCode?: number; message?: string };
    let status = statusOf(err);
    let code = err instanceof StageError ? String(err.code) : 'SERVER_ERROR';
    let message = err instanceof Error ? err.message : String(err);
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
    if (draining) throw new StageError('ROUTER_DRAINING', 'the server is shutting down and accepts no new requests');
  };
  const requireAdmin = (req: FastifyRequest): void => {
    if (!guarded) return;
    const key = bearer(req);
    if (key === undefined) throw new StageError('ROUTER_UNAUTHORIZED', 'an API key is required');
    if (opts.adminKey === undefined || !sameKey(key, opts.adminKey)) throw new StageError('ROUTER_FORBIDDEN', 'only the admin key may do this');
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
          if (key === undefined || key === '') throw new StageError('ROUTER_UNAUTHORIZED', 'an API key is required (Authorization: Bearer <key>)');
          const t = registry.tenantOfKey(key);
          if (t === undefined) throw new StageError('ROUTER_UNAUTHORIZED', 'the API key is not valid');
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
  const clientGone = (req: FastifyRequest): AbortSignal => {
    const ac = new AbortController();
    req.raw.on('close', () => {
      if (!req.raw.complete) ac.abort();
    });
    return ac.signal;
  };

  app.get('/health', () => ({ status: 'ok' }));
  app.get('/ready', (req, reply) => {
    if (draining) return reply.status(503).send({ status: 'draining' });
    // Adapter names are tenants' business: shown only to the admin when access is guarded.
    if (guarded && !isAdmin(req)) return reply.send({ status: 'ready' });
    return reply.send({ status: 'ready', model: modelName, adapters: lm.adapterNames });
  });
  app.get('/metrics', async (_req, reply) => reply.header('content-type', metrics.registry.contentType).send(await metrics.registry.metrics()));
  app.get('/v1/models', (req) => ({
    object: 'list',
    data: registry.visibleModels(bearer(req), known()).map((id) => ({
      id,
      object: 'model',
      created: 0,
      owned_by: 'stageml',
      root: id,
      parent: id === modelName ? null : modelName,
    })),
  }));

  const completion = async (req: FastifyRequest, reply: FastifyReply, chat: boolean): Promise<unknown> => {
    ensureOpen();
    let prompt: number[];
    let body: GenerationFields & { readonly model: string };
    if (chat) {
      const c = parse(chatSchema, req.body);
      if (lm.tokenizer === undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'this model has no tokenizer: chat needs one');
      prompt = lm.tokenizer.encode(renderChat(c.messages, chatTemplate, special));
      body = { ...c, max_tokens: c.max_completion_tokens ?? c.max_tokens };
    } else {
      const c = parse(completionSchema, req.body);
      const p = c.prompt;
      const one = Array.isArray(p) && (typeof p[0] === 'string' || Array.isArray(p[0])) ? p[0] : p;
      if (typeof one === 'string') {
        if (lm.tokenizer === undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'this model has no tokenizer: send token ids');
        prompt = lm.tokenizer.encode(one);
      } else prompt = one as number[];
      body = c;
    }
    const route = routeOf(req, body.model);
    const fields: GenerationFields = body;
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${randomUUID()}`;
    const created = Math.floor(Date.now() / 1000);
    const object = chat ? 'chat.completion' : 'text_completion';
    const withIds = body.return_token_ids === true;
    if (body.stream === true) {
      const sse = new SseStream(reply);
      const chunk = (choice: Record<string, unknown>) => ({ id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model: body.model, choices: [{ index: 0, ...choice }] });
      if (chat) sse.preamble(chunk({ delta: { role: 'assistant', content: '' }, finish_reason: null }));
      try {
        const out = await runGeneration(gen, route, prompt, fields, (delta, tok) => {
          const ids = withIds ? { token_ids: [tok] } : {};
          sse.send(chunk(chat ? { delta: { content: delta }, finish_reason: null, ...ids } : { text: delta, logprobs: null, finish_reason: null, ...ids }));
        }, clientGone(req));
        sse.send({ ...chunk(chat ? { delta: {}, finish_reason: out.finishReason } : { text: '', logprobs: null, finish_reason: out.finishReason }), usage: usage(out) });
      } catch (e) {
        // Nothing sent yet (validation, admission, a failure before the first token): a plain
        // HTTP error with its status, never a 200 with an error event.
        if (!sse.started) throw e;
        const status = statusOf(e);
        sse.send({ error: { message: e instanceof Error ? e.message : String(e), type: errorType(status), code: e instanceof StageError ? String(e.code) : 'SERVER_ERROR' } });
      }
      sse.done();
      return reply;
    }
    const out = await runGeneration(gen, route, prompt, fields, undefined, clientGone(req));
    const ids = withIds ? { token_ids: out.ids } : {};
    const choice = chat
      ? { index: 0, message: { role: 'assistant', content: out.text }, finish_reason: out.finishReason, logprobs: null, ...ids }
      : { index: 0, text: out.text, logprobs: null, finish_reason: out.finishReason, ...ids };
    return { id, object, created, model: body.model, choices: [choice], usage: usage(out) };
  };
  app.post('/v1/completions', (req, reply) => completion(req, reply, false));
  app.post('/v1/chat/completions', (req, reply) => completion(req, reply, true));

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
    if (!lm.adapterNames.includes(body.lora_name)) throw new StageError('PEFT_UNKNOWN_ADAPTER', `adapter '${body.lora_name}' is not loaded`);
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
    listen: (host, port) => app.listen({ host, port }),
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

function usage(out: { promptTokens: number; ids: readonly number[] }): { prompt_tokens: number; completion_tokens: number; total_tokens: number } {
  return { prompt_tokens: out.promptTokens, completion_tokens: out.ids.length, total_tokens: out.promptTokens + out.ids.length };
}
