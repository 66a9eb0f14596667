/**
 * The exact solver behind the planner: a multiple-choice knapsack with multiplicities.
 *
 *   minimize Σ_j Σ_o x_jo · c_jo   subject to   Σ_j Σ_o x_jo · m_jo ≤ C,   Σ_o x_jo = n_j,   x ≥ 0 integer
 *
 * Class j stands for n_j interchangeable units (identical memory and weighted cost per option), so
 * a solution is a count per option. Algorithm (Pisinger-style core method, exact):
 *
 * 1. Drop dominated options (no less memory and no less cost than another). Infeasible iff even
 *    the least-memory option everywhere exceeds C; optimal at once if the least-cost option
 *    everywhere fits.
 * 2. LP relaxation by greedy over convex-hull steps in order of efficiency Δc/Δm. Its split
 *    efficiency λ is the LP dual, L(λ) = Σ_j n_j min_o (c_jo + λ m_jo) − λC the LP optimum, and
 *    the greedy continued past the split an integer incumbent U.
 * 3. Lagrangian reduction. For every feasible x, cost(x) = L(λ) + Σ rc(x) + λ·slack(x), where
 *    rc_jo = c_jo + λ m_jo − min_o' (c_jo' + λ m_jo') ≥ 0 is charged per unit. So a solution no
 *    worse than U has Σ rc ≤ gap = U − L: options with rc > gap are never used, and classes with a
 *    single such option are fixed.
 * 4. Exact DP over the remaining ("core") classes on sparse (memory, cost) states (`searchCore`):
 *    a state is dropped only if it is Pareto-dominated, cannot be completed within C, or its
 *    Lagrangian bound exceeds the search limit. Each rule discards only states no better than a
 *    kept one, so the DP's best state is optimal among solutions within the limit. The limit
 *    grows from a small fraction of U − L (iterative deepening): the first limit under which any
 *    solution exists yields the optimum, and at U − L the greedy solution itself qualifies.
 *    Moves of one size from classes whose moves cannot exceed their unit count, and identical
 *    moves shared by several classes, are pooled into one count (`core-stages.ts`).
 */

import { type CoreContext, type CoreResult, type Pt, bestCost, decodeState, searchCore } from './core-search.js';

/** One option of a class: integer memory (bytes or any unit) and cost per unit. */
export interface KnapsackOption {
  /** Memory per unit: a non-negative safe integer. */
  readonly memory: number;
  /** Cost per unit: a non-negative finite number. */
  readonly cost: number;
}

/** `count` interchangeable units, each taking exactly one of `options`. */
export interface KnapsackClass {
  /** Number of units (≥ 1). */
  readonly count: number;
  /** Options, at least one. */
  readonly options: readonly KnapsackOption[];
}

/** Work done by one solve, for diagnostics and benchmarks. */
export interface KnapsackStats {
  /** Stages of the core search (classes with a choice after reduction, plus pools of shared moves). */
  readonly coreClasses: number;
  /** Moves shared by several classes that the core search pooled into one count. */
  readonly pools: number;
  /** Largest number of DP states alive after any class. */
  readonly maxStates: number;
  /** LP lower bound L(λ). */
  readonly lowerBound: number;
  /** The greedy incumbent's cost. */
  readonly greedyCost: number;
}

/**
 * Outcome of a solve: the optimal counts (`counts[j][o]` per original option index), or
 * infeasibility with the least memory any solution needs.
 */
export type KnapsackResult =
  | {
      readonly kind: 'ok';
      readonly cost: number;
      readonly memory: number;
      readonly counts: readonly (readonly number[])[];
      readonly stats: KnapsackStats;
    }
  | { readonly kind: 'infeasible'; readonly minMemory: number };

/** Non-dominated options in increasing memory and strictly decreasing cost. */
function frontier(options: readonly KnapsackOption[]): Pt[] {
  const pts = options.map((o, i) => ({ i, m: o.memory, c: o.cost })).sort((a, b) => a.m - b.m || a.c - b.c || a.i - b.i);
  const out: Pt[] = [];
  for (const p of pts) if (out.length === 0 || p.c < out[out.length - 1]!.c) out.push(p);
  return out;
}

/** Lower convex hull of a frontier (Andrew's monotone chain; collinear middle points dropped). */
function hull(front: readonly Pt[]): Pt[] {
  const h: Pt[] = [];
  for (const p of front) {
    while (h.length >= 2) {
      const o = h[h.length - 2]!;
      const a = h[h.length - 1]!;
      if ((a.m - o.m) * (p.c - o.c) - (a.c - o.c) * (p.m - o.m) > 0) break;
      h.pop();
    }
    h.push(p);
  }
  return h;
}

/**
 * Solves the multiple-choice knapsack exactly; see the module comment for the algorithm. Classes
 * whose non-dominated options are identical are merged first (their units are interchangeable), so
 * ties between many equal classes cost one class's work.
 */
export function solveKnapsack(classes: readonly KnapsackClass[], budget: number): KnapsackResult {
  const fronts = classes.map((k) => frontier(k.options));
  const merged: {
    count: number;
    options: KnapsackOption[];
    members: number[];
  }[] = [];
  const byKey = new Map<string, number>();
  fronts.forEach((f, j) => {
    const key = f.map((p) => `${String(p.m)}:${String(p.c)}`).join(',');
    const at = byKey.get(key);
    if (at === undefined) {
      byKey.set(key, merged.length);
      merged.push({
        count: classes[j]!.count,
        options: f.map((p) => ({ memory: p.m, cost: p.c })),
        members: [j],
      });
    } else {
      merged[at]!.count += classes[j]!.count;
      merged[at]!.members.push(j);
    }
  });
  const r = solveDistinct(merged, budget);
  if (r.kind === 'infeasible') return r;
  // Spread each merged class's counts over its members; any split is optimal (the units are identical).
  const counts = classes.map((k) => new Array<number>(k.options.length).fill(0));
  merged.forEach((mc, q) => {
    const left = r.counts[q]!.slice();
    let o = 0;
    for (const j of mc.members) {
      let need = classes[j]!.count;
      while (need > 0) {
        while (left[o] === 0) o++;
        const t = Math.min(need, left[o]!);
        const row = counts[j]!;
        const at = fronts[j]![o]!.i;
        row[at] = row[at]! + t;
        left[o] = left[o]! - t;
        need -= t;
      }
    }
  });
  return { ...r, counts };
}

function solveDistinct(classes: readonly KnapsackClass[], budget: number): KnapsackResult {
  const fronts = classes.map((k) => frontier(k.options));
  let minMemory = 0;
  let maxMemory = 0;
  classes.forEach((k, j) => {
    const f = fronts[j]!;
    minMemory += k.count * f[0]!.m;
    maxMemory += k.count * f[f.length - 1]!.m;
  });
  if (minMemory > budget) return { kind: 'infeasible', minMemory };
  const counts = classes.map((k) => new Array<number>(k.options.length).fill(0));
  const finish = (choose: (j: number) => void, stats: KnapsackStats): KnapsackResult => {
    classes.forEach((_k, j) => {
      choose(j);
    });
    let cost = 0;
    let memory = 0;
    counts.forEach((row, j) => {
      row.forEach((t, o) => {
        cost += t * classes[j]!.options[o]!.cost;
        memory += t * classes[j]!.options[o]!.memory;
      });
    });
    return { kind: 'ok', cost, memory, counts, stats };
  };
  if (maxMemory <= budget) {
    let c = 0;
    classes.forEach((k, j) => (c += k.count * fronts[j]![fronts[j]!.length - 1]!.c));
    return finish(
      (j) => {
        counts[j]![fronts[j]![fronts[j]!.length - 1]!.i] = classes[j]!.count;
      },
      { coreClasses: 0, pools: 0, maxStates: 1, lowerBound: c, greedyCost: c },
    );
  }

  // LP relaxation by hull steps, and the greedy incumbent.
  const hulls = fronts.map(hull);
  const steps: { j: number; h: number; dm: number; eff: number }[] = [];
  hulls.forEach((hl, j) => {
    for (let h = 0; h + 1 < hl.length; h++) {
      const dm = hl[h + 1]!.m - hl[h]!.m;
      steps.push({ j, h, dm, eff: (hl[h]!.c - hl[h + 1]!.c) / dm });
    }
  });
  steps.sort((a, b) => b.eff - a.eff || a.j - b.j || a.h - b.h);
  const level = hulls.map((hl, j) => {
    const row = new Array<number>(hl.length).fill(0);
    row[0] = classes[j]!.count;
    return row;
  });
  let rem = budget - minMemory;
  let lambda = -1;
  for (const s of steps) {
    const row = level[s.j]!;
    const eligible = row[s.h]!;
    const t = Math.min(eligible, Math.floor(rem / s.dm));
    if (t < eligible && lambda < 0) lambda = s.eff;
    if (t <= 0) continue;
    row[s.h] = eligible - t;
    row[s.h + 1] = row[s.h + 1]! + t;
    rem -= t * s.dm;
  }
  // NOTE: maxMemory > budget means some step could not be taken in full, so lambda was set.
  let greedyCost = 0;
  level.forEach((row, j) => {
    row.forEach((t, h) => {
      greedyCost += t * hulls[j]![h]!.c;
    });
  });

  // Lagrangian reduction at the LP dual.
  let lower = -lambda * budget;
  let scale = lambda * budget + greedyCost;
  const base: Pt[] = [];
  const reduced = fronts.map((f, j) => {
    let best = f[0]!;
    let bestV = best.c + lambda * best.m;
    for (const p of f) {
      const v = p.c + lambda * p.m;
      if (v < bestV) {
        best = p;
        bestV = v;
      }
    }
    base.push(best);
    lower += classes[j]!.count * bestV;
    scale += classes[j]!.count * Math.abs(bestV);
    return f.map((p) => p.c + lambda * p.m - bestV);
  });
  // NOTE: a conservative tolerance keeps states that float rounding might misjudge; it only costs time.
  const tol = 1e-11 * scale + Number.MIN_VALUE;
  const gap = Math.max(0, greedyCost - lower) + tol;
  let baseMem = 0;
  let baseCost = 0;
  fronts.forEach((_f, j) => {
    baseMem += classes[j]!.count * base[j]!.m;
    baseCost += classes[j]!.count * base[j]!.c;
  });
  const ctx: CoreContext = {
    counts: classes.map((k) => k.count),
    fronts,
    base,
    reduced,
    lambda,
    room: budget - baseMem,
  };
  // Iterative deepening on the gap: a search with a smaller limit g explores every solution of
  // cost ≤ L + g, so the first limit that yields any solution yields the optimum. Limits double
  // from (U − L)/256 up to U − L, where the greedy solution itself qualifies.
  let limit = Math.min(gap, Math.max(tol, gap / 256));
  let found: CoreResult;
  for (;;) {
    found = searchCore(ctx, limit);
    if (found.best >= 0 || limit >= gap) break;
    limit = Math.min(gap, limit * 2);
  }
  const stats: KnapsackStats = {
    coreClasses: found.stages.length,
    pools: found.stages.filter((st) => st.kind === 'pool').length,
    maxStates: found.maxStates,
    lowerBound: lower,
    greedyCost,
  };
  if (found.best < 0 || baseCost + bestCost(found) > greedyCost) {
    return finish((j) => {
      const row = counts[j]!;
      level[j]!.forEach((t, h) => {
        const at = hulls[j]![h]!.i;
        row[at] = row[at]! + t;
      });
    }, stats);
  }
  const decoded = decodeState(
    ctx,
    found,
    classes.map((k) => k.options.length),
  );
  return finish((j) => {
    counts[j]!.splice(0, counts[j]!.length, ...decoded[j]!);
  }, stats);
}
