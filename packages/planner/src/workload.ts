import { type DType, isDType } from '@stageml/ir';
import { PlanCode, PlanError } from './errors.js';

function show(v: unknown): string {
  return v === undefined ? 'nothing' : JSON.stringify(v);
}

/** The plan kinds, in order of decreasing resident memory for a typical unit. */
export const PLAN_KINDS = ['materialize', 'residual', 'grouped-bank', 'fallback'] as const;

/**
 * How one unit (adapter, layer, projection[, expert]) runs:
 * - `materialize`: W' = W + s·B·A is folded at the adapter stage; requests pay the base GEMM only;
 *   memory out·in per unit.
 * - `residual`: a compiled low-rank path y += s·(x·Aᵀ)·Bᵀ per adapter; memory r·(in + out).
 * - `grouped-bank`: the factors live in a shared SGMV/BGMV bank that serves every bank adapter of
 *   a batch at once; memory r·(in + out), padded to the bank rank for the gathered form.
 * - `fallback`: not compiled; factors are bound at request time on the generic path (no resident
 *   memory, a penalty factor on the low-rank work).
 */
export type PlanKind = (typeof PLAN_KINDS)[number];

/** Whether `v` is a plan kind. */
export function isPlanKind(v: unknown): v is PlanKind {
  return (PLAN_KINDS as readonly unknown[]).includes(v);
}

/**
 * Units of one adapter that share a shape: one projection at several layers (and, for MoE, every
 * expert of each layer). Unit ids are (adapter, layer, projection, expert?).
 */
export interface UnitGroup {
  /** Projection name (`q_proj`, …, or `gate_up_proj` / `down_proj` for MoE experts). */
  readonly projection: string;
  /** Input features of the projection. */
  readonly inFeatures: number;
  /** Output features of the projection. */
  readonly outFeatures: number;
  /** LoRA rank r. */
  readonly rank: number;
  /** Decoder layer indices (distinct). */
  readonly layers: readonly number[];
  /** MoE: experts per layer; each expert of each layer is its own unit. Absent for dense projections. */
  readonly experts?: number;
  /** Fraction of a request's rows that reach each unit (MoE: top-k / E under uniform routing). Default 1. */
  readonly rowShare?: number;
  /** Kinds allowed for these units (e.g. without `materialize` when the quantization gate rejects it). Default: all. */
  readonly allowed?: readonly PlanKind[];
}

/** One adapter's units. */
export interface AdapterWorkload {
  /** Adapter name (unique). */
  readonly name: string;
  /** Its unit groups. */
  readonly groups: readonly UnitGroup[];
}

/** What is being planned: the adapters' units and the request shape they are served at. */
export interface Workload {
  /** Free-text label of the base model. */
  readonly model?: string;
  /** Element type of weights and factors (sets bytes per element). */
  readonly dtype: DType;
  /** Requests served together in one step. */
  readonly batch: number;
  /** Rows (tokens) per request per step: the prompt length for prefill, 1 for decode. */
  readonly seq: number;
  /** Adapters, each with its units. */
  readonly adapters: readonly AdapterWorkload[];
}

/** The identity of one unit. */
export interface UnitRef {
  /** Adapter name. */
  readonly adapter: string;
  /** Layer index. */
  readonly layer: number;
  /** Projection name. */
  readonly projection: string;
  /** Expert index (MoE units only). */
  readonly expert?: number;
}

/** A stable string key of a unit, unique within a workload. */
export function unitKey(u: UnitRef): string {
  return u.expert === undefined
    ? `${u.adapter}\u0000${String(u.layer)}\u0000${u.projection}`
    : `${u.adapter}\u0000${String(u.layer)}\u0000${u.projection}\u0000${String(u.expert)}`;
}

/** Human-readable unit name: `adapter/L3/q_proj` or `adapter/L3/gate_up_proj/e5`. */
export function unitLabel(u: UnitRef): string {
  return `${u.adapter}/L${String(u.layer)}/${u.projection}${u.expert === undefined ? '' : `/e${String(u.expert)}`}`;
}

/** Units in one group, per layer then per expert. */
export function groupUnitCount(g: UnitGroup): number {
  return g.layers.length * (g.experts ?? 1);
}

/** Calls `f` for each unit of a group, in (layer, expert) order. */
export function forEachUnit(adapter: string, g: UnitGroup, f: (u: UnitRef) => void): void {
  for (const layer of g.layers) {
    if (g.experts === undefined) f({ adapter, layer, projection: g.projection });
    else for (let expert = 0; expert < g.experts; expert++) f({ adapter, layer, projection: g.projection, expert });
  }
}

function positiveInt(v: unknown, what: string): void {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1) throw new PlanError(PlanCode.BAD_WORKLOAD, `${what} must be a positive integer, got ${show(v)}`);
}

/**
 * Checks a workload: positive batch/seq/dims/ranks, a known dtype, unique adapter names, distinct
 * layers per group, no unit in two groups, row shares in (0, 1], non-empty allowed-kind sets.
 * Throws `PLAN_BAD_WORKLOAD` naming the offending field.
 */
export function checkWorkload(w: Workload): void {
  if (!isDType(w.dtype)) throw new PlanError(PlanCode.BAD_WORKLOAD, `unknown dtype ${JSON.stringify(w.dtype)}`);
  positiveInt(w.batch, 'batch');
  positiveInt(w.seq, 'seq');
  const names = new Set<string>();
  for (const a of w.adapters) {
    if (typeof a.name !== 'string' || a.name.length === 0) throw new PlanError(PlanCode.BAD_WORKLOAD, 'adapter names must be non-empty strings');
    if (names.has(a.name)) throw new PlanError(PlanCode.BAD_WORKLOAD, `adapter '${a.name}' appears twice`);
    names.add(a.name);
    const seen = new Set<string>();
    a.groups.forEach((g, gi) => {
      const where = `adapter '${a.name}' group ${String(gi)} (${g.projection})`;
      if (typeof g.projection !== 'string' || g.projection.length === 0) throw new PlanError(PlanCode.BAD_WORKLOAD, `${where}: projection must be a non-empty string`);
      positiveInt(g.inFeatures, `${where}: inFeatures`);
      positiveInt(g.outFeatures, `${where}: outFeatures`);
      positiveInt(g.rank, `${where}: rank`);
      if (g.experts !== undefined) positiveInt(g.experts, `${where}: experts`);
      const share = g.rowShare ?? 1;
      if (!(share > 0 && share <= 1)) throw new PlanError(PlanCode.BAD_WORKLOAD, `${where}: rowShare must be in (0, 1], got ${String(share)}`);
      if (g.allowed !== undefined && (g.allowed.length === 0 || !g.allowed.every(isPlanKind))) {
        throw new PlanError(PlanCode.BAD_WORKLOAD, `${where}: allowed must be a non-empty list of ${PLAN_KINDS.join(', ')}`);
      }
      if (g.layers.length === 0) throw new PlanError(PlanCode.BAD_WORKLOAD, `${where}: no layers`);
      for (const layer of g.layers) {
        if (!Number.isSafeInteger(layer) || layer < 0) throw new PlanError(PlanCode.BAD_WORKLOAD, `${where}: layer ${String(layer)} is not a non-negative integer`);
        const k = `${String(layer)}\u0000${g.projection}`;
        if (seen.has(k)) throw new PlanError(PlanCode.BAD_WORKLOAD, `${where}: layer ${String(layer)} ${g.projection} is in two groups (or twice in one)`);
        seen.add(k);
      }
    });
  }
}

/** Total number of units of a workload. */
export function workloadUnitCount(w: Workload): number {
  let n = 0;
  for (const a of w.adapters) for (const g of a.groups) n += groupUnitCount(g);
  return n;
}
