import type { LlamaConfig } from '@stageml/models';
import type { LoraAdapter } from '@stageml/peft';
import { type Plan, TrafficCounter } from '@stageml/planner';
import type { EnginePlan } from './options.js';
import { type AppliedPlan, appliedPlan, planMerges } from './plan.js';

/**
 * The engine's plan over time: the memory budget or fixed plan it serves under, the plan applied
 * now (which modules of which adapters are merged), the traffic the next plan weighs, and when to
 * plan again (an adapter set that changed, or `replanEvery` runs since the last plan). Applying a
 * plan's merges to slots and lanes is `AdapterSlots.applyPlan`'s job; this keeps the decisions.
 */
export class PlanState {
  /** Whether plans are applied at all (a budget to plan under, or a fixed plan). */
  readonly planning: boolean;
  readonly #traffic = new TrafficCounter();
  #applied: AppliedPlan = { plan: undefined, merged: new Map() };
  #plansApplied = 0;
  #dirty = false;
  #runsAtPlan = 0;

  constructor(
    readonly memoryBudget: number | undefined,
    readonly fixedPlan: Plan | undefined,
    readonly replanEvery: number,
  ) {
    this.planning = memoryBudget !== undefined || fixedPlan !== undefined;
  }

  /** The modules of adapter `name` the applied plan merges (undefined: none). */
  merged(name: string): ReadonlySet<string> | undefined {
    return this.#applied.merged.get(name);
  }

  /** The plan applied now. */
  plan(): EnginePlan {
    return {
      memoryBudget: this.memoryBudget,
      // A fixed plan is the plan from the start; its merges apply before the first step.
      plan: this.fixedPlan ?? this.#applied.plan,
      merged: Object.fromEntries([...this.#applied.merged].map(([a, m]) => [a, [...m].sort()])),
      applied: this.#plansApplied,
    };
  }

  /** Marks the plan for re-planning before the next step (only where a budget is planned under). */
  replan(): void {
    if (this.memoryBudget !== undefined) this.#dirty = true;
  }

  /** The adapter set changed: plan again before the next step, where plans are applied. */
  adaptersChanged(): void {
    this.#dirty = this.planning;
  }

  /** Counts `tokens` of traffic for adapter `name` (what the next budgeted plan weighs). */
  record(name: string, tokens: number): void {
    this.#traffic.record(name, tokens);
  }

  /** Refuses (a planner error) an adapter a fixed plan cannot take, before anything changes. */
  checkFits(shapeOnly: LoraAdapter): void {
    if (this.fixedPlan !== undefined) appliedPlan(this.fixedPlan, [shapeOnly]);
  }

  /**
   * The next plan when one is due after `runs` program runs (undefined: keep the applied one),
   * computed for the registered adapters' shapes `adapters`. Marks it planned either way; the
   * caller applies it (`commit`) once everything it needs is computed.
   */
  due(runs: number, adapters: readonly LoraAdapter[], config: LlamaConfig, executorName: string): AppliedPlan | undefined {
    if (!this.planning) return undefined;
    if (!this.#dirty && (this.fixedPlan !== undefined || runs - this.#runsAtPlan < this.replanEvery)) return undefined;
    this.#dirty = false;
    this.#runsAtPlan = runs;
    const snapshot = this.#traffic.snapshot('tokens');
    return this.fixedPlan !== undefined ? appliedPlan(this.fixedPlan, adapters) : planMerges(config, adapters, this.memoryBudget ?? 0, executorName, Object.keys(snapshot.counts).length === 0 ? undefined : snapshot);
  }

  /** Makes `next` the applied plan. */
  commit(next: AppliedPlan): void {
    this.#applied = next;
    this.#plansApplied++;
  }
}
