import type { ExpertProjection } from './block.js';
import type { ExpertLora } from './expert-lora.js';
import { MoePlanError } from './errors.js';
import { errorMessage } from '@stageml/ir';

/** `format` field of every MoE plan document. */
export const MOE_PLAN_FORMAT = 'stageml.moe-plan';
/** The plan document version this reader and writer speak. */
export const MOE_PLAN_VERSION = 1;
/** The expert projections a plan can name, in canonical order. */
export const EXPERT_PROJECTIONS: readonly ExpertProjection[] = ['gate_up_proj', 'down_proj'];
/** The choices a plan can make for one unit. */
export const MOE_PLAN_CHOICES = ['materialize', 'residual', 'fallback'] as const;

/**
 * How one (adapter, layer, expert, projection) unit runs:
 * - `materialize`: W_e + s·B_e·A_e is folded into the expert weight at the `adapter` stage;
 * - `residual`: W_e stays, the low-rank path s·B_e·(A_e·x) is kept for this expert, per token;
 * - `fallback`: the factors stay late inputs (bound at request time), applied on the generic path.
 */
export type MoePlanChoice = (typeof MOE_PLAN_CHOICES)[number];

/** One planned unit: a choice for one expert projection of one adapter at one layer. */
export interface MoePlanUnit {
  /** Adapter name. */
  readonly adapter: string;
  /** MoE layer (module path, e.g. `model.layers.0.mlp.experts`). */
  readonly layer: string;
  /** Expert projection. */
  readonly projection: ExpertProjection;
  /** Expert index in [0, E). */
  readonly expert: number;
  /** What to do with this unit. */
  readonly choice: MoePlanChoice;
  /** Why the planner chose it (free text, kept verbatim). */
  readonly reason?: string;
}

/** A versioned MoE plan: one choice per unit of every adapter it covers. */
export interface MoePlan {
  /** Always `stageml.moe-plan`. */
  readonly format: typeof MOE_PLAN_FORMAT;
  /** Always 1. */
  readonly version: typeof MOE_PLAN_VERSION;
  /** Free-text label of the model the plan was made for. */
  readonly model?: string;
  /** The units, in any order; each at most once. */
  readonly units: readonly MoePlanUnit[];
}

/** One MoE layer of a model: its module path and expert count. */
export interface MoeLayerDescription {
  /** Module path. */
  readonly name: string;
  /** Number of experts E. */
  readonly numExperts: number;
}

/** Which layers and projections one adapter carries expert factors for. */
export interface MoeAdapterDescription {
  /** Adapter name. */
  readonly name: string;
  /** Targeted projections by layer. */
  readonly targets: readonly { readonly layer: string; readonly projections: readonly ExpertProjection[] }[];
}

/** What a plan is validated against: the model's MoE layers and the adapters' targets. */
export interface MoeModelShape {
  /** MoE layers. */
  readonly layers: readonly MoeLayerDescription[];
  /** Known adapters. */
  readonly adapters: readonly MoeAdapterDescription[];
}

/** The plan of one adapter at one layer: a choice per expert, for each projection it targets. */
export type LayerPlan = Partial<Readonly<Record<ExpertProjection, readonly MoePlanChoice[]>>>;

const TOP_KEYS = ['format', 'version', 'model', 'units'];
const UNIT_KEYS = ['adapter', 'layer', 'projection', 'expert', 'choice', 'reason'];

function show(v: unknown): string {
  return v === undefined ? 'nothing' : JSON.stringify(v);
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function noExtraKeys(v: Record<string, unknown>, allowed: readonly string[], path: string): void {
  for (const k of Object.keys(v)) if (!allowed.includes(k)) throw new MoePlanError(`${path}.${k}`, `unknown field '${k}' (allowed: ${allowed.join(', ')})`);
}

function nonEmptyString(v: unknown, path: string): string {
  if (typeof v !== 'string' || v.length === 0) throw new MoePlanError(path, `must be a non-empty string, got ${show(v)}`);
  return v;
}

function unitKey(u: Pick<MoePlanUnit, 'adapter' | 'layer' | 'projection' | 'expert'>): string {
  return JSON.stringify([u.adapter, u.layer, u.projection, u.expert]);
}

function checkUnit(v: unknown, path: string): MoePlanUnit {
  if (!isRecord(v)) throw new MoePlanError(path, 'a unit must be an object');
  noExtraKeys(v, UNIT_KEYS, path);
  const adapter = nonEmptyString(v['adapter'], `${path}.adapter`);
  const layer = nonEmptyString(v['layer'], `${path}.layer`);
  const projection = v['projection'];
  if (!EXPERT_PROJECTIONS.includes(projection as ExpertProjection)) {
    throw new MoePlanError(`${path}.projection`, `unknown projection ${show(projection)} (expected ${EXPERT_PROJECTIONS.join(' or ')})`);
  }
  const expert = v['expert'];
  if (typeof expert !== 'number' || !Number.isSafeInteger(expert) || expert < 0) {
    throw new MoePlanError(`${path}.expert`, `expert index must be a non-negative integer, got ${show(expert)}`);
  }
  const choice = v['choice'];
  if (!(MOE_PLAN_CHOICES as readonly unknown[]).includes(choice)) {
    throw new MoePlanError(`${path}.choice`, `unknown choice ${show(choice)} (expected ${MOE_PLAN_CHOICES.join(', ')})`);
  }
  const reason = v['reason'];
  if (reason !== undefined && typeof reason !== 'string') throw new MoePlanError(`${path}.reason`, 'reason must be a string');
  const unit = { adapter, layer, projection: projection as ExpertProjection, expert, choice: choice as MoePlanChoice };
  return reason === undefined ? unit : { ...unit, reason };
}

/**
 * Checks a plan against a model's shape: every adapter and layer exists, the adapter targets that
 * projection at that layer, expert indices are in range, and every adapter the plan mentions is
 * planned completely (each of its units exactly once). Throws `MoePlanError` (`MOE_BAD_PLAN`)
 * naming the offending entry's JSON path.
 */
export function validateMoePlan(plan: MoePlan, shape: MoeModelShape): void {
  const layers = new Map(shape.layers.map((l) => [l.name, l.numExperts]));
  const adapters = new Map(shape.adapters.map((a) => [a.name, a]));
  const seen = new Map<string, number>();
  plan.units.forEach((u, i) => {
    const path = `$.units[${String(i)}]`;
    const a = adapters.get(u.adapter);
    if (a === undefined) throw new MoePlanError(`${path}.adapter`, `adapter '${u.adapter}' is not in the model's shape description (known: ${[...adapters.keys()].join(', ') || 'none'})`);
    const E = layers.get(u.layer);
    if (E === undefined) throw new MoePlanError(`${path}.layer`, `layer '${u.layer}' is not a MoE layer of the model`);
    const target = a.targets.find((t) => t.layer === u.layer);
    if (target === undefined) throw new MoePlanError(`${path}.layer`, `adapter '${u.adapter}' has no expert factors at layer '${u.layer}'`);
    if (!target.projections.includes(u.projection)) throw new MoePlanError(`${path}.projection`, `adapter '${u.adapter}' has no factors for ${u.projection} at layer '${u.layer}'`);
    if (u.expert >= E) throw new MoePlanError(`${path}.expert`, `expert ${String(u.expert)} is out of range [0, ${String(E)}) for layer '${u.layer}'`);
    const key = unitKey(u);
    const first = seen.get(key);
    if (first !== undefined) throw new MoePlanError(path, `unit (${u.adapter}, ${u.layer}, ${u.projection}, expert ${String(u.expert)}) is planned twice (first at $.units[${String(first)}])`);
    seen.set(key, i);
  });
  const planned = new Set(plan.units.map((u) => u.adapter));
  for (const a of shape.adapters) {
    if (!planned.has(a.name)) continue;
    for (const t of a.targets) {
      const E = layers.get(t.layer);
      if (E === undefined) throw new MoePlanError('$.units', `adapter '${a.name}' targets layer '${t.layer}', which the shape description does not list`);
      for (const projection of t.projections) {
        for (let expert = 0; expert < E; expert++) {
          if (!seen.has(unitKey({ adapter: a.name, layer: t.layer, projection, expert }))) {
            throw new MoePlanError('$.units', `missing unit (${a.name}, ${t.layer}, ${projection}, expert ${String(expert)}): a planned adapter needs a choice for every unit`);
          }
        }
      }
    }
  }
}

/**
 * Checks that `doc` (parsed JSON) is a version-1 MoE plan and returns it typed; with `shape`, also
 * `validateMoePlan`. Unknown fields, versions, projections and choices are `MOE_BAD_PLAN`, each
 * naming the offending JSON path.
 */
export function checkMoePlan(doc: unknown, shape?: MoeModelShape): MoePlan {
  if (!isRecord(doc)) throw new MoePlanError('$', 'a MoE plan must be a JSON object');
  if (doc['format'] !== MOE_PLAN_FORMAT) throw new MoePlanError('$.format', `expected '${MOE_PLAN_FORMAT}', got ${show(doc['format'])}`);
  if (doc['version'] !== MOE_PLAN_VERSION) {
    throw new MoePlanError('$.version', `unknown version ${show(doc['version'])} (this reader knows ${String(MOE_PLAN_VERSION)})`);
  }
  noExtraKeys(doc, TOP_KEYS, '$');
  const model = doc['model'];
  if (model !== undefined && typeof model !== 'string') throw new MoePlanError('$.model', 'model must be a string');
  const units = doc['units'];
  if (!Array.isArray(units)) throw new MoePlanError('$.units', 'units must be an array');
  const plan: MoePlan = {
    format: MOE_PLAN_FORMAT,
    version: MOE_PLAN_VERSION,
    ...(model === undefined ? {} : { model }),
    units: units.map((u, i) => checkUnit(u, `$.units[${String(i)}]`)),
  };
  if (shape !== undefined) validateMoePlan(plan, shape);
  return plan;
}

/** Parses a plan document from JSON text (`checkMoePlan` after `JSON.parse`); bad JSON is `MOE_BAD_PLAN` at `$`. */
export function parseMoePlan(text: string, shape?: MoeModelShape): MoePlan {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new MoePlanError('$', `not JSON: ${errorMessage(e)}`, { cause: e });
  }
  return checkMoePlan(doc, shape);
}

/**
 * The JSON text of a plan: fixed key order, one unit per line, units in the plan's order, a
 * trailing newline. `parseMoePlan` returns an equal plan, and printing that again gives the same
 * bytes. The plan is checked first (with `shape`, also validated).
 */
export function moePlanToJson(plan: MoePlan, shape?: MoeModelShape): string {
  const checked = checkMoePlan(plan, shape);
  const head = [`  "format": ${JSON.stringify(checked.format)}`, `  "version": ${String(checked.version)}`];
  if (checked.model !== undefined) head.push(`  "model": ${JSON.stringify(checked.model)}`);
  const units = checked.units.map((u) => {
    const fields = [
      `"adapter": ${JSON.stringify(u.adapter)}`,
      `"layer": ${JSON.stringify(u.layer)}`,
      `"projection": ${JSON.stringify(u.projection)}`,
      `"expert": ${String(u.expert)}`,
      `"choice": ${JSON.stringify(u.choice)}`,
    ];
    if (u.reason !== undefined) fields.push(`"reason": ${JSON.stringify(u.reason)}`);
    return `    { ${fields.join(', ')} }`;
  });
  const body = units.length === 0 ? '  "units": []' : `  "units": [\n${units.join(',\n')}\n  ]`;
  return `{\n${[...head, body].join(',\n')}\n}\n`;
}

/**
 * A complete plan for `adapters` (default: every adapter of the shape): `choose` picks the choice
 * of each unit, visited in canonical order (adapter, layer, projection, expert).
 */
export function buildMoePlan(
  shape: MoeModelShape,
  choose: (unit: Omit<MoePlanUnit, 'choice' | 'reason'>) => MoePlanChoice,
  opts: { readonly adapters?: readonly string[]; readonly model?: string } = {},
): MoePlan {
  const layers = new Map(shape.layers.map((l) => [l.name, l.numExperts]));
  const units: MoePlanUnit[] = [];
  for (const a of shape.adapters) {
    if (opts.adapters !== undefined && !opts.adapters.includes(a.name)) continue;
    for (const t of a.targets) {
      const E = layers.get(t.layer);
      if (E === undefined) throw new MoePlanError('$.units', `adapter '${a.name}' targets layer '${t.layer}', which the shape description does not list`);
      for (const projection of EXPERT_PROJECTIONS) {
        if (!t.projections.includes(projection)) continue;
        for (let expert = 0; expert < E; expert++) {
          const unit = { adapter: a.name, layer: t.layer, projection, expert };
          units.push({ ...unit, choice: choose(unit) });
        }
      }
    }
  }
  return { format: MOE_PLAN_FORMAT, version: MOE_PLAN_VERSION, ...(opts.model === undefined ? {} : { model: opts.model }), units };
}

/**
 * The plan of `adapter` at `layer`: a choice per expert for each projection the adapter targets
 * there. An adapter the plan does not cover gets `fallback` everywhere: with no compiled plan, the
 * router serves it on the generic path. The plan is validated against `shape` first.
 */
export function layerPlanOf(plan: MoePlan, shape: MoeModelShape, adapter: string, layer: string): LayerPlan {
  validateMoePlan(plan, shape);
  const a = shape.adapters.find((x) => x.name === adapter);
  if (a === undefined) throw new MoePlanError('$.units', `adapter '${adapter}' is not in the model's shape description`);
  const E = shape.layers.find((l) => l.name === layer)?.numExperts;
  if (E === undefined) throw new MoePlanError('$.units', `layer '${layer}' is not a MoE layer of the model`);
  const out: Partial<Record<ExpertProjection, MoePlanChoice[]>> = {};
  for (const p of a.targets.find((t) => t.layer === layer)?.projections ?? []) out[p] = new Array<MoePlanChoice>(E).fill('fallback');
  // NOTE: a valid plan that covers the adapter lists every unit, so each entry is overwritten.
  for (const u of plan.units) if (u.adapter === adapter && u.layer === layer) out[u.projection]![u.expert] = u.choice;
  return out;
}

/** The shape description of one adapter, from its expert factors per layer (`expertLoraFor` results). */
export function describeMoeAdapter(name: string, byLayer: ReadonlyMap<string, readonly ExpertLora[]>): MoeAdapterDescription {
  const targets = [...byLayer]
    .filter(([, loras]) => loras.length > 0)
    .map(([layer, loras]) => ({ layer, projections: EXPERT_PROJECTIONS.filter((p) => loras.some((l) => l.projection === p)) }));
  return { name, targets };
}
