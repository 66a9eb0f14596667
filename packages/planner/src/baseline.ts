import type { PlanOutcome, Planner } from './planner.js';
import type { Traffic } from './traffic.js';
import type { PlanKind } from './workload.js';

/** Kinds the popularity rule tries for an adapter it does not materialize, in order. */
const REST_ORDER: readonly PlanKind[] = ['residual', 'grouped-bank', 'fallback'];

/** Options of `popularityPlan`. */
export interface PopularityOptions {
  /**
   * What adapters that are not materialized run: `residual` (the original rule; grouped-bank, then
   * fallback, when residual does not fit), or `cheapest`, each group's fastest usable
   * non-materialize kind that fits (isolates the materialization decisions in comparisons).
   */
  readonly rest?: 'residual' | 'cheapest';
}

/**
 * The original Python StageML's rule (its `residual_planner.py`), for comparison:
 * adapters in order of decreasing traffic (ties by name, code-point order); each is materialized
 * whole (every unit) when that fits the remaining budget — first fit, no early stop — and the
 * rest run `residual`. Rank, shape and bytes never affect the order. Where the budget also counts
 * factors (`budgetCovers: 'all'`) and residual does not fit, the next of grouped-bank, fallback
 * that is usable and fits is taken, group by group; if none fits the outcome is infeasible.
 */
export function popularityPlan(planner: Planner, budgetBytes: number, traffic?: Traffic, opts: PopularityOptions = {}): PlanOutcome {
  const shares = planner.shares(traffic);
  const order = planner.workload.adapters.map((a, i) => ({ name: a.name, i })).sort((a, b) => shares[b.i]! - shares[a.i]! || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const groupsOf = new Map<number, number[]>();
  planner.groups.forEach((g, j) => groupsOf.set(g.adapterIndex, [...(groupsOf.get(g.adapterIndex) ?? []), j]));
  const counts = planner.groups.map((g) => new Array<number>(g.costs.usable.length).fill(0));
  let used = 0;
  const put = (j: number, kind: PlanKind): void => {
    const g = planner.groups[j]!;
    counts[j]![g.costs.usable.indexOf(kind)] = g.units;
    used += g.units * planner.chargedBytes(g, kind);
  };
  for (const { i } of order) {
    const js = groupsOf.get(i) ?? [];
    const groups = js.map((j) => planner.groups[j]!);
    const whole = groups.reduce((a, g) => a + g.units * planner.chargedBytes(g, 'materialize'), 0);
    if (groups.every((g) => g.costs.usable.includes('materialize')) && used + whole <= budgetBytes) {
      for (const j of js) put(j, 'materialize');
      continue;
    }
    for (const j of js) {
      const g = planner.groups[j]!;
      const order = opts.rest === 'cheapest' ? [...REST_ORDER].sort((a, b) => g.costs.kinds[a].seconds - g.costs.kinds[b].seconds) : REST_ORDER;
      const kind = order.find((k) => g.costs.usable.includes(k) && used + g.units * planner.chargedBytes(g, k) <= budgetBytes);
      if (kind === undefined) return { kind: 'infeasible', minMemory: planner.minMemory() };
      put(j, kind);
    }
  }
  const { plan, cost, memory } = planner.assemble(budgetBytes, shares, counts);
  return {
    kind: 'ok',
    plan,
    cost,
    memory,
    stats: {
      coreClasses: 0,
      pools: 0,
      maxStates: 0,
      lowerBound: Number.NaN,
      greedyCost: cost,
    },
  };
}
