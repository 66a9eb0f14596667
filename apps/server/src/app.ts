import { randomUUID } from 'node:crypto';
import { readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { StageError } from '@stageml/ir';
import { CausalLM, type CausalLMOptions } from '@stageml/models';
import { type Route, type RouterConfig, Scheduler, TenantRegistry } from '@stageml/router';
import type { Executor } from '@stageml/runtime';
import type { z } from 'zod';
import { renderChat } from './chat-template.js';
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
  /** Weight-only quantization of the model's linear layers (`stageml serve --quantize`). */
  readonly quantize?: CausalLMOptions['quantize'];
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
  /** Key that may load and unload adapters when tenants are configured. */
  readonly adminKey?: string;
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

function bearer(req: FastifyRequest): string | undefined {
  const h = req.headers.authorization;
  if (h === undefined) return undefined;
  const m = /^Bearer\s+(.+)$/i.exec(h);
  return m === null ? h : m[1];
}

function parse<T>(schema: z.ZodType<T>, body: unknown): T {
  const r = schema.safeParse(body);
  if (!r.success) throw new ServerError(ServerCode.BAD_REQUEST, describeIssue(r.error));
  return r.data;
}

/** Builds the server: loads the model, adapters and tenants, and registers every route. */
export async function createServer(opts: ServerOptions): Promise<StageServer> {
  const lm = await CausalLM.load(opts.modelDir, { ...(opts.executor === undefined ? {} : { executor: opts.executor }), ...(opts.quantize === undefined ? {} : { quantize: opts.quantize }) });
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
  app.setErrorHandler((err: unknown, _req, reply) => {
    const fe = err as { code?: string; statusCode?: number; message?: string };
    let status = statusOf(err);
    let code = err instanceof StageError ? String(err.code) : 'SERVER_ERROR';
    let message = err instanceof Error ? err.message : String(err);
    if (!(err instanceof StageError) && fe.code === 'FST_ERR_CTP_BODY_TOO_LARGE') [status, code, message] = [413, ServerCode.BODY_TOO_LARGE, 'the request body is too large'];
    else if (!(err instanceof StageError) && typeof fe.statusCode === 'number' && fe.statusCode < 500) [status, code] = [fe.statusCode, ServerCode.BAD_REQUEST];
    if (status === 429) void reply.header('retry-after', String(scheduler.retryAfterSeconds()));
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
    if (!registry.authEnabled) return;
    const key = bearer(req);
    if (key === undefined) throw new StageError('ROUTER_UNAUTHORIZED', 'an API key is required');
    if (opts.adminKey === undefined || key !== opts.adminKey) throw new StageError('ROUTER_FORBIDDEN', 'only the admin key may load or unload adapters');
  };
  const clientGone = (req: FastifyRequest): AbortSignal => {
    const ac = new AbortController();
    req.raw.on('close', () => {
      if (!req.raw.complete) ac.abort();
    });
    return ac.signal;
  };

  app.get('/health', () => ({ status: 'ok' }));
  app.get('/ready', (_req, reply) => {
    if (draining) return reply.status(503).send({ status: 'draining' });
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
      root: id === modelName ? opts.modelDir : id,
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
      if (chat) sse.send(chunk({ delta: { role: 'assistant', content: '' }, finish_reason: null }));
      try {
        const out = await runGeneration(gen, route, prompt, fields, (delta, tok) => {
          const ids = withIds ? { token_ids: [tok] } : {};
          sse.send(chunk(chat ? { delta: { content: delta }, finish_reason: null, ...ids } : { text: delta, logprobs: null, finish_reason: null, ...ids }));
        }, clientGone(req));
        sse.send({ ...chunk(chat ? { delta: {}, finish_reason: out.finishReason } : { text: '', logprobs: null, finish_reason: out.finishReason }), usage: usage(out) });
      } catch (e) {
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

  app.post('/v1/load_lora_adapter', async (req) => {
    ensureOpen();
    requireAdmin(req);
    const body = parse(loadAdapterSchema, req.body);
    if (body.lora_name === modelName || lm.adapterNames.includes(body.lora_name)) {
      throw new ServerError(ServerCode.ADAPTER_EXISTS, `an adapter named '${body.lora_name}' is already loaded`);
    }
    await lm.loadAdapter(body.lora_path, body.lora_name);
    for (const t of body.tenants ?? []) {
      const tenant = registry.tenant(t);
      if (tenant !== undefined) registry.setTenant({ ...tenant, adapters: [...new Set([...tenant.adapters, body.lora_name])] });
    }
    return { status: 'ok', message: `Success: LoRA adapter '${body.lora_name}' added successfully.` };
  });
  app.post('/v1/unload_lora_adapter', (req) => {
    requireAdmin(req);
    const body = parse(unloadAdapterSchema, req.body);
    if (!lm.adapterNames.includes(body.lora_name)) throw new StageError('PEFT_UNKNOWN_ADAPTER', `adapter '${body.lora_name}' is not loaded`);
    const s = scheduler.snapshot();
    if ((s.runningByAdapter[body.lora_name] ?? 0) + (s.waitingByAdapter[body.lora_name] ?? 0) > 0) {
      throw new ServerError(ServerCode.ADAPTER_BUSY, `adapter '${body.lora_name}' has requests in flight; try again when they finish`);
    }
    lm.unloadAdapter(body.lora_name);
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
      await scheduler.drain();
      await app.close();
    },
  };
}

function usage(out: { promptTokens: number; ids: readonly number[] }): { prompt_tokens: number; completion_tokens: number; total_tokens: number } {
  return { prompt_tokens: out.promptTokens, completion_tokens: out.ids.length, total_tokens: out.promptTokens + out.ids.length };
}
