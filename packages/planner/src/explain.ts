import { popularityPlan } from './baseline.js';
import type { Plan } from './plan.js';
import type { Planner } from './planner.js';
import type { Traffic } from './traffic.js';
import { PLAN_KINDS, type PlanKind, unitKey } from './workload.js';

/** The numbers behind one group's decision. */
export interface ExplanationRow {
  /** Adapter name. */
  readonly adapter: string;
  /** Its traffic share. */
  readonly share: number;
  /** Projection. */
  readonly projection: string;
  /** LoRA rank. */
  readonly rank: number;
  /** Units in the group (layers × experts). */
  readonly units: number;
  /** How many units the plan put on each kind. */
  readonly chosen: Readonly<Record<PlanKind, number>>;
  /** Per kind: memory per unit, expected seconds per request per unit (share · seconds), and whether it was usable. */
  readonly kinds: Readonly<
    Record<
      PlanKind,
      {
        readonly memoryBytes: number;
        readonly expectedSeconds: number;
        readonly usable: boolean;
      }
    >
  >;
  /** Bank form of the shape. */
  readonly bankForm: 'grouped' | 'gathered';
}

/** One row per (adapter, group) of `planner`'s workload: the plan's choices and every kind's numbers. */
export function explainPlan(planner: Planner, plan: Plan): ExplanationRow[] {
  const kindOf = new Map(plan.units.map((u) => [unitKey(u), u.kind]));
  const shares = new Map(plan.adapters.map((a) => [a.name, a.share]));
  return planner.groups.map((g) => {
    const share = shares.get(g.adapter) ?? 0;
    const chosen = Object.fromEntries(PLAN_KINDS.map((k) => [k, 0])) as Record<PlanKind, number>;
    for (const layer of g.group.layers) {
      for (let e = 0; e < (g.group.experts ?? 1); e++) {
        const k = kindOf.get(
          unitKey({
            adapter: g.adapter,
            layer,
            projection: g.group.projection,
            ...(g.group.experts === undefined ? {} : { expert: e }),
          }),
        );
        if (k !== undefined) chosen[k]++;
      }
    }
    const kinds = Object.fromEntries(
      PLAN_KINDS.map((k) => [
        k,
        {
          memoryBytes: g.costs.kinds[k].memoryBytes,
          expectedSeconds: share * g.costs.kinds[k].seconds,
          usable: g.costs.usable.includes(k),
        },
      ]),
    ) as ExplanationRow['kinds'];
    return {
      adapter: g.adapter,
      share,
      projection: g.group.projection,
      rank: g.group.rank,
      units: g.units,
      chosen,
      kinds,
      bankForm: g.costs.bankForm,
    };
  });
}

/** Bytes with a binary unit: `512 B`, `16.0 KiB`, `1.50 GiB`. */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let u = 0;
  while (Math.abs(v) >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${String(v)} B` : `${v.toFixed(v < 10 ? 2 : 1)} ${units[u]!}`;
}

/** Seconds as microseconds with 4 significant digits. */
export function formatMicros(s: number): string {
  return `${(s * 1e6).toPrecision(4)} µs`;
}

const SHORT: Record<PlanKind, string> = {
  materialize: 'mat',
  residual: 'res',
  'grouped-bank': 'bank',
  fallback: 'fb',
};

/**
 * A text table of the decisions: per adapter and projection, the traffic share, the chosen kinds
 * with their unit counts, and for every kind (mat / res / bank / fb) the memory per unit and the
 * expected microseconds per request per unit; `—` marks kinds that are not usable there.
 */
export function formatExplanation(rows: readonly ExplanationRow[]): string[] {
  const head = [
    'adapter',
    'share',
    'projection',
    'r',
    'units',
    'decision',
    `memory/unit (${PLAN_KINDS.map((k) => SHORT[k]).join(' / ')})`,
    `expected µs/request per unit (${PLAN_KINDS.map((k) => SHORT[k]).join(' / ')})`,
  ];
  const body = rows.map((r) => [
    r.adapter,
    r.share.toFixed(4),
    r.projection,
    String(r.rank),
    String(r.units),
    PLAN_KINDS.filter((k) => r.chosen[k] > 0)
      .map((k) => `${SHORT[k]}×${String(r.chosen[k])}`)
      .join(' '),
    PLAN_KINDS.map((k) => (r.kinds[k].usable ? formatBytes(r.kinds[k].memoryBytes) : '—')).join(' / '),
    PLAN_KINDS.map((k) => (r.kinds[k].usable ? (r.kinds[k].expectedSeconds * 1e6).toPrecision(4) : '—')).join(' / '),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i]!.length)));
  const fmt = (cells: readonly string[]): string =>
    cells
      .map((c, i) => (i === 1 || i === 3 || i === 4 ? c.padStart(widths[i]!) : c.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd();
  return [fmt(head), widths.map((w) => '-'.repeat(w)).join('  '), ...body.map(fmt)];
}

/** One budget of a sweep: the optimizer's and the popularity rule's expected seconds (undefined when infeasible). */
export interface SweepPoint {
  /** Budget in bytes. */
  readonly budgetBytes: number;
  /** Optimal expected seconds per request, or undefined when infeasible. */
  readonly optimal: number | undefined;
  /** The popularity-first rule's expected seconds, or undefined when it finds no plan. */
  readonly popularity: number | undefined;
  /** Memory the optimal plan is charged. */
  readonly memoryBytes: number | undefined;
}

/**
 * Expected cost against budget: `points` budgets evenly spaced from the least memory any plan
 * needs to the memory of the unconstrained optimum (the Pareto curve is flat beyond it), each
 * planned exactly and by the popularity rule. Reuses the planner's prepared option sets.
 */
export function paretoSweep(planner: Planner, traffic: Traffic | undefined, points = 24): SweepPoint[] {
  const lo = planner.minMemory();
  const hi = Math.max(lo, planner.unconstrainedMemory(traffic));
  const budgets = [...new Set(Array.from({ length: Math.max(2, points) }, (_v, i) => Math.round(lo + ((hi - lo) * i) / (Math.max(2, points) - 1))))];
  return budgets.map((b) => {
    const o = planner.plan(b, traffic);
    const p = popularityPlan(planner, b, traffic);
    return {
      budgetBytes: b,
      optimal: o.kind === 'ok' ? o.cost : undefined,
      popularity: p.kind === 'ok' ? p.cost : undefined,
      memoryBytes: o.kind === 'ok' ? o.memory : undefined,
    };
  });
}

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

/**
 * A hand-written SVG of a sweep: expected µs per request against budget, the optimizer's Pareto
 * curve as a step line with points, the popularity rule dashed, and `mark` (the chosen budget) as
 * a vertical line.
 */
export function paretoSvg(points: readonly SweepPoint[], opts: { readonly mark?: number; readonly title?: string } = {}): string {
  const W = 640;
  const H = 400;
  const L = 80;
  const R = 20;
  const T = 40;
  const B = 60;
  const ys = points.flatMap((p) => [p.optimal, p.popularity]).filter((v): v is number => v !== undefined);
  const xMin = points[0]?.budgetBytes ?? 0;
  const xMax = Math.max(xMin + 1, points[points.length - 1]?.budgetBytes ?? 1, opts.mark ?? 0);
  const yMin = Math.min(...ys, Number.POSITIVE_INFINITY) * 1e6;
  const yMax = Math.max(...ys, 0) * 1e6;
  const ySpan = yMax - yMin > 0 ? yMax - yMin : Math.max(yMax, 1e-9);
  const x = (b: number): number => L + ((b - xMin) / (xMax - xMin)) * (W - L - R);
  const y = (s: number): number => T + (1 - (s * 1e6 - yMin) / ySpan) * (H - T - B);
  const f = (v: number): string => v.toFixed(1);
  const path = (key: 'optimal' | 'popularity'): string => {
    const pts = points.filter((p) => p[key] !== undefined);
    return pts.map((p, i) => (i === 0 ? `M${f(x(p.budgetBytes))},${f(y(p[key]!))}` : `H${f(x(p.budgetBytes))}V${f(y(p[key]!))}`)).join('');
  };
  const ticks = Array.from({ length: 5 }, (_v, i) => i / 4);
  const out = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${String(W)}" height="${String(H)}" viewBox="0 0 ${String(W)} ${String(H)}" font-family="sans-serif" font-size="11">`,
    `<rect width="${String(W)}" height="${String(H)}" fill="white"/>`,
    `<text x="${String(W / 2)}" y="20" text-anchor="middle" font-size="13">${esc(opts.title ?? 'Expected cost against memory budget')}</text>`,
    `<line x1="${String(L)}" y1="${String(H - B)}" x2="${String(W - R)}" y2="${String(H - B)}" stroke="black"/>`,
    `<line x1="${String(L)}" y1="${String(T)}" x2="${String(L)}" y2="${String(H - B)}" stroke="black"/>`,
    ...ticks.map((t) => {
      const b = xMin + t * (xMax - xMin);
      return `<text x="${f(x(b))}" y="${String(H - B + 16)}" text-anchor="middle">${esc(formatBytes(Math.round(b)))}</text>`;
    }),
    ...ticks.map((t) => {
      const s = (yMin + t * ySpan) / 1e6;
      return `<text x="${String(L - 6)}" y="${f(y(s) + 4)}" text-anchor="end">${(s * 1e6).toPrecision(3)}</text>`;
    }),
    `<text x="${String(W / 2)}" y="${String(H - 20)}" text-anchor="middle">memory budget</text>`,
    `<text x="16" y="${String(H / 2)}" text-anchor="middle" transform="rotate(-90 16 ${String(H / 2)})">expected µs per request</text>`,
    `<path d="${path('popularity')}" fill="none" stroke="#d62728" stroke-width="1.5" stroke-dasharray="5,4"/>`,
    `<path d="${path('optimal')}" fill="none" stroke="#1f77b4" stroke-width="2"/>`,
    ...points.filter((p) => p.optimal !== undefined).map((p) => `<circle cx="${f(x(p.budgetBytes))}" cy="${f(y(p.optimal!))}" r="2.5" fill="#1f77b4"/>`),
    ...(opts.mark === undefined ? [] : [`<line x1="${f(x(opts.mark))}" y1="${String(T)}" x2="${f(x(opts.mark))}" y2="${String(H - B)}" stroke="#2ca02c" stroke-dasharray="2,2"/>`]),
    `<g transform="translate(${String(W - R - 190)},${String(T + 6)})"><line x1="0" y1="0" x2="24" y2="0" stroke="#1f77b4" stroke-width="2"/><text x="30" y="4">optimal (exact)</text><line x1="0" y1="16" x2="24" y2="16" stroke="#d62728" stroke-dasharray="5,4"/><text x="30" y="20">popularity-first (original)</text></g>`,
    '</svg>',
  ];
  return `${out.join('\n')}\n`;
}
