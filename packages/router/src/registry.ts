import { z } from 'zod';
import { RouterCode, RouterError } from './errors.js';
import { errorMessage } from '@stageml/ir';

const tenantSchema = z.strictObject({
  name: z.string().min(1),
  api_keys: z.array(z.string().min(8)).min(1),
  adapters: z.array(z.string().min(1)).default([]),
  base: z.boolean().default(true),
  max_running: z.number().int().positive().optional(),
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
}

/** The router configuration file (`--config`), schema in docs/server.md. */
export interface RouterConfig {
  readonly tenants: readonly Tenant[];
  /** Adapter directories to load at start, by name. */
  readonly adapters: Readonly<Record<string, string>>;
  /** Adapters with compiled (staged) plans; others take the fallback path. `undefined`: all staged. */
  readonly staged: readonly string[] | undefined;
}

/** Parses a router config (JSON text); malformed configs are `ROUTER_BAD_CONFIG` naming the field. */
export function parseRouterConfig(text: string, file = 'config.json'): RouterConfig {
  let raw: unknown;
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
    tenants: c.tenants.map((t) => ({ name: t.name, apiKeys: t.api_keys, adapters: t.adapters, base: t.base, maxRunning: t.max_running })),
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

  /**
   * Resolves an API key and a requested model (the base model's name or an adapter name, vLLM's
   * convention) to a route. No key when keys are required: `ROUTER_UNAUTHORIZED` (401); a key of
   * no tenant: `ROUTER_UNAUTHORIZED`; a model the tenant may not use: `ROUTER_FORBIDDEN` (403); a
   * model nobody serves: `ROUTER_UNKNOWN_MODEL` (404).
   */
  route(apiKey: string | undefined, model: string, known: { readonly baseModel: string; readonly adapters: ReadonlySet<string> }): Route {
    const isBase = model === known.baseModel;
    if (!isBase && !known.adapters.has(model)) {
      throw new RouterError(RouterCode.UNKNOWN_MODEL, `model '${model}' does not exist (serving ${[known.baseModel, ...known.adapters].join(', ')})`);
    }
    if (!this.authEnabled) return { tenant: 'anonymous', adapter: isBase ? undefined : model };
    if (apiKey === undefined || apiKey === '') throw new RouterError(RouterCode.UNAUTHORIZED, 'an API key is required (Authorization: Bearer <key>)');
    const name = this.#byKey.get(apiKey);
    if (name === undefined) throw new RouterError(RouterCode.UNAUTHORIZED, 'the API key is not valid');
    const t = this.#tenants.get(name)!;
    if (isBase ? !t.base : !t.adapters.includes(model)) {
      throw new RouterError(RouterCode.FORBIDDEN, `tenant '${t.name}' may not use model '${model}'`);
    }
    return { tenant: t.name, adapter: isBase ? undefined : model };
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
