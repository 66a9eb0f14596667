/**
 * @packageDocumentation
 * `@stageml/router`: the multi-tenant serving core.
 *
 * - `TenantRegistry` / `parseRouterConfig`: tenants, API keys and the adapters each may use,
 *   changeable at run time; requests name the base model or an adapter (vLLM's convention).
 * - `Scheduler`: continuous batching over an `Engine` (`@stageml/engine`) — per-tenant queues, each bounded on its
 *   own, with weighted fair admission and caps (admission control), sequences joining and leaving between
 *   decode steps, staged (compiled plan) and fallback paths within one step, results scattered back
 *   in order, drain on shutdown.
 */
export { RouterCode, RouterError } from './errors.js';
export type { RouterErrorCode } from './errors.js';
export { MAX_CONFIG_DEPTH, TenantRegistry, parseRouterConfig } from './registry.js';
export type { Route, RouterConfig, Tenant } from './registry.js';
export { Scheduler } from './scheduler.js';
export type { GenerationRequest, GenerationResult, SchedulerOptions, SchedulerSnapshot, SchedulerStepStats } from './scheduler.js';
