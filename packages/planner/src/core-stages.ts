/**
 * Stages of the exact core search (`core-search.ts`): how the moves away from the Lagrangian base
 * options are grouped so that the search enumerates as few combinations as possible without
 * losing any solution.
 */

/** A frontier option of a class: original index, memory, cost. */
export interface Pt {
  readonly i: number;
  readonly m: number;
  readonly c: number;
}

/** What the search needs to know about the instance. */
export interface CoreContext {
  /** Unit counts per class. */
  readonly counts: readonly number[];
  /** Non-dominated options per class. */
  readonly fronts: readonly (readonly Pt[])[];
  /** Each class's base option (least c + λm; least memory among ties). */
  readonly base: readonly Pt[];
  /** rc of every frontier option. */
  readonly reduced: readonly (readonly number[])[];
  /** The Lagrange multiplier. */
  readonly lambda: number;
  /** Budget minus the memory of every class on its base option. */
  readonly room: number;
}

/** A move: a unit to frontier option `o` (original index), with its deltas and reduced cost. */
export interface Dev {
  readonly o: number;
  readonly dm: number;
  readonly dc: number;
  readonly rc: number;
}

/** Up to `count` units of one move (rc, dc) of a pool, taken from `targets` (classes, options). */
export interface Run {
  readonly rc: number;
  readonly dc: number;
  readonly count: number;
  readonly targets: readonly { readonly j: number; readonly o: number }[];
}

/**
 * A stage of the search.
 * - `class`: the moves of one class, enumerated jointly (they share its unit count).
 * - `pool`: moves of one memory size dm from several classes, as a single count t taken
 *   cheapest-first through `runs` (sorted by rc). Two cases make this exact: classes whose moves
 *   can never exceed their unit count together (`Σ bound ≤ n`: any mix is realizable, and among
 *   moves of equal dm the cheapest t minimize both rc and cost), and identical moves shared by
 *   several classes whose spare units always cover the pool (exchange argument: moving a shared
 *   move between classes changes neither memory nor cost).
 */
export type Stage =
  | { readonly kind: 'class'; readonly j: number; readonly devs: readonly Dev[] }
  | { readonly kind: 'pool'; readonly dm: number; readonly runs: readonly Run[]; readonly max: number };

/** The most units of `dev` any solution within `limit` can use: rc budget, upward memory, count. */
export function countBound(dev: Dev, limit: number, upRoom: number, n: number): number {
  let t = dev.rc > 0 ? Math.floor(limit / dev.rc) : n;
  if (dev.dm > 0) t = Math.min(t, Math.floor(upRoom / dev.dm));
  return Math.max(0, Math.min(n, t));
}

/** Least rc per byte moved among a stage's moves in direction `dir` (+1 up, −1 down, 0 both; ∞ without any). */
export function stageRate(s: Stage, dir: 1 | -1 | 0 = 0): number {
  let r = Number.POSITIVE_INFINITY;
  const moves = s.kind === 'class' ? s.devs : [{ dm: s.dm, rc: s.runs[0]!.rc }];
  for (const d of moves) if (dir === 0 ? d.dm !== 0 : Math.sign(d.dm) === dir) r = Math.min(r, d.rc / Math.abs(d.dm));
  return r;
}

/** Most and least memory a stage can add (≥ 0 and ≤ 0). */
export function stageSpan(s: Stage, counts: readonly number[]): { up: number; down: number } {
  if (s.kind === 'pool') return { up: Math.max(0, s.max * s.dm), down: Math.min(0, s.max * s.dm) };
  const n = counts[s.j]!;
  return { up: n * Math.max(0, ...s.devs.map((d) => d.dm)), down: n * Math.min(0, ...s.devs.map((d) => d.dm)) };
}

/**
 * Builds the stages for `limit`: every class's moves with rc ≤ limit; classes whose moves cannot
 * exceed their count go into pools by move size; identical moves of the other classes are pooled
 * where their spare units cover them; what remains are class stages. Stages are ordered by
 * decreasing least rate (rc per byte moved), the order the search's bounds rely on.
 */
export function buildStages(ctx: CoreContext, limit: number): Stage[] {
  const per: { j: number; devs: Dev[] }[] = [];
  let downAll = 0;
  ctx.fronts.forEach((f, j) => {
    const b = ctx.base[j]!;
    const devs: Dev[] = [];
    f.forEach((p, k) => {
      const rc = Math.max(0, ctx.reduced[j]![k]!);
      if (p !== b && rc <= limit) devs.push({ o: p.i, dm: p.m - b.m, dc: p.c - b.c, rc });
    });
    if (devs.length > 0) {
      per.push({ j, devs });
      downAll += ctx.counts[j]! * Math.min(0, ...devs.map((d) => d.dm));
    }
  });
  // Any feasible solution adds at most room − (every possible downward move) upward.
  const upRoom = ctx.room - downAll;
  const bySize = new Map<number, Run[]>();
  const joint: { j: number; devs: Dev[] }[] = [];
  for (const e of per) {
    const n = ctx.counts[e.j]!;
    const bounds = e.devs.map((d) => countBound(d, limit, upRoom, n));
    if (bounds.reduce((a, t) => a + t, 0) > n) {
      joint.push(e);
      continue;
    }
    e.devs.forEach((d, k) => {
      const bound = bounds[k]!;
      if (bound === 0) return;
      const run: Run = { rc: d.rc, dc: d.dc, count: bound, targets: [{ j: e.j, o: d.o }] };
      const list = bySize.get(d.dm);
      if (list === undefined) bySize.set(d.dm, [run]);
      else list.push(run);
    });
  }
  const stages: Stage[] = [];
  for (const [dm, runs] of bySize) {
    runs.sort((a, b) => a.rc - b.rc);
    stages.push({ kind: 'pool', dm, runs, max: runs.reduce((a, r) => a + r.count, 0) });
  }
  // Identical moves of joint classes, pooled when the members' spare units cover the most any
  // solution within the limit can use.
  const byMove = new Map<string, { j: number; dev: Dev }[]>();
  const devsOf = new Map<number, readonly Dev[]>();
  for (const { j, devs } of joint) {
    devsOf.set(j, devs);
    for (const dev of devs) {
      const key = `${String(dev.dm)}:${String(dev.dc)}`;
      const list = byMove.get(key);
      if (list === undefined) byMove.set(key, [{ j, dev }]);
      else list.push({ j, dev });
    }
  }
  const pooledClass = new Set<number>();
  const removed = new Set<string>();
  for (const [key, members] of [...byMove].sort((a, b) => b[1].length - a[1].length)) {
    if (members.length < 2 || members.some((m) => pooledClass.has(m.j))) continue;
    const dev = members[0]!.dev;
    const max = countBound(
      dev,
      limit,
      upRoom,
      members.reduce((a, m) => a + ctx.counts[m.j]!, 0),
    );
    let spare = 0;
    for (const m of members) {
      const n = ctx.counts[m.j]!;
      const others = devsOf.get(m.j)!.filter((d) => d !== m.dev);
      spare +=
        n -
        Math.min(
          n,
          others.reduce((a, d) => a + countBound(d, limit, upRoom, n), 0),
        );
    }
    if (max > spare || max === 0) continue;
    for (const m of members) {
      pooledClass.add(m.j);
      removed.add(`${String(m.j)}:${key}`);
    }
    stages.push({ kind: 'pool', dm: dev.dm, runs: [{ rc: dev.rc, dc: dev.dc, count: max, targets: members.map((m) => ({ j: m.j, o: m.dev.o })) }], max });
  }
  for (const { j, devs } of joint) {
    const kept = devs.filter((d) => !removed.has(`${String(j)}:${String(d.dm)}:${String(d.dc)}`));
    // Downward moves first, so every move after an upward one is upward (memory caps stay valid).
    kept.sort((a, b) => a.dm - b.dm);
    if (kept.length > 0) stages.push({ kind: 'class', j, devs: kept });
  }
  // Most expensive moves (rc per byte, either direction) first: the bounds then fill a slack, or
  // remove an excess, from the cheapest stages, which are the last ones. Ties put wide stages last.
  const span = (s: Stage): number => (s.kind === 'pool' ? s.max : ctx.counts[s.j]! * s.devs.length);
  const rate = new Map(stages.map((s) => [s, stageRate(s)]));
  return stages.sort((a, b) => rate.get(b)! - rate.get(a)! || span(a) - span(b));
}
