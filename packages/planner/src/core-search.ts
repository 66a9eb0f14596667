/**
 * The exact core search of `solveKnapsack`: deviations from the Lagrangian base options.
 *
 * Each class j sits on its base option b_j (least c + λm); a solution is the base plus, per class,
 * some units moved to other options. With rc ≥ 0 the reduced cost of a move, any solution costs
 * L + Σ rc + λ·slack, so a search with limit g needs only moves with Σ rc + λ·slack ≤ g.
 */

import { type CoreContext, type Stage, buildStages, stageRate, stageSpan } from './core-stages.js';

export type { CoreContext, Pt } from './core-stages.js';

/**
 * The surviving states after each stage, as flat arrays: memory and cost relative to the base,
 * accumulated rc, the index of the state it extends in the previous layer, and its moves (a pool
 * count, or an index into `picks` for class stages).
 */
interface Layer {
  readonly m: Float64Array;
  readonly c: Float64Array;
  readonly rc: Float64Array;
  readonly parent: Int32Array;
  readonly move: Int32Array;
  readonly picks: readonly (readonly number[])[];
}

/** Outcome of one search: the best final state's index in the last layer (or -1), and what decodes it. */
export interface CoreResult {
  readonly best: number;
  readonly stages: readonly Stage[];
  readonly layers: readonly Layer[];
  readonly maxStates: number;
}

/** Candidate indices per stage stay below this (2^21), so they pack beside memory into a float64 key. */
const INDEX_SPAN = 2 ** 21;

/** Growable candidate buffers (one allocation per doubling, not one object per state). */
class Candidates {
  m = new Float64Array(1024);
  c = new Float64Array(1024);
  rc = new Float64Array(1024);
  parent = new Int32Array(1024);
  move = new Int32Array(1024);
  picks: (readonly number[])[] = [];
  n = 0;

  push(m: number, c: number, rc: number, parent: number, move: number): void {
    if (this.n === this.m.length) {
      const grow = <T extends Float64Array | Int32Array>(a: T, make: (len: number) => T): T => {
        const b = make(a.length * 2);
        b.set(a);
        return b;
      };
      this.m = grow(this.m, (l) => new Float64Array(l));
      this.c = grow(this.c, (l) => new Float64Array(l));
      this.rc = grow(this.rc, (l) => new Float64Array(l));
      this.parent = grow(this.parent, (l) => new Int32Array(l));
      this.move = grow(this.move, (l) => new Int32Array(l));
    }
    const i = this.n++;
    this.m[i] = m;
    this.c[i] = c;
    this.rc[i] = rc;
    this.parent[i] = parent;
    this.move[i] = move;
  }

  /**
   * The Pareto-optimal candidates when they were pushed as runs each sorted by memory (`starts`):
   * a k-way merge by (memory, cost) through a binary heap of run heads.
   */
  mergeRuns(starts: readonly number[]): Layer {
    const { m, c } = this;
    const ends = starts.map((_s, k) => (k + 1 < starts.length ? starts[k + 1]! : this.n));
    const head = starts.slice();
    const less = (a: number, b: number): boolean => {
      const ia = head[a]!;
      const ib = head[b]!;
      const ma = m[ia]!;
      const mb = m[ib]!;
      return ma < mb || (ma === mb && c[ia]! < c[ib]!);
    };
    const heap: number[] = [];
    const siftDown = (at: number): void => {
      for (let p = at; ;) {
        const l = 2 * p + 1;
        if (l >= heap.length) return;
        const q = l + 1 < heap.length && less(heap[l + 1]!, heap[l]!) ? l + 1 : l;
        if (!less(heap[q]!, heap[p]!)) return;
        [heap[p], heap[q]] = [heap[q]!, heap[p]!];
        p = q;
      }
    };
    for (let k = 0; k < starts.length; k++) if (head[k]! < ends[k]!) heap.push(k);
    for (let p = (heap.length >> 1) - 1; p >= 0; p--) siftDown(p);
    const keep: number[] = [];
    let bestC = Number.POSITIVE_INFINITY;
    while (heap.length > 0) {
      const k = heap[0]!;
      const i = head[k]!;
      if (c[i]! < bestC) {
        keep.push(i);
        bestC = c[i]!;
      }
      head[k] = i + 1;
      if (i + 1 >= ends[k]!) {
        heap[0] = heap[heap.length - 1]!;
        heap.pop();
      }
      siftDown(0);
    }
    return this.select(keep);
  }

  /**
   * The Pareto-optimal candidates (least cost for their memory, strictly decreasing), sorted by
   * memory. Every memory value is a multiple of `unit`, so (m / unit, index) packs exactly into
   * one float64 key whose native sort is much faster than a comparator sort; huge instances fall
   * back to the comparator.
   */
  pareto(unit: number): Layer {
    const { m, c, n } = this;
    const keep: number[] = [];
    let bestC = Number.POSITIVE_INFINITY;
    const consider = (i: number): void => {
      if (c[i]! < bestC) {
        keep.push(i);
        bestC = c[i]!;
      }
    };
    let maxQ = 0;
    for (let i = 0; i < n; i++) maxQ = Math.max(maxQ, Math.abs(m[i]! / unit));
    if (unit > 0 && n < INDEX_SPAN && maxQ * INDEX_SPAN < 2 ** 52) {
      const keys = new Float64Array(n);
      for (let i = 0; i < n; i++) keys[i] = Math.round(m[i]! / unit) * INDEX_SPAN + i;
      keys.sort();
      // Within one memory value keep the cheapest; then costs must strictly decrease.
      for (let a = 0; a < n;) {
        const q = Math.floor(keys[a]! / INDEX_SPAN);
        let best = keys[a]! - q * INDEX_SPAN;
        let b = a + 1;
        for (; b < n && Math.floor(keys[b]! / INDEX_SPAN) === q; b++) {
          const i = keys[b]! - q * INDEX_SPAN;
          if (c[i]! < c[best]!) best = i;
        }
        consider(best);
        a = b;
      }
    } else {
      const order = Int32Array.from({ length: n }, (_v, i) => i).sort((a, b) => m[a]! - m[b]! || c[a]! - c[b]!);
      for (const i of order) consider(i);
    }
    return this.select(keep);
  }

  /** The layer of candidates `keep`, in that order. */
  select(keep: readonly number[]): Layer {
    const pick = <T extends Float64Array | Int32Array>(a: T, make: (len: number) => T): T => {
      const b = make(keep.length);
      keep.forEach((i, k) => (b[k] = a[i]!));
      return b;
    };
    return {
      m: pick(this.m, (l) => new Float64Array(l)),
      c: pick(this.c, (l) => new Float64Array(l)),
      rc: pick(this.rc, (l) => new Float64Array(l)),
      parent: pick(this.parent, (l) => new Int32Array(l)),
      move: pick(this.move, (l) => new Int32Array(l)),
      picks: this.picks,
    };
  }
}

/**
 * Exact search over moves with Σ rc + λ·slack ≤ limit, stage by stage, on (memory, cost) states
 * pruned by Pareto dominance, by feasibility (even every downward move left cannot fit) and by a
 * lower bound on the final cost (below). Returns the best complete feasible state, if any.
 */
export function searchCore(ctx: CoreContext, limit: number): CoreResult {
  const { lambda, room } = ctx;
  const stages = buildStages(ctx, limit);
  const k = stages.length;
  const sufMin = new Array<number>(k + 1).fill(0);
  const sufMax = new Array<number>(k + 1).fill(0);
  // rc needed to add (fill) or remove memory with the suffix, relaxed: stage i adds up to
  // sufMax[i] − sufMax[i+1] bytes at its least upward rate (rc per byte) or more, and removes up to
  // sufMin[i+1] − sufMin[i] at its least downward rate; stages are in decreasing rate order, so the
  // cheapest are the last.
  const sufUpRc = new Array<number>(k + 1).fill(0);
  const sufDownRc = new Array<number>(k + 1).fill(0);
  // Every move from stage i on is a multiple of sufGcd[i]: the final slack is ≥ (room − m) mod it.
  const sufGcd = new Array<number>(k + 1).fill(0);
  for (let i = k - 1; i >= 0; i--) {
    const s = stages[i]!;
    const { up, down } = stageSpan(s, ctx.counts);
    sufMin[i] = sufMin[i + 1]! + down;
    sufMax[i] = sufMax[i + 1]! + up;
    sufUpRc[i] = sufUpRc[i + 1]! + (up > 0 ? up * stageRate(s, 1) : 0);
    sufDownRc[i] = sufDownRc[i + 1]! + (down < 0 ? -down * stageRate(s, -1) : 0);
    let g = sufGcd[i + 1]!;
    for (const dm of s.kind === 'class' ? s.devs.map((d) => d.dm) : [s.dm]) g = gcd(g, Math.abs(dm));
    sufGcd[i] = g;
  }
  /** Least rc with which stages i… can move `amount` bytes (≤ their capacity), cheapest (last) first. */
  const moveRc = (cap: readonly number[], rcs: readonly number[], i: number, amount: number): number => {
    let lo = i;
    let hi = k - 1;
    // Largest stage index q ≥ i whose suffix capacity still covers the amount.
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (cap[mid]! >= amount) lo = mid;
      else hi = mid - 1;
    }
    const rateQ = (rcs[lo]! - rcs[lo + 1]!) / Math.max(1, cap[lo]! - cap[lo + 1]!);
    return rcs[lo + 1]! + rateQ * (amount - cap[lo + 1]!);
  };
  const downCap = sufMin.map((v) => -v);
  // Final cost − L ≥ rc + (rc to fill the fillable slack from later stages) + λ·(slack left), as
  // each upward move's rate rc/dm is below λ so filling as far as possible is cheapest; and over
  // the budget, ≥ rc + (rc to remove the excess with later stages).
  const keep = (m: number, rc: number, i: number): boolean => {
    if (m + sufMin[i]! > room) return false;
    const slack = room - m;
    if (i === k) return rc + lambda * Math.max(0, slack) <= limit;
    if (slack < 0) return rc + moveRc(downCap, sufDownRc, i, -slack) <= limit;
    const g = sufGcd[i]!;
    const fill = Math.min(slack - (g > 0 ? slack % g : slack), sufMax[i]!);
    return rc + (fill > 0 ? moveRc(sufMax, sufUpRc, i, fill) : 0) + lambda * (slack - fill) <= limit;
  };
  /**
   * A pool stage: t = 0, 1, … units of size dm (cheapest runs first) on every state, t-major, so
   * each t yields one run of candidates sorted by memory (the previous layer shifted). Returns
   * the start of each run.
   */
  const poolCandidates = (stage: Stage & { kind: 'pool' }, i: number, from: Layer, out: Candidates): number[] => {
    const { dm, runs } = stage;
    const first = runs[0]!;
    const starts: number[] = [];
    let minRc = Number.POSITIVE_INFINITY;
    for (let s = 0; s < from.m.length; s++) minRc = Math.min(minRc, from.rc[s]!);
    let r = 0;
    let inRun = 0;
    let addRc = 0;
    let addC = 0;
    for (let t = 0; t <= stage.max; t++) {
      if (t > 0) {
        while (inRun === runs[r]!.count) {
          r++;
          inRun = 0;
        }
        inRun++;
        addRc += runs[r]!.rc;
        addC += runs[r]!.dc;
        if (minRc + addRc > limit) break;
      }
      starts.push(out.n);
      for (let s = 0; s < from.m.length; s++) {
        const m0 = from.m[s]!;
        const rc = from.rc[s]! + addRc;
        if (rc > limit) continue;
        const m = m0 + t * dm;
        if (dm > 0 && m + sufMin[i + 1]! > room) break;
        if (t > 0 && dm > 0 && first.dc < 0) {
          // The λ-only bound, cheap: rc + λ·(room − m − what later stages can add) ≤ limit.
          if (rc + lambda * Math.max(0, room - m - sufMax[i + 1]!) > limit) continue;
        }
        if (keep(m, rc, i + 1)) out.push(m, from.c[s]! + addC, rc, s, t);
      }
    }
    return starts;
  };
  let prev: Layer = { m: new Float64Array(1), c: new Float64Array(1), rc: new Float64Array(1), parent: new Int32Array([-1]), move: new Int32Array(1), picks: [] };
  const layers: Layer[] = [];
  let maxStates = 1;
  stages.forEach((stage, i) => {
    const out = new Candidates();
    if (stage.kind === 'pool') {
      prev = out.mergeRuns(poolCandidates(stage, i, prev, out));
      layers.push(prev);
      maxStates = Math.max(maxStates, prev.m.length);
      return;
    }
    for (let s = 0; s < prev.m.length; s++) {
      const m0 = prev.m[s]!;
      const c0 = prev.c[s]!;
      const rc0 = prev.rc[s]!;
      const devs = stage.devs;
      const picks: number[] = [];
      const visit = (d: number, left: number, m: number, c: number, rc: number): void => {
        if (d === devs.length) {
          if (!keep(m, rc, i + 1)) return;
          out.push(m, c, rc, s, out.picks.length);
          out.picks.push(picks.length === 0 ? NO_PICKS : picks.slice());
          return;
        }
        const dev = devs[d]!;
        let tMax = dev.rc > 0 ? Math.min(left, Math.floor((limit - rc) / dev.rc)) : left;
        if (dev.dm > 0) tMax = Math.min(tMax, Math.floor((room - m - sufMin[i + 1]!) / dev.dm));
        let tMin = 0;
        if (d === devs.length - 1 && dev.dm > 0 && dev.dc < 0) tMin = Math.max(0, Math.floor((lambda * (room - m - sufMax[i + 1]!) - (limit - rc)) / -dev.dc) - 1);
        for (let t = tMin; t <= tMax; t++) {
          if (t > 0) picks.push(dev.o, t);
          visit(d + 1, left - t, m + t * dev.dm, c + t * dev.dc, rc + t * dev.rc);
          if (t > 0) picks.length -= 2;
        }
      };
      visit(0, ctx.counts[stage.j]!, m0, c0, rc0);
    }
    prev = out.pareto(sufGcd[0]!);
    layers.push(prev);
    maxStates = Math.max(maxStates, prev.m.length);
  });
  // The final test applies to every final state, including the base state itself when there are
  // no stages (it was never pushed through `keep`): a state whose cost exceeds L + limit must not
  // count as found, or the deepening would stop at a limit below the true optimum's.
  let best = -1;
  for (let s = 0; s < prev.m.length; s++) if (keep(prev.m[s]!, prev.rc[s]!, k) && (best < 0 || prev.c[s]! < prev.c[best]!)) best = s;
  return { best, stages, layers, maxStates };
}

const NO_PICKS: readonly number[] = [];

function gcd(a: number, b: number): number {
  let x = a;
  let y = b;
  while (y !== 0) [x, y] = [y, x % y];
  return x;
}

/** Cost of the best state relative to the base (only when `result.best ≥ 0`). */
export function bestCost(result: CoreResult): number {
  return result.layers.length === 0 ? 0 : result.layers[result.layers.length - 1]!.c[result.best]!;
}

/**
 * Unit counts per (class, original option) of the best state: base options minus moves, class
 * moves as recorded, pool counts taken cheapest run first and spread over each run's targets in
 * order of their remaining units.
 */
export function decodeState(ctx: CoreContext, result: CoreResult, optionCounts: readonly number[]): number[][] {
  const counts = ctx.counts.map((_n, j) => new Array<number>(optionCounts[j]!).fill(0));
  const left = ctx.counts.slice();
  const add = (j: number, o: number, t: number): void => {
    counts[j]![o] = counts[j]![o]! + t;
    left[j] = left[j]! - t;
  };
  const pooled: { stage: Stage & { kind: 'pool' }; t: number }[] = [];
  let s = result.best;
  for (let i = result.layers.length - 1; i >= 0; i--) {
    const layer = result.layers[i]!;
    const stage = result.stages[i]!;
    const move = layer.move[s]!;
    if (stage.kind === 'pool') {
      if (move > 0) pooled.push({ stage, t: move });
    } else {
      const picks = layer.picks[move]!;
      for (let q = 0; q < picks.length; q += 2) add(stage.j, picks[q]!, picks[q + 1]!);
    }
    s = layer.parent[s]!;
  }
  for (const { stage, t } of pooled) {
    let need = t;
    for (const run of stage.runs) {
      let fromRun = Math.min(need, run.count);
      need -= fromRun;
      for (const { j, o } of run.targets) {
        const take = Math.min(fromRun, left[j]!);
        add(j, o, take);
        fromRun -= take;
      }
      if (need === 0) break;
    }
  }
  ctx.base.forEach((b, j) => {
    add(j, b.i, left[j]!);
  });
  return counts;
}
