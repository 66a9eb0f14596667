import { jsonDepth } from '@stageml/ir';
import { z } from 'zod';
import { RouterCode, RouterError } from './errors.js';
import { errorMessage } from '@stageml/ir';

const tenantSchema = z.strictObject({
  name: z.string().min(1),
  api_keys: z.array(z.string().min(8)).min(1),
  adapters: z.array(z.string().min(1)).default([]),
  base: z.boolean().default(true),
  max_running: z.number().int().positive().optional(),
  max_queue: z.number().int().positive().optional(),
  weight: z.number().positive().max(1e6).optional(),
});

const configSchema = z.strictObject({
  version: z.literal(1),
  tenants: z.array(tenantSchema),
  adapters: z.record(z.string(), z.string()).optional(),
  staged: z.array(z.string()).optional(),
});

/** One tenant: its keys and the adapters (and base model) it may use. */
export interface Tenant {
  readonly name: string;
  readonly apiKeys: readonly string[];
  /** Adapter names this tenant may use. */
  readonly adapters: readonly string[];
  /** Whether the tenant may use the base model without an adapter. */
  readonly base: boolean;
  /** Most requests of this tenant running at once (fairness cap). */
  readonly maxRunning: number | undefined;
  /** Most requests of this tenant waiting at once (its own queue bound; default: the server's). */
  readonly maxQueue?: number | undefined;
  /** Weight of this tenant in the fair sharing of batch slots (default 1). */
  readonly weight?: number | undefined;
}

/** The router configuration file (`--config`), schema in docs/server.md. */
export interface RouterConfig {
  readonly tenants: readonly Tenant[];
  /** Adapter directories to load at start, by name. */
  readonly adapters: Readonly<Record<string, string>>;
  /** Adapters with compiled (staged) plans; others take the fallback path. `undefined`: all staged. */
  readonly staged: readonly string[] | undefined;
}

/** Deepest nesting a router config may have (a config is at most a few levels deep). */
export const MAX_CONFIG_DEPTH = 32;

/** Parses a router config (JSON text); malformed configs are `ROUTER_BAD_CONFIG` naming the field. */
export function parseRouterConfig(text: string, file = 'config.json'): RouterConfig {
  let raw: unknown;
  const depth = jsonDepth(text);
  if (depth > MAX_CONFIG_DEPTH) throw new RouterError(RouterCode.BAD_CONFIG, `${file} nests ${String(depth)} levels deep; the limit is ${String(MAX_CONFIG_DEPTH)}`);
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new RouterError(RouterCode.BAD_CONFIG, `${file} is not JSON: ${errorMessage(e)}`, { cause: e });
  }
  const parsed = configSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new RouterError(RouterCode.BAD_CONFIG, `${file}: field '${issue.path.join('.')}': ${issue.message}`);
  }
  const c = parsed.data;
  const names = new Set<string>();
  const keys = new Set<string>();
  for (const t of c.tenants) {
    if (names.has(t.name)) throw new RouterError(RouterCode.BAD_CONFIG, `${file}: tenant '${t.name}' appears twice`);
    names.add(t.name);
    for (const k of t.api_keys) {
      if (keys.has(k)) throw new RouterError(RouterCode.BAD_CONFIG, `${file}: an API key of tenant '${t.name}' is used by another tenant`);
      keys.add(k);
    }
  }
  return {
    tenants: c.tenants.map((t) => ({ name: t.name, apiKeys: t.api_keys, adapters: t.adapters, base: t.base, maxRunning: t.max_running, maxQueue: t.max_queue, weight: t.weight })),
    adapters: c.adapters ?? {},
    staged: c.staged,
  };
}

/** Who a request belongs to, and which adapter it runs with. */
export interface Route {
  /** Tenant name (`anonymous` when authentication is off). */
  readonly tenant: string;
  /** Adapter name, or undefined for the base model. */
  readonly adapter: string | undefined;
}

/**
 * Tenants → API keys → adapters, changeable at run time. With no tenants configured
 * authentication is off and every loaded adapter is open to everyone.
 */
export class TenantRegistry {
  readonly #tenants = new Map<string, Tenant>();
  readonly #byKey = new Map<string, string>();

  /** A registry of `tenants`. */
  constructor(tenants: readonly Tenant[] = []) {
    for (const t of tenants) this.setTenant(t);
  }

  /** Whether API keys are required. */
  get authEnabled(): boolean {
    return this.#tenants.size > 0;
  }

  /** Adds or replaces a tenant (its old keys stop working). */
  setTenant(t: Tenant): void {
    for (const k of t.apiKeys) {
      const owner = this.#byKey.get(k);
      if (owner !== undefined && owner !== t.name) throw new RouterError(RouterCode.BAD_CONFIG, `an API key of tenant '${t.name}' belongs to tenant '${owner}'`);
    }
    this.removeTenant(t.name);
    this.#tenants.set(t.name, t);
    for (const k of t.apiKeys) this.#byKey.set(k, t.name);
  }

  /** Removes a tenant; returns whether it existed. */
  removeTenant(name: string): boolean {
    const t = this.#tenants.get(name);
    if (t === undefined) return false;
    for (const k of t.apiKeys) this.#byKey.delete(k);
    return this.#tenants.delete(name);
  }

  /** A tenant by name. */
  tenant(name: string): Tenant | undefined {
    return this.#tenants.get(name);
  }

  /** Every tenant. */
  tenants(): Tenant[] {
    return [...this.#tenants.values()];
  }

  /** The tenant an API key belongs to, or undefined for none (exact match). */
  tenantOfKey(apiKey: string | undefined): Tenant | undefined {
    if (apiKey === undefined || apiKey === '') return undefined;
    const name = this.#byKey.get(apiKey);
    return name === undefined ? undefined : this.#tenants.get(name);
  }

  /**
   * Resolves an API key and a requested model (the base model's name or an adapter name, vLLM's
   * convention) to a route. The key is checked first: none when keys are required, or a key of no
   * tenant, is `ROUTER_UNAUTHORIZED` (401). A model nobody serves, and a model this tenant may not
   * use, are both `ROUTER_UNKNOWN_MODEL` (404) with the same message, which names no other model:
   * a tenant cannot learn another tenant's adapter names.
   */
  route(apiKey: string | undefined, model: string, known: { readonly baseModel: string; readonly adapters: ReadonlySet<string> }): Route {
    const isBase = model === known.baseModel;
    const unknown = (): RouterError => new RouterError(RouterCode.UNKNOWN_MODEL, `model '${model.slice(0, 128)}' does not exist or is not available to this key`, { hint: 'GET /v1/models lists the models this key may use' });
    if (!this.authEnabled) {
      if (!isBase && !known.adapters.has(model)) throw unknown();
      return { tenant: 'anonymous', adapter: isBase ? undefined : model };
    }
    if (apiKey === undefined || apiKey === '') throw new RouterError(RouterCode.UNAUTHORIZED, 'an API key is required (Authorization: Bearer <key>)');
    const t = this.tenantOfKey(apiKey);
    if (t === undefined) throw new RouterError(RouterCode.UNAUTHORIZED, 'the API key is not valid');
    if (isBase ? !t.base : !t.adapters.includes(model) || !known.adapters.has(model)) throw unknown();
    return { tenant: t.name, adapter: isBase ? undefined : model };
  }

  /** Grants `adapter` to the tenants named (all must exist, else `ROUTER_BAD_REQUEST` and nothing changes). */
  grant(adapter: string, tenants: readonly string[]): void {
    const missing = tenants.filter((n) => !this.#tenants.has(n));
    if (missing.length > 0) throw new RouterError(RouterCode.BAD_REQUEST, `'tenants': no tenant named '${missing[0]!.slice(0, 64)}'`);
    for (const n of tenants) {
      const t = this.#tenants.get(n)!;
      if (!t.adapters.includes(adapter)) this.#tenants.set(n, { ...t, adapters: [...t.adapters, adapter] });
    }
  }

  /** Withdraws `adapter` from every tenant (on unload: a later adapter of that name is not granted to anyone). */
  revoke(adapter: string): void {
    for (const [n, t] of this.#tenants) if (t.adapters.includes(adapter)) this.#tenants.set(n, { ...t, adapters: t.adapters.filter((a) => a !== adapter) });
  }

  /** Models (base and adapters) a key may use, for `/v1/models`. */
  visibleModels(apiKey: string | undefined, known: { readonly baseModel: string; readonly adapters: ReadonlySet<string> }): string[] {
    if (!this.authEnabled) return [known.baseModel, ...known.adapters];
    const name = apiKey === undefined ? undefined : this.#byKey.get(apiKey);
    const t = name === undefined ? undefined : this.#tenants.get(name);
    if (t === undefined) throw new RouterError(RouterCode.UNAUTHORIZED, 'the API key is not valid');
    return [...(t.base ? [known.baseModel] : []), ...t.adapters.filter((a) => known.adapters.has(a))];
  }
}
