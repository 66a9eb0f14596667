import type { CostModel } from '@stageml/rewrite';
import { plannerCostModel } from './cost-model.js';
import { PlanCode, PlanError } from './errors.js';
import { type ExecutorCapabilities, executorCapabilities } from './executor-caps.js';
import { type KnapsackClass, type KnapsackStats, solveKnapsack } from './knapsack.js';
import { type GroupCosts, type KindCostOptions, KindCostTable } from './options.js';
import { type BudgetCovers, PLAN_FORMAT, PLAN_VERSION, type Plan, type PlannedUnit } from './plan.js';
import { type Traffic, trafficShares } from './traffic.js';
import { type PlanKind, type UnitGroup, type Workload, checkWorkload, groupUnitCount } from './workload.js';

/** How to plan. */
export interface PlannerOptions extends KindCostOptions {
  /** Cost model (default: `plannerCostModel()`, the analytic roofline). A `description` field, when present, is recorded in plans. */
  readonly costModel?: CostModel & { readonly description?: string };
  /** Executor the plan must run on: a known name or capabilities (default `interpreter`). */
  readonly executor?: string | ExecutorCapabilities;
  /** What the budget counts (default `all`). */
  readonly budgetCovers?: BudgetCovers;
}

/** One unit group of the workload with its per-kind numbers. */
export interface PreparedGroup {
  /** Index of the adapter in the workload. */
  readonly adapterIndex: number;
  /** Adapter name. */
  readonly adapter: string;
  /** The group. */
  readonly group: UnitGroup;
  /** Number of units in the group. */
  readonly units: number;
  /** Per-kind memory and seconds, usable kinds, bank form. */
  readonly costs: GroupCosts;
}

/**
 * Outcome of planning: the optimal plan with its expected seconds per request and charged
 * memory, or `infeasible` with the least memory any plan needs (every unit on its
 * least-memory usable kind).
 */
export type PlanOutcome =
  | {
      readonly kind: 'ok';
      readonly plan: Plan;
      readonly cost: number;
      readonly memory: number;
      readonly stats: KnapsackStats;
    }
  | { readonly kind: 'infeasible'; readonly minMemory: number };

/**
 * Plans a workload. Construction does the traffic-independent work once (workload checks, the
 * executor's usable kinds, per-kind memory and seconds of every group, cached by shape);
 * `plan(budget, traffic)` then only weighs the groups by traffic share and runs the exact
 * optimizer, so re-planning when traffic changes, or sweeping budgets, reuses everything else.
 */
export class Planner {
  /** The workload being planned. */
  readonly workload: Workload;
  /** The executor's capabilities. */
  readonly executor: ExecutorCapabilities;
  /** The cost model pricing the kinds. */
  readonly costModel: CostModel & { readonly description?: string };
  /** What budgets count. */
  readonly budgetCovers: BudgetCovers;
  /** Every group with its numbers, in workload order. */
  readonly groups: readonly PreparedGroup[];

  /** Checks `workload` and prices every group (throws `PLAN_BAD_WORKLOAD`, `PLAN_BAD_OPTION`, `PLAN_NOT_EXECUTABLE`). */
  constructor(workload: Workload, opts: PlannerOptions = {}) {
    checkWorkload(workload);
    this.workload = workload;
    this.executor = typeof opts.executor === 'object' ? opts.executor : executorCapabilities(opts.executor ?? 'interpreter');
    this.costModel = opts.costModel ?? plannerCostModel();
    this.budgetCovers = opts.budgetCovers ?? 'all';
    const table = new KindCostTable(workload, this.costModel, this.executor, opts);
    const groups: PreparedGroup[] = [];
    workload.adapters.forEach((a, adapterIndex) => {
      for (const group of a.groups)
        groups.push({
          adapterIndex,
          adapter: a.name,
          group,
          units: groupUnitCount(group),
          costs: table.costs(group),
        });
    });
    this.groups = groups;
  }

  /** Bytes a unit of `kind` in group `g` is charged against the budget. */
  chargedBytes(g: PreparedGroup, kind: PlanKind): number {
    return this.budgetCovers === 'all' || kind === 'materialize' ? g.costs.kinds[kind].memoryBytes : 0;
  }

  /** Traffic shares of the workload's adapters, in workload order (`PLAN_BAD_TRAFFIC` for unknown adapters). */
  shares(traffic?: Traffic): number[] {
    return trafficShares(
      this.workload.adapters.map((a) => a.name),
      traffic,
    );
  }

  /**
   * The plan of minimum expected seconds per request whose charged memory fits `budgetBytes`
   * (a non-negative safe integer), or `infeasible`. Exact: see `solveKnapsack`.
   */
  plan(budgetBytes: number, traffic?: Traffic): PlanOutcome {
    if (!Number.isSafeInteger(budgetBytes) || budgetBytes < 0)
      throw new PlanError(PlanCode.BAD_OPTION, `the budget must be a non-negative integer number of bytes, got ${String(budgetBytes)}`);
    const shares = this.shares(traffic);
    const classes: KnapsackClass[] = this.groups.map((g) => ({
      count: g.units,
      options: g.costs.usable.map((k) => ({
        memory: this.chargedBytes(g, k),
        cost: shares[g.adapterIndex]! * g.costs.kinds[k].seconds,
      })),
    }));
    const r = solveKnapsack(classes, budgetBytes);
    if (r.kind === 'infeasible') return r;
    return {
      kind: 'ok',
      ...this.assemble(budgetBytes, shares, r.counts),
      stats: r.stats,
    };
  }

  /**
   * The plan that puts `counts[j][k]` units of group j on its k-th usable kind (earlier layers
   * first), with its charged memory and expected seconds per request. Used by `plan` and by
   * baselines; the counts of each group must add up to its unit count.
   */
  assemble(budgetBytes: number, shares: readonly number[], counts: readonly (readonly number[])[]): { plan: Plan; cost: number; memory: number } {
    const units: PlannedUnit[] = [];
    let memory = 0;
    let cost = 0;
    this.groups.forEach((g, j) => {
      const row = counts[j]!;
      if (row.length !== g.costs.usable.length || row.reduce((a, t) => a + t, 0) !== g.units) {
        throw new PlanError(
          PlanCode.ACCOUNTING_MISMATCH,
          `group ${String(j)} of adapter '${g.adapter}' (${g.group.projection}): counts [${row.join(', ')}] do not cover its ${String(g.units)} units`,
        );
      }
      const { inFeatures, outFeatures, rank, projection, experts } = g.group;
      const adapter = g.adapter;
      let o = 0;
      let left = row[0]!;
      // NOTE: plain loops and fixed-shape literals: this runs once per unit (224k for 1,000 7B adapters).
      for (const layer of g.group.layers) {
        for (let e = 0; e < (experts ?? 1); e++) {
          while (left === 0) left = row[++o]!;
          left--;
          const kind = g.costs.usable[o]!;
          const { memoryBytes, seconds } = g.costs.kinds[kind];
          units.push(
            experts === undefined
              ? {
                  adapter,
                  layer,
                  projection,
                  inFeatures,
                  outFeatures,
                  rank,
                  kind,
                  memoryBytes,
                  seconds,
                }
              : {
                  adapter,
                  layer,
                  projection,
                  expert: e,
                  inFeatures,
                  outFeatures,
                  rank,
                  kind,
                  memoryBytes,
                  seconds,
                },
          );
        }
      }
      row.forEach((t, k) => {
        const kind = g.costs.usable[k]!;
        memory += t * this.chargedBytes(g, kind);
        cost += t * shares[g.adapterIndex]! * g.costs.kinds[kind].seconds;
      });
    });
    const plan: Plan = {
      format: PLAN_FORMAT,
      version: PLAN_VERSION,
      ...(this.workload.model === undefined ? {} : { model: this.workload.model }),
      executor: this.executor.name,
      costModel: this.costModel.description ?? 'custom cost model',
      dtype: this.workload.dtype,
      batch: this.workload.batch,
      seq: this.workload.seq,
      budgetBytes,
      budgetCovers: this.budgetCovers,
      memoryBytes: memory,
      expectedSeconds: cost,
      adapters: this.workload.adapters.map((a, i) => ({
        name: a.name,
        share: shares[i]!,
      })),
      units,
    };
    return { plan, cost, memory };
  }

  /** Least charged memory of any plan (every unit on its least-memory usable kind). */
  minMemory(): number {
    let m = 0;
    for (const g of this.groups) m += g.units * Math.min(...g.costs.usable.map((k) => this.chargedBytes(g, k)));
    return m;
  }

  /**
   * Charged memory of the plan that ignores the budget: every unit on its fastest usable kind,
   * least memory among ties (so adapters without traffic take their least-memory kind).
   */
  unconstrainedMemory(traffic?: Traffic): number {
    const shares = this.shares(traffic);
    let m = 0;
    for (const g of this.groups) {
      if (shares[g.adapterIndex] === 0) {
        m += g.units * Math.min(...g.costs.usable.map((k) => this.chargedBytes(g, k)));
        continue;
      }
      let best = g.costs.usable[0]!;
      for (const k of g.costs.usable) {
        const a = g.costs.kinds[k];
        const b = g.costs.kinds[best];
        if (a.seconds < b.seconds || (a.seconds === b.seconds && this.chargedBytes(g, k) < this.chargedBytes(g, best))) best = k;
      }
      m += g.units * this.chargedBytes(g, best);
    }
    return m;
  }
}
