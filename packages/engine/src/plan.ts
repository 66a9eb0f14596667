import type { HostTensor } from '@stageml/ir';
import type { LlamaConfig } from '@stageml/models';
import type { LoraAdapter, LoraModule } from '@stageml/peft';
import { type Plan, Planner, type Traffic, llamaWorkload } from '@stageml/planner';
import { EngineCode, EngineError } from './errors.js';

/** The decisions the engine applies: per adapter, the modules served merged (the rest stay in its slot). */
export interface AppliedPlan {
  /** The planner's plan (`stageml.plan` v1), or undefined when there was nothing to plan. */
  readonly plan: Plan | undefined;
  /** Per adapter, the modules merged into a weight copy of its lane. */
  readonly merged: ReadonlyMap<string, ReadonlySet<string>>;
}

/**
 * Plans the loaded adapters under `budgetBytes` of merged weight copies (`budgetCovers:
 * 'materialized'`: the slot tables are allocated anyway), with `traffic` from live counters. Each
 * unit is `materialize` (a merged copy W + s·B·A in the adapter's lane) or `residual` (the slot);
 * the engine has no other paths, so the planner may choose only these two.
 */
export function planMerges(config: LlamaConfig, adapters: readonly LoraAdapter[], budgetBytes: number, executor: string, trafficNow: Traffic | undefined): AppliedPlan {
  const withModules = adapters.filter((a) => a.modules.size > 0);
  if (withModules.length === 0) return { plan: undefined, merged: new Map() };
  const workload = llamaWorkload(config, withModules, { batch: 1, seq: 1, model: config.modelType, allowed: () => ['materialize', 'residual'] });
  const planner = new Planner(workload, { executor: { name: executor, supportsOp: () => true, lateBinding: true }, budgetCovers: 'materialized' });
  const known = new Set(withModules.map((a) => a.name));
  const counts = Object.entries(trafficNow?.counts ?? {}).filter(([n]) => known.has(n));
  const usable = trafficNow !== undefined && counts.some(([, c]) => c > 0) ? { ...trafficNow, counts: Object.fromEntries(counts) } : undefined;
  const outcome = planner.plan(budgetBytes, usable);
  if (outcome.kind !== 'ok') return { plan: undefined, merged: new Map() };
  return appliedPlan(outcome.plan, withModules);
}

/**
 * The merges a given plan makes for the loaded `adapters`: every `materialize` unit of a loaded
 * adapter names a module it serves merged; units of adapters not loaded are skipped (they apply
 * once the adapter is loaded). A unit naming a module the adapter does not have is
 * `ENGINE_BAD_OPTIONS`, so a plan made for other adapters is never half applied.
 */
export function appliedPlan(plan: Plan, adapters: readonly LoraAdapter[]): AppliedPlan {
  const merged = new Map<string, Set<string>>();
  const byPath = new Map(adapters.map((a) => [a.name, new Map([...a.modules.values()].map((m) => [pathKey(m.module), m.module]))]));
  for (const u of plan.units) {
    if (u.kind !== 'materialize' || u.expert !== undefined) continue;
    const modules = byPath.get(u.adapter);
    if (modules === undefined) continue;
    const module = modules.get(`${String(u.layer)}.${u.projection}`);
    if (module === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `the plan merges layer ${String(u.layer)} ${u.projection} of adapter '${u.adapter}', which that adapter does not have`);
    const set = merged.get(u.adapter) ?? new Set<string>();
    set.add(module);
    merged.set(u.adapter, set);
  }
  return { plan, merged };
}

function pathKey(module: string): string {
  const m = /^model\.layers\.(\d+)\.(?:self_attn|mlp)\.([a-z_]+)$/.exec(module);
  return m === null ? module : `${m[1]!}.${m[2]!}`;
}

/** The merged weight W + s·B·A of one module (a new tensor; W is not changed). */
export function mergedWeight(w: HostTensor, m: LoraModule): HostTensor {
  const [out, inDim] = w.shape as [number, number];
  const data = Float32Array.from(w.data as ArrayLike<number>);
  const A = m.A.data;
  const B = m.B.data;
  for (let o = 0; o < out; o++) {
    for (let j = 0; j < m.rank; j++) {
      const b = m.scale * B[o * m.rank + j]!;
      if (b === 0) continue;
      const row = o * inDim;
      const arow = j * inDim;
      for (let i = 0; i < inDim; i++) data[row + i]! += b * A[arow + i]!;
    }
  }
  return { dtype: 'f32', shape: w.shape, data };
}

/** `adapter` without the `merged` modules (what its slot holds when the plan merges them). */
export function withoutModules(adapter: LoraAdapter, merged: ReadonlySet<string> | undefined): LoraAdapter {
  if (merged === undefined || merged.size === 0) return adapter;
  return { ...adapter, modules: new Map([...adapter.modules].filter(([k, m]) => !merged.has(k) && !merged.has(m.module))) };
}
