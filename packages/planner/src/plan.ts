import { type DType, isDType, errorMessage } from '@stageml/ir';
import { PlanCode, PlanError } from './errors.js';
import { PLAN_KINDS, type PlanKind, type UnitRef, isPlanKind } from './workload.js';

/** `format` field of every plan document. */
export const PLAN_FORMAT = 'stageml.plan';
/** The plan document version this reader and writer speak. */
export const PLAN_VERSION = 1;

/** What a budget counts: every resident constant (`all`), or only merged weights (`materialized`, the original StageML's accounting). */
export type BudgetCovers = 'all' | 'materialized';

/** One unit's decision and the numbers behind it. */
export interface PlannedUnit extends UnitRef {
  /** Input features. */
  readonly inFeatures: number;
  /** Output features. */
  readonly outFeatures: number;
  /** LoRA rank. */
  readonly rank: number;
  /** The chosen kind. */
  readonly kind: PlanKind;
  /** Resident bytes of the chosen kind for this unit. */
  readonly memoryBytes: number;
  /** Seconds one request of this adapter spends in this unit under the chosen kind. */
  readonly seconds: number;
}

/** An adapter of the plan and its traffic share. */
export interface PlanAdapter {
  /** Adapter name. */
  readonly name: string;
  /** Share of requests (or tokens) in [0, 1]; the shares of a plan sum to 1. */
  readonly share: number;
}

/** A complete, versioned residual plan (`stageml.plan` v1). */
export interface Plan {
  /** Always `stageml.plan`. */
  readonly format: typeof PLAN_FORMAT;
  /** Always 1. */
  readonly version: typeof PLAN_VERSION;
  /** Free-text label of the base model. */
  readonly model?: string;
  /** Executor the plan is for. */
  readonly executor: string;
  /** Description of the cost model that priced it. */
  readonly costModel: string;
  /** Element type of weights and factors. */
  readonly dtype: DType;
  /** Requests per step the costs assume. */
  readonly batch: number;
  /** Rows per request per step the costs assume. */
  readonly seq: number;
  /** The memory budget in bytes. */
  readonly budgetBytes: number;
  /** What the budget counts. */
  readonly budgetCovers: BudgetCovers;
  /** Bytes the budget is charged: Σ unit memory over the counted kinds. */
  readonly memoryBytes: number;
  /** Expected seconds per request: Σ over units of (adapter share) · (unit seconds). */
  readonly expectedSeconds: number;
  /** Adapters with their shares. */
  readonly adapters: readonly PlanAdapter[];
  /** One decision per unit. */
  readonly units: readonly PlannedUnit[];
}

const TOP_KEYS = [
  'format',
  'version',
  'model',
  'executor',
  'costModel',
  'dtype',
  'batch',
  'seq',
  'budgetBytes',
  'budgetCovers',
  'memoryBytes',
  'expectedSeconds',
  'adapters',
  'units',
];
const UNIT_KEYS = ['adapter', 'layer', 'projection', 'expert', 'inFeatures', 'outFeatures', 'rank', 'kind', 'memoryBytes', 'seconds'];

function bad(path: string, msg: string): never {
  throw new PlanError(PlanCode.BAD_DOCUMENT, msg, { path });
}

function show(v: unknown): string {
  return v === undefined ? 'nothing' : JSON.stringify(v);
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function noExtra(v: Record<string, unknown>, keys: readonly string[], path: string): void {
  for (const k of Object.keys(v)) if (!keys.includes(k)) bad(`${path}.${k}`, `unknown field (allowed: ${keys.join(', ')})`);
}

function str(v: unknown, path: string): string {
  if (typeof v !== 'string' || v.length === 0) bad(path, `must be a non-empty string, got ${show(v)}`);
  return v;
}

function int(v: unknown, path: string, min: number): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min) bad(path, `must be an integer ≥ ${String(min)}, got ${show(v)}`);
  return v;
}

function num(v: unknown, path: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) bad(path, `must be a non-negative finite number, got ${show(v)}`);
  return v;
}

function checkUnit(v: unknown, path: string): PlannedUnit {
  if (!isRecord(v)) bad(path, 'a unit must be an object');
  noExtra(v, UNIT_KEYS, path);
  const kind = v['kind'];
  if (!isPlanKind(kind)) bad(`${path}.kind`, `unknown kind ${show(kind)} (expected ${PLAN_KINDS.join(', ')})`);
  const base = {
    adapter: str(v['adapter'], `${path}.adapter`),
    layer: int(v['layer'], `${path}.layer`, 0),
    projection: str(v['projection'], `${path}.projection`),
  };
  const rest = {
    inFeatures: int(v['inFeatures'], `${path}.inFeatures`, 1),
    outFeatures: int(v['outFeatures'], `${path}.outFeatures`, 1),
    rank: int(v['rank'], `${path}.rank`, 1),
    kind,
    memoryBytes: int(v['memoryBytes'], `${path}.memoryBytes`, 0),
    seconds: num(v['seconds'], `${path}.seconds`),
  };
  return v['expert'] === undefined ? { ...base, ...rest } : { ...base, expert: int(v['expert'], `${path}.expert`, 0), ...rest };
}

/**
 * Checks that `doc` (parsed JSON) has the `stageml.plan` v1 schema and returns it typed. Unknown
 * fields, kinds and versions, and fields of the wrong type, are `PLAN_BAD_DOCUMENT` naming the JSON
 * path. Consistency (totals, budget, completeness) is `validatePlan`'s job.
 */
export function checkPlan(doc: unknown): Plan {
  if (!isRecord(doc)) bad('$', 'a plan must be a JSON object');
  if (doc['format'] !== PLAN_FORMAT) bad('$.format', `expected '${PLAN_FORMAT}', got ${show(doc['format'])}`);
  if (doc['version'] !== PLAN_VERSION) bad('$.version', `unknown version ${show(doc['version'])} (this reader knows ${String(PLAN_VERSION)})`);
  noExtra(doc, TOP_KEYS, '$');
  const model = doc['model'];
  const dtype = doc['dtype'];
  if (typeof dtype !== 'string' || !isDType(dtype)) bad('$.dtype', `unknown dtype ${show(dtype)}`);
  const covers = doc['budgetCovers'];
  if (covers !== 'all' && covers !== 'materialized') bad('$.budgetCovers', `must be 'all' or 'materialized', got ${show(covers)}`);
  const adapters = doc['adapters'];
  if (!Array.isArray(adapters)) bad('$.adapters', 'must be an array');
  const units = doc['units'];
  if (!Array.isArray(units)) bad('$.units', 'must be an array');
  const head = {
    format: PLAN_FORMAT,
    version: PLAN_VERSION,
    ...(model === undefined ? {} : { model: str(model, '$.model') }),
  } as const;
  return {
    ...head,
    executor: str(doc['executor'], '$.executor'),
    costModel: str(doc['costModel'], '$.costModel'),
    dtype,
    batch: int(doc['batch'], '$.batch', 1),
    seq: int(doc['seq'], '$.seq', 1),
    budgetBytes: int(doc['budgetBytes'], '$.budgetBytes', 0),
    budgetCovers: covers,
    memoryBytes: int(doc['memoryBytes'], '$.memoryBytes', 0),
    expectedSeconds: num(doc['expectedSeconds'], '$.expectedSeconds'),
    adapters: adapters.map((a: unknown, i) => {
      const p = `$.adapters[${String(i)}]`;
      if (!isRecord(a)) bad(p, 'an adapter must be an object');
      noExtra(a, ['name', 'share'], p);
      const share = num(a['share'], `${p}.share`);
      if (share > 1) bad(`${p}.share`, `must be ≤ 1, got ${String(share)}`);
      return { name: str(a['name'], `${p}.name`), share };
    }),
    units: units.map((u: unknown, i) => checkUnit(u, `$.units[${String(i)}]`)),
  };
}

/** Parses a plan document from JSON text (`checkPlan` after `JSON.parse`); bad JSON is `PLAN_BAD_DOCUMENT` at `$`. */
export function parsePlan(text: string): Plan {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new PlanError(PlanCode.BAD_DOCUMENT, `not JSON: ${errorMessage(e)}`, { path: '$', cause: e });
  }
  return checkPlan(doc);
}

/**
 * The JSON text of a plan: keys in schema order, one adapter and one unit per line, a trailing
 * newline. Numbers print in their shortest round-trip form, so `parsePlan` returns an equal plan
 * and printing it again gives the same bytes.
 */
export function planToJson(plan: Plan): string {
  const p = checkPlan(plan);
  const line = (o: object, keys: readonly string[]): string => JSON.stringify(o, keys as string[]);
  const head = TOP_KEYS.filter((k) => k !== 'adapters' && k !== 'units' && (p as unknown as Record<string, unknown>)[k] !== undefined).map(
    (k) => `  ${JSON.stringify(k)}: ${JSON.stringify((p as unknown as Record<string, unknown>)[k])}`,
  );
  const list = (name: string, rows: readonly string[]): string => (rows.length === 0 ? `  "${name}": []` : `  "${name}": [\n${rows.map((r) => `    ${r}`).join(',\n')}\n  ]`);
  return `{\n${[
    ...head,
    list(
      'adapters',
      p.adapters.map((a) => line(a, ['name', 'share'])),
    ),
    list(
      'units',
      p.units.map((u) => line(u, UNIT_KEYS)),
    ),
  ].join(',\n')}\n}\n`;
}
