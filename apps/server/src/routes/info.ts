import type { FastifyInstance, FastifyRequest } from 'fastify';
import { bearer } from '../auth.js';
import type { ServerContext } from '../context.js';
import { ServerCode, ServerError } from '../errors.js';
// Inlined by the build (tsup/esbuild), so the built package and a bundle of it need no file at run time.
import pkg from '../../package.json' with { type: 'json' };

/** This package's version, for `GET /version`. */
const SERVER_VERSION: string = pkg.version;

/** The model cards a request's key may see: the base model with its aliases, and its adapters. */
function modelCards(ctx: ServerContext, req: FastifyRequest) {
  const { modelName, aliases } = ctx;
  return ctx.registry.visibleModels(bearer(req), ctx.known()).flatMap((id) => (id === modelName ? [id, ...aliases] : [id])).map((id) => ({
    id,
    object: 'model',
    created: 0,
    owned_by: 'stageml',
    root: id,
    parent: id === modelName || aliases.has(id) ? null : modelName,
    max_model_len: ctx.limits.maxModelLen,
  }));
}

/** `/health`, `/ready`, `/v1/plan`, `/metrics`, `/version`, `/v1/models` and `/v1/models/:id`. */
export function registerInfoRoutes(app: FastifyInstance, ctx: ServerContext): void {
  const { lm, metrics } = ctx;
  app.get('/health', () => ({ status: 'ok' }));
  app.get('/ready', (req, reply) => {
    if (ctx.state.draining) return reply.status(503).header('retry-after', '1').send({ status: 'draining' });
    // Adapter names are tenants' business: shown only to the admin when access is guarded.
    if (ctx.guarded && !ctx.isAdmin(req)) return reply.send({ status: 'ready' });
    return reply.send({ status: 'ready', model: ctx.modelName, adapters: lm.adapterNames });
  });
  app.get('/v1/plan', () => ({ ...lm.plan(), memory: lm.memory(), stats: lm.stats() }));
  app.get('/metrics', async (_req, reply) => reply.header('content-type', metrics.registry.contentType).send(await metrics.registry.metrics()));
  app.get('/version', () => ({ version: SERVER_VERSION }));
  app.get('/v1/models', (req) => ({ object: 'list', data: modelCards(ctx, req) }));
  app.get<{ Params: { id: string } }>('/v1/models/:id', (req) => {
    const card = modelCards(ctx, req).find((m) => m.id === req.params.id);
    if (card === undefined) throw new ServerError(ServerCode.NOT_FOUND, `The model '${req.params.id}' does not exist`);
    return card;
  });
}
