import { createHash, timingSafeEqual } from 'node:crypto';
import { hostname } from 'node:os';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { RouterCode, RouterError } from '@stageml/router';
import type { ServerContext } from './context.js';
import { ServerCode } from './errors.js';

/**
 * The API key of `Authorization: Bearer <key>`: the scheme (case-insensitive, RFC 7235), one
 * space, and a key of visible characters, nothing else. No header: undefined. Any other form is
 * `''` — a key that matches no tenant, so a malformed header is refused, never read as a key.
 */
export function bearer(req: FastifyRequest): string | undefined {
  const h = req.headers.authorization;
  if (h === undefined) return undefined;
  const m = /^Bearer ([!-~]+)$/i.exec(h);
  return m === null ? '' : m[1];
}

/** Whether two keys are equal, compared in constant time. */
export function sameKey(a: string, b: string): boolean {
  const d = (x: string) => createHash('sha256').update(x).digest();
  return timingSafeEqual(d(a), d(b));
}

const QUEUE_FULL_BODY = JSON.stringify({ error: { message: "this tenant's queue is full; retry after the Retry-After seconds", type: 'rate_limit_error', code: 'ROUTER_QUEUE_FULL' } });
/** Routes that generate. */
export const GENERATION_ROUTES: ReadonlySet<string> = new Set(['/v1/completions', '/v1/chat/completions']);
/** Routes only the admin key may call (when access is guarded). */
export const ADMIN_ROUTES: ReadonlySet<string> = new Set(['/v1/load_lora_adapter', '/v1/unload_lora_adapter']);

/** Sends a 408 and closes the socket when the body has not arrived within `ms`. */
function armBodyTimeout(req: FastifyRequest, reply: FastifyReply, ms: number): void {
  if (req.raw.complete) return;
  const timer = setTimeout(() => {
    if (req.raw.complete || req.raw.socket.destroyed) return;
    const body = JSON.stringify({ error: { message: 'the request body did not arrive in time', type: 'invalid_request_error', code: ServerCode.BODY_TIMEOUT } });
    req.raw.socket.end(`HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: ${String(Buffer.byteLength(body))}\r\n\r\n${body}`);
    req.raw.socket.destroySoon();
  }, ms);
  timer.unref();
  req.raw.once('end', () => {
    clearTimeout(timer);
  });
  reply.raw.once('close', () => {
    clearTimeout(timer);
  });
}

/** The tenant a generation or model-list request authenticates as ('anonymous' without tenants). */
function tenantOfRequest(ctx: ServerContext, req: FastifyRequest): string {
  if (!ctx.registry.authEnabled) return 'anonymous';
  const key = bearer(req);
  if (key === undefined || key === '') throw new RouterError(RouterCode.UNAUTHORIZED, 'an API key is required (Authorization: Bearer <key>)');
  const t = ctx.registry.tenantOfKey(key);
  if (t === undefined) throw new RouterError(RouterCode.UNAUTHORIZED, 'the API key is not valid');
  return t.name;
}

/**
 * Registers the request guards. Authentication, admission and the body timeout run on the
 * request line and headers, before the body is read: an unauthenticated or over-limit request
 * costs no parsing or tokenizing. A full tenant queue is refused with a prebuilt 429, held
 * `rejectDelayMs` (at most 4096 held; past that sent at once).
 */
export function registerGuards(app: FastifyInstance, ctx: ServerContext): void {
  const { opts, scheduler } = ctx;
  const bodyTimeoutMs = opts.bodyTimeoutMs ?? 30_000;
  const rejectDelayMs = opts.rejectDelayMs ?? 1000;
  let held = 0;
  const refuseFull = (reply: FastifyReply, tenant: string): void => {
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
  };
  app.addHook('onRequest', (req, reply, done) => {
    armBodyTimeout(req, reply, bodyTimeoutMs);
    const path = req.url.split('?')[0]!;
    try {
      if (ADMIN_ROUTES.has(path) || (ctx.guarded && path === '/metrics')) ctx.requireAdmin(req);
      else if (GENERATION_ROUTES.has(path) || path === '/v1/models') {
        const tenant = tenantOfRequest(ctx, req);
        ctx.tenantOf.set(req, tenant);
        if (GENERATION_ROUTES.has(path)) {
          ctx.ensureOpen();
          if (scheduler.isFull(tenant)) {
            refuseFull(reply, tenant);
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
  app.addHook('onRequest', (_req, reply, done) => {
    reply.raw.setHeader('x-stageml-replica', ctx.state.replicaName ?? hostname());
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
}
