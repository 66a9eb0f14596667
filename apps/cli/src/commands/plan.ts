import { readFile, writeFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { InvalidArgumentError, type Command } from 'commander';
import { type DType, parseDType, errorMessage } from '@stageml/ir';
import { parseLlamaConfig } from '@stageml/models';
import { type LoraAdapter, findAdapterDirs, loadLoraAdapter } from '@stageml/peft';
import {
  type BudgetCovers,
  type Planner as PlannerType,
  PLAN_KINDS,
  type PlanKind,
  PlanCode,
  PlanError,
  Planner,
  explainPlan,
  formatBytes,
  formatExplanation,
  formatMicros,
  llamaWorkload,
  paretoSvg,
  paretoSweep,
  acceptQuantization,
  analyzeQuantization,
  parseCalibration,
  parseQuantConfig,
  parseTraffic,
  planToJson,
  plannerCostModel,
  popularityPlan,
  validatePlan,
} from '@stageml/planner';
import { openCheckpoint } from '@stageml/safetensors';
import { parseNumber, parsePositiveInt } from '../args.js';
import { CliCode, CliError } from '../errors.js';
import type { CliIo } from '../io.js';

interface PlanOptions {
  model: string;
  adapters: string;
  budget: number;
  traffic?: string;
  batch: number;
  seq: number;
  dtype: DType;
  calibration?: string;
  executor: string;
  budgetCovers: BudgetCovers;
  fallback: boolean;
  fallbackPenalty?: number;
  peakFlops?: number;
  bandwidth?: number;
  dispatchUs?: number;
  quantize?: string;
  quantThreshold: number;
  out: string;
  json?: boolean;
  svg?: string;
  sweep: number;
}

const UNITS: Record<string, number> = {
  '': 1,
  B: 1,
  K: 1024,
  KIB: 1024,
  KB: 1000,
  M: 1024 ** 2,
  MIB: 1024 ** 2,
  MB: 1e6,
  G: 1024 ** 3,
  GIB: 1024 ** 3,
  GB: 1e9,
  T: 1024 ** 4,
  TIB: 1024 ** 4,
  TB: 1e12,
};

/** Parses a byte count: an integer, optionally with a unit (`512`, `64MiB`, `1.5GiB`, `2GB`). */
export function parseBytes(value: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(value);
  const unit = UNITS[(m?.[2] ?? '?').toUpperCase()];
  const bytes = m === null || unit === undefined ? Number.NaN : Number(m[1]) * unit;
  if (!Number.isSafeInteger(bytes)) throw new InvalidArgumentError(`expected a whole number of bytes (e.g. 1048576, 64MiB, 2GB), got '${value}'`);
  return bytes;
}

async function readText(path: string, what: string): Promise<string> {
  try {
    return await readFile(path, 'utf8');
  } catch (e) {
    throw new CliError(CliCode.IO, `cannot read ${what} '${path}': ${errorMessage(e)}`, { cause: e });
  }
}

async function writeText(path: string, text: string, what: string): Promise<void> {
  try {
    await writeFile(path, text);
  } catch (e) {
    throw new CliError(CliCode.IO, `cannot write ${what} '${path}': ${errorMessage(e)}`, { cause: e });
  }
}

/** The quantization gate's verdict on one group of an adapter (one projection and rank, every layer). */
interface GateRow {
  adapter: string;
  projection: string;
  rank: number;
  /** Largest relative weight-space error bound over the group's layers. */
  bound: number;
  accepted: boolean;
}

/**
 * The quantization gate: for every LoRA module of every adapter, the sound bound on the error of
 * quantizing the merged weight instead of the base plus the exact delta (`analyzeQuantization`,
 * relative weight-space measure); a group (adapter, projection, rank) may materialize only if every
 * layer is accepted.
 */
async function quantizationGate(opts: PlanOptions, spec: string, adapters: readonly LoraAdapter[]): Promise<GateRow[]> {
  const config = parseQuantConfig(spec);
  const ckpt = await openCheckpoint(opts.model);
  const rows = new Map<string, GateRow>();
  try {
    for (const a of adapters) {
      for (const m of a.modules.values()) {
        const projection = m.module.slice(m.module.lastIndexOf('.') + 1);
        const key = `${a.name}|${projection}|${String(m.rank)}`;
        const weight = await ckpt.readTensor(`${m.module}.weight`);
        const d = acceptQuantization(analyzeQuantization({ weight, A: m.A, B: m.B, scale: m.scale }, config), opts.quantThreshold);
        const row = rows.get(key) ?? { adapter: a.name, projection, rank: m.rank, bound: 0, accepted: true };
        row.bound = Math.max(row.bound, d.bound);
        row.accepted &&= d.kind === 'accept';
        rows.set(key, row);
      }
    }
  } finally {
    await ckpt.close();
  }
  return [...rows.values()];
}

async function loadPlanner(opts: PlanOptions): Promise<{ planner: PlannerType; gate: GateRow[] | undefined }> {
  const config = parseLlamaConfig(await readText(join(opts.model, 'config.json'), 'model config'), join(opts.model, 'config.json'));
  const dirs = await findAdapterDirs(opts.adapters);
  const adapters = await Promise.all(dirs.map((a) => loadLoraAdapter(a.dir, { name: a.name })));
  const gate = opts.quantize === undefined ? undefined : await quantizationGate(opts, opts.quantize, adapters);
  const rejected = new Set((gate ?? []).filter((g) => !g.accepted).map((g) => `${g.adapter}|${g.projection}|${String(g.rank)}`));
  const allowed = (adapter: string, g: { projection: string; rank: number }): PlanKind[] | undefined => {
    let kinds: PlanKind[] = [...PLAN_KINDS];
    if (!opts.fallback) kinds = kinds.filter((k) => k !== 'fallback');
    if (rejected.has(`${adapter}|${g.projection}|${String(g.rank)}`)) kinds = kinds.filter((k) => k !== 'materialize');
    return kinds.length === PLAN_KINDS.length ? undefined : kinds;
  };
  const workload = llamaWorkload(config, adapters, { dtype: opts.dtype, batch: opts.batch, seq: opts.seq, model: basename(opts.model), allowed });
  const costModel =
    opts.calibration === undefined
      ? plannerCostModel({
          ...(opts.peakFlops === undefined ? {} : { peakFlopsPerSecond: opts.peakFlops }),
          ...(opts.bandwidth === undefined ? {} : { bytesPerSecond: opts.bandwidth }),
          ...(opts.dispatchUs === undefined ? {} : { opOverheadSeconds: opts.dispatchUs * 1e-6 }),
        })
      : plannerCostModel({ calibration: parseCalibration(await readText(opts.calibration, 'calibration')) });
  const planner = new Planner(workload, {
    costModel,
    executor: opts.executor,
    budgetCovers: opts.budgetCovers,
    ...(opts.fallbackPenalty === undefined ? {} : { fallbackPenalty: opts.fallbackPenalty }),
  });
  return { planner, gate };
}

/** `stageml plan`: the optimal residual plan of a model's adapters under a memory budget, explained. */
export function registerPlan(program: Command, io: CliIo): void {
  program
    .command('plan')
    .description('choose materialize / residual / grouped-bank / fallback per (adapter, layer, projection) under a memory budget, exactly, and explain why')
    .requiredOption('--model <dir>', 'Hugging Face model directory (config.json)')
    .requiredOption('--adapters <dir>', 'a PEFT adapter directory, or a directory of them')
    .requiredOption('--budget <bytes>', 'memory budget for resident adapter constants (bytes, or with a unit: 64MiB, 2GB)', parseBytes)
    .option('--traffic <file>', 'stageml.traffic v1 JSON with request or token counts per adapter (default: equal traffic)')
    .option('--batch <n>', 'requests per step the costs assume', parsePositiveInt, 8)
    .option('--seq <n>', 'rows (tokens) per request per step: prompt length for prefill, 1 for decode', parsePositiveInt, 128)
    .option('--dtype <dtype>', 'element type of weights and factors', parseDType, 'f32' as DType)
    .option('--calibration <file>', 'stageml.calibration v1 JSON measured on the executor (default: the analytic roofline)')
    .option('--peak-flops <n>', 'analytic model: peak FLOP/s', parseNumber)
    .option('--bandwidth <n>', 'analytic model: memory bandwidth in bytes/s', parseNumber)
    .option('--dispatch-us <n>', 'analytic model: fixed cost per op in µs', parseNumber)
    .option('--executor <name>', 'executor the plan must run on (interpreter, tfjs-<backend>)', 'interpreter')
    .option(
      '--budget-covers <what>',
      "what the budget counts: 'all' resident constants or only 'materialized' weights (the original StageML's accounting)",
      (v: string): BudgetCovers => {
        if (v !== 'all' && v !== 'materialized') throw new InvalidArgumentError(`expected 'all' or 'materialized', got '${v}'`);
        return v;
      },
      'all' as BudgetCovers,
    )
    .option('--no-fallback', 'every unit must be compiled (no generic path)')
    .option('--fallback-penalty <x>', 'factor on the generic path’s low-rank work (≥ 1, default 2)', parseNumber)
    .option('--quantize <spec>', 'quantization gate for merged weights: int8, int4, int8:g<N>, int4:g<N> (per channel, or per group of N inputs)')
    .option('--quant-threshold <x>', 'with --quantize: largest accepted bound on the relative error of the merged weight', parseNumber, 0.01)
    .requiredOption('--out <file>', 'where to write the plan (stageml.plan v1 JSON)')
    .option('--json', 'print a JSON summary instead of the table')
    .option('--svg <file>', 'also write an SVG of expected cost against budget (the Pareto curve, and the popularity rule)')
    .option('--sweep <n>', 'budgets in the SVG sweep', parsePositiveInt, 24)
    .action(async (opts: PlanOptions) => {
      const { planner, gate } = await loadPlanner(opts);
      const t = opts.traffic === undefined ? undefined : parseTraffic(await readText(opts.traffic, 'traffic'));
      const outcome = planner.plan(opts.budget, t);
      if (outcome.kind === 'infeasible') {
        if (opts.json === true)
          io.out(
            JSON.stringify({
              kind: 'infeasible',
              budgetBytes: opts.budget,
              minMemoryBytes: outcome.minMemory,
            }),
          );
        throw new PlanError(
          PlanCode.INFEASIBLE,
          `no plan fits ${String(opts.budget)} bytes: the least memory any plan needs is ${String(outcome.minMemory)} bytes (${formatBytes(outcome.minMemory)})`,
          {
            hint: opts.fallback ? 'raise --budget' : 'raise --budget, or allow the generic path (drop --no-fallback)',
          },
        );
      }
      const { plan } = outcome;
      validatePlan(plan, planner);
      await writeText(opts.out, planToJson(plan), 'plan');
      const popular = popularityPlan(planner, opts.budget, t);
      const rows = explainPlan(planner, plan);
      const counts = Object.fromEntries(PLAN_KINDS.map((k) => [k, plan.units.filter((u) => u.kind === k).length]));
      if (opts.svg !== undefined)
        await writeText(
          opts.svg,
          paretoSvg(paretoSweep(planner, t, opts.sweep), {
            mark: opts.budget,
            title: `Expected cost against budget: ${plan.model ?? 'model'}`,
          }),
          'SVG',
        );
      if (opts.json === true) {
        io.out(
          JSON.stringify({
            kind: 'ok',
            out: opts.out,
            budgetBytes: plan.budgetBytes,
            memoryBytes: plan.memoryBytes,
            expectedSeconds: plan.expectedSeconds,
            popularitySeconds: popular.kind === 'ok' ? popular.cost : null,
            units: plan.units.length,
            kinds: counts,
            costModel: plan.costModel,
            ...(gate === undefined ? {} : { quantization: { spec: opts.quantize, threshold: opts.quantThreshold, groups: gate } }),
            rows,
          }),
        );
        return;
      }
      for (const line of formatExplanation(rows)) io.out(line);
      io.out('');
      io.out(`cost model: ${plan.costModel}; executor ${plan.executor}; batch ${String(plan.batch)} × seq ${String(plan.seq)}, ${plan.dtype}`);
      io.out(
        `budget ${formatBytes(plan.budgetBytes)} (${plan.budgetCovers}), charged ${formatBytes(plan.memoryBytes)}; ${String(plan.units.length)} units: ${PLAN_KINDS.map((k) => `${k} ${String(counts[k])}`).join(', ')}`,
      );
      const vs =
        popular.kind === 'ok'
          ? `; popularity-first rule ${formatMicros(popular.cost)} (${(popular.cost / Math.max(plan.expectedSeconds, Number.MIN_VALUE)).toFixed(3)}× ours)`
          : '; popularity-first rule: no plan fits';
      io.out(`expected ${formatMicros(plan.expectedSeconds)} per request (optimal)${vs}`);
      if (gate !== undefined) {
        const worst = gate.reduce((a, g) => Math.max(a, g.bound), 0);
        io.out(
          `quantization gate ${opts.quantize ?? ''} ≤ ${String(opts.quantThreshold)}: materialize rejected for ${String(gate.filter((g) => !g.accepted).length)} of ${String(gate.length)} groups (largest bound ${worst.toPrecision(3)})`,
        );
      }
      io.out(`wrote ${opts.out}${opts.svg === undefined ? '' : ` and ${opts.svg}`}`);
    });
}
