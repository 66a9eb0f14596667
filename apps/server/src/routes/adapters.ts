import type { FastifyInstance, FastifyRequest } from 'fastify';
import { StageError } from '@stageml/ir';
import { PeftCode, PeftError } from '@stageml/peft';
import { checkAdapterPath, redactPaths } from '../adapter-guard.js';
import type { ServerContext } from '../context.js';
import { ServerCode, ServerError } from '../errors.js';
import { loadAdapterSchema, unloadAdapterSchema } from '../schemas.js';
import { parseBody } from '../validate.js';

/** Checks a load request's name and tenants; throws 409/400 when it cannot start. */
function checkLoadRequest(ctx: ServerContext, name: string, tenants: readonly string[]): void {
  // The name is reserved for its in-flight load: concurrent loads of one name get 409.
  if (name === ctx.modelName || ctx.lm.adapterNames.includes(name) || ctx.loading.has(name)) {
    throw new ServerError(ServerCode.ADAPTER_EXISTS, `an adapter named '${name}' is already loaded or loading`);
  }
  if (tenants.length > 0 && !ctx.registry.authEnabled) throw new ServerError(ServerCode.BAD_REQUEST, "'tenants': no tenants are configured on this server");
  const missing = tenants.find((t) => ctx.registry.tenant(t) === undefined);
  if (missing !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, `'tenants': no tenant named '${missing.slice(0, 64)}'`);
}

/**
 * `POST /v1/load_lora_adapter`: checks the path against the adapter roots, loads it under the
 * load timeout (a load that outlives it is undone: the client was told nothing changed), grants
 * it to `tenants`. Load errors name no server path.
 */
async function loadAdapterRoute(ctx: ServerContext, req: FastifyRequest): Promise<unknown> {
  const { lm, opts, loading } = ctx;
  ctx.ensureOpen();
  ctx.requireAdmin(req);
  const body = parseBody(loadAdapterSchema, req.body);
  const name = body.lora_name;
  const tenants = body.tenants ?? [];
  checkLoadRequest(ctx, name, tenants);
  const loadTimeoutMs = opts.loadTimeoutMs ?? 30_000;
  loading.add(name);
  const dirs: string[] = [];
  const state = { timedOut: false };
  const work = (async () => {
    const dir = await checkAdapterPath(body.lora_path, { roots: ctx.adapterRoots, ...(opts.maxAdapterBytes === undefined ? {} : { maxWeightsBytes: opts.maxAdapterBytes }) });
    dirs.push(dir);
    await lm.loadAdapter(dir, name);
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
    ctx.registry.grant(name, tenants);
  } catch (e) {
    if (e instanceof StageError && !state.timedOut) {
      const dirsToHide = [...dirs, body.lora_path, ...ctx.adapterRoots.map((r) => r.replace(/[/\\]+$/, ''))];
      throw new StageError(e.code, redactPaths(e.message, dirsToHide), e.hint === undefined ? {} : { hint: e.hint });
    }
    throw e;
  } finally {
    clearTimeout(timer);
    if (state.timedOut) void work.catch(() => undefined).finally(() => loading.delete(name));
    else loading.delete(name);
  }
  return { status: 'ok', message: `Success: LoRA adapter '${name}' added successfully.` };
}

/** `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` (vLLM), under the admin key. */
export function registerAdapterRoutes(app: FastifyInstance, ctx: ServerContext): void {
  const { lm } = ctx;
  app.post('/v1/load_lora_adapter', { bodyLimit: 64 * 1024 }, (req) => loadAdapterRoute(ctx, req));
  app.post('/v1/unload_lora_adapter', { bodyLimit: 64 * 1024 }, (req) => {
    ctx.requireAdmin(req);
    const body = parseBody(unloadAdapterSchema, req.body);
    if (ctx.loading.has(body.lora_name)) throw new ServerError(ServerCode.ADAPTER_BUSY, `adapter '${body.lora_name}' is being loaded; try again when the load finishes`);
    if (!lm.adapterNames.includes(body.lora_name)) throw new PeftError(PeftCode.UNKNOWN_ADAPTER, `adapter '${body.lora_name}' is not loaded`);
    const s = ctx.scheduler.snapshot();
    if ((s.runningByAdapter[body.lora_name] ?? 0) + (s.waitingByAdapter[body.lora_name] ?? 0) > 0) {
      throw new ServerError(ServerCode.ADAPTER_BUSY, `adapter '${body.lora_name}' has requests in flight; try again when they finish`);
    }
    lm.unloadAdapter(body.lora_name);
    // Grants die with the adapter: a later adapter of this name is granted afresh or to nobody.
    ctx.registry.revoke(body.lora_name);
    return { status: 'ok', message: `Success: LoRA adapter '${body.lora_name}' removed successfully.` };
  });
}
