import { hostname } from 'node:os';
import Fastify, { type FastifyInstance } from 'fastify';
import { StageError, errorMessage } from '@stageml/ir';
import type { Engine } from '@stageml/engine';
import type { Scheduler, TenantRegistry } from '@stageml/router';
import { registerGuards } from './auth.js';
import { type ServerContext, createServerContext } from './context.js';
import { ServerCode, errorType, statusOf } from './errors.js';
import type { ServerOptions } from './options.js';
import type { AdapterResolver } from './resolver.js';
import { registerAdapterRoutes } from './routes/adapters.js';
import { registerCompletionRoutes } from './routes/completions.js';
import { registerInfoRoutes } from './routes/info.js';
import { registerTokenizerRoutes } from './routes/tokenize.js';

export type { ServerOptions } from './options.js';

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
 * Error and not-found handlers: coded errors answer with their registered status; a tenant sees
 * messages without server paths or operator detail, and never an internal error's text; a 429
 * carries `Retry-After`.
 */
function registerErrorHandlers(app: FastifyInstance, ctx: ServerContext): void {
  app.setErrorHandler((err: unknown, req, reply) => {
    const fe = err as { code?: string; statusCode?: number; message?: string };
    let status = statusOf(err);
    let code = err instanceof StageError ? String(err.code) : 'SERVER_ERROR';
    let message = errorMessage(err);
    if (!(err instanceof StageError) && fe.code === 'FST_ERR_CTP_BODY_TOO_LARGE') [status, code, message] = [413, ServerCode.BODY_TOO_LARGE, 'the request body is too large'];
    else if (!(err instanceof StageError) && typeof fe.statusCode === 'number' && fe.statusCode < 500) [status, code] = [fe.statusCode, ServerCode.BAD_REQUEST];
    // Every "come back later" answer says when: a full queue by its tenant's backlog, a busy slot
    // cache (507) or a draining/unavailable server (503) after a second.
    if (status === 429) void reply.header('retry-after', String(ctx.scheduler.retryAfterSeconds(ctx.tenantOf.get(req))));
    else if (status === 503 || status === 507) void reply.header('retry-after', '1');
    // Lower layers word their errors for operators (adapter lists, file paths); a tenant sees
    // them without either, and never an internal error's text.
    if (!ctx.isAdmin(req)) message = status >= 500 && !(err instanceof StageError) ? 'internal server error' : ctx.redactForTenant(message);
    void reply.status(status).send({ error: { message, type: errorType(status), code } });
  });
  app.setNotFoundHandler((req, reply) => {
    void reply.status(404).send({ error: { message: `no route ${req.method} ${req.url}`, type: 'not_found_error', code: ServerCode.NOT_FOUND } });
  });
}

/**
 * Stops accepting requests, waits for in-flight ones until the shutdown timeout, closes every
 * connection, then disposes the engine (its prepared programs and sequences; the executor stays
 * with whoever created it).
 */
async function shutdownServer(app: FastifyInstance, ctx: ServerContext): Promise<void> {
  ctx.state.draining = true;
  const deadline = Date.now() + (ctx.opts.shutdownTimeoutMs ?? 30_000);
  const until = (p: Promise<unknown>): Promise<boolean> => {
    let timer: NodeJS.Timeout | undefined;
    return Promise.race([
      p.then(() => true),
      new Promise<boolean>((resolve) => (timer = setTimeout(() => { resolve(false); }, Math.max(0, deadline - Date.now())))),
    ]).finally(() => { clearTimeout(timer); });
  };
  await until(ctx.scheduler.drain());
  const closed = app.close();
  // Past the deadline every connection is closed: a client holding a half-sent body (or a
  // stream) cannot keep the process alive.
  if (!(await until(closed))) app.server.closeAllConnections();
  await closed;
  await ctx.tokenizeWorker?.close();
  ctx.lm.dispose();
}

/** Builds the server: loads the model, adapters and tenants, and registers every route module. */
export async function createServer(opts: ServerOptions): Promise<StageServer> {
  const ctx = await createServerContext(opts);
  const app = Fastify({ logger: opts.logger ?? false, bodyLimit: opts.bodyLimit ?? 1024 * 1024 });
  registerErrorHandlers(app, ctx);
  registerGuards(app, ctx);
  registerInfoRoutes(app, ctx);
  registerCompletionRoutes(app, ctx);
  registerTokenizerRoutes(app, ctx);
  registerAdapterRoutes(app, ctx);
  return {
    app,
    lm: ctx.lm,
    scheduler: ctx.scheduler,
    registry: ctx.registry,
    modelName: ctx.modelName,
    resolver: ctx.resolver,
    async listen(host, port) {
      const address = await app.listen({ host, port });
      ctx.state.replicaName ??= `${hostname()}:${new URL(address).port}`;
      return address;
    },
    shutdown: () => shutdownServer(app, ctx),
  };
}
