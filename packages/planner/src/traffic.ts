import { PlanCode, PlanError } from './errors.js';
import { errorMessage } from '@stageml/ir';

function show(v: unknown): string {
  return v === undefined ? 'nothing' : JSON.stringify(v);
}

/** `format` field of every traffic document. */
export const TRAFFIC_FORMAT = 'stageml.traffic';
/** The traffic document version this reader and writer speak. */
export const TRAFFIC_VERSION = 1;

/**
 * Observed traffic per adapter (`stageml.traffic` v1): request or token counts. Only ratios
 * matter: the planner weighs each adapter's per-request cost by its share of the total.
 */
export interface Traffic {
  /** Always `stageml.traffic`. */
  readonly format: typeof TRAFFIC_FORMAT;
  /** Always 1. */
  readonly version: typeof TRAFFIC_VERSION;
  /** What was counted. */
  readonly unit: 'requests' | 'tokens';
  /** Count per adapter name (non-negative, finite); adapters absent here count 0. */
  readonly counts: Readonly<Record<string, number>>;
}

function bad(path: string, msg: string): never {
  throw new PlanError(PlanCode.BAD_TRAFFIC, msg, { path });
}

/** Builds a traffic value from counts, checking them (`PLAN_BAD_TRAFFIC`). */
export function traffic(counts: Readonly<Record<string, number>>, unit: Traffic['unit'] = 'requests'): Traffic {
  return checkTraffic({
    format: TRAFFIC_FORMAT,
    version: TRAFFIC_VERSION,
    unit,
    counts,
  });
}

/** Checks parsed JSON against `stageml.traffic` v1; violations are `PLAN_BAD_TRAFFIC` naming the JSON path. */
export function checkTraffic(doc: unknown): Traffic {
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) bad('$', 'traffic must be a JSON object');
  const d = doc as Record<string, unknown>;
  if (d['format'] !== TRAFFIC_FORMAT) bad('$.format', `expected '${TRAFFIC_FORMAT}', got ${show(d['format'])}`);
  if (d['version'] !== TRAFFIC_VERSION) bad('$.version', `unknown version ${show(d['version'])} (this reader knows ${String(TRAFFIC_VERSION)})`);
  for (const k of Object.keys(d)) if (!['format', 'version', 'unit', 'counts'].includes(k)) bad(`$.${k}`, 'unknown field (allowed: format, version, unit, counts)');
  const unit = d['unit'] ?? 'requests';
  if (unit !== 'requests' && unit !== 'tokens') bad('$.unit', `must be 'requests' or 'tokens', got ${show(unit)}`);
  const counts = d['counts'];
  if (typeof counts !== 'object' || counts === null || Array.isArray(counts)) bad('$.counts', 'must be an object of adapter name → count');
  const out: Record<string, number> = {};
  for (const [name, v] of Object.entries(counts as Record<string, unknown>)) {
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) bad(`$.counts[${JSON.stringify(name)}]`, `must be a non-negative finite number, got ${show(v)}`);
    out[name] = v;
  }
  return {
    format: TRAFFIC_FORMAT,
    version: TRAFFIC_VERSION,
    unit,
    counts: out,
  };
}

/** Parses a traffic document from JSON text; bad JSON is `PLAN_BAD_TRAFFIC` at `$`. */
export function parseTraffic(text: string): Traffic {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new PlanError(PlanCode.BAD_TRAFFIC, `not JSON: ${errorMessage(e)}`, { path: '$', cause: e });
  }
  return checkTraffic(doc);
}

/**
 * Each adapter's share of the traffic, in `adapters` order (summing to 1). Adapters absent from
 * the counts get 0; with no traffic at all (undefined, or every count 0) every adapter gets an
 * equal share. A count for an adapter not in `adapters` is `PLAN_BAD_TRAFFIC`.
 */
export function trafficShares(adapters: readonly string[], t: Traffic | undefined): number[] {
  if (t === undefined) return adapters.map(() => 1 / adapters.length);
  const known = new Set(adapters);
  for (const name of Object.keys(t.counts)) {
    if (!known.has(name))
      bad(`$.counts[${JSON.stringify(name)}]`, `adapter '${name}' is not in the workload (adapters: ${adapters.slice(0, 8).join(', ')}${adapters.length > 8 ? ', …' : ''})`);
  }
  const raw = adapters.map((a) => t.counts[a] ?? 0);
  const total = raw.reduce((x, y) => x + y, 0);
  return total > 0 ? raw.map((c) => c / total) : adapters.map(() => 1 / adapters.length);
}

/**
 * Live counters: record requests (and tokens) per adapter as they are served, then `snapshot()`
 * to re-plan. Counting is O(1) per call; snapshots copy the counts.
 */
export class TrafficCounter {
  private readonly requests = new Map<string, number>();
  private readonly tokens = new Map<string, number>();

  /** Counts one request (or `requests`) of `adapter` with `tokens` tokens. */
  record(adapter: string, tokens = 0, requests = 1): void {
    if (!(tokens >= 0) || !(requests >= 0) || !Number.isFinite(tokens + requests))
      throw new PlanError(PlanCode.BAD_TRAFFIC, `counts must be non-negative and finite (got ${String(requests)} requests, ${String(tokens)} tokens)`);
    this.requests.set(adapter, (this.requests.get(adapter) ?? 0) + requests);
    this.tokens.set(adapter, (this.tokens.get(adapter) ?? 0) + tokens);
  }

  /** The counts so far as a traffic value, by requests (default) or tokens. */
  snapshot(unit: Traffic['unit'] = 'requests'): Traffic {
    return traffic(Object.fromEntries(unit === 'requests' ? this.requests : this.tokens), unit);
  }

  /** Forgets every count (e.g. at the start of a new observation window). */
  reset(): void {
    this.requests.clear();
    this.tokens.clear();
  }
}

/** Zipf traffic: adapter i (0-based, in the given order) gets total · (i + 1)^−s / H. */
export function zipfTraffic(adapters: readonly string[], s: number, total = 1_000_000): Traffic {
  if (!(s >= 0) || !Number.isFinite(s)) throw new PlanError(PlanCode.BAD_OPTION, `Zipf exponent must be a finite number ≥ 0, got ${String(s)}`);
  const w = adapters.map((_a, i) => (i + 1) ** -s);
  const h = w.reduce((a, b) => a + b, 0);
  return traffic(Object.fromEntries(adapters.map((a, i) => [a, (total * w[i]!) / h])));
}
