import { readFile, writeFile } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import type { Command } from 'commander';
import { type Graph, type HostTensor, errorMessage, graphToJson } from '@stageml/ir';
import { foldServingOps } from '@stageml/kernel-patterns';
import { parseLlamaConfig, stagedModelGraph } from '@stageml/models';
import { findAdapterDirs, loadLoraAdapter } from '@stageml/peft';
import { type Plan, PlanCode, PlanError, Planner, formatBytes, llamaWorkload, planToJson, validatePlan } from '@stageml/planner';
import { defaultRules, loraServingSpec, rewriteGreedy } from '@stageml/rewrite';
import { type BundleManifest, type SpecializeResult, quantizeStaged, specialize, writeBundle } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { parsePositiveInt } from '../args.js';
import { parseBytes } from './plan.js';
import { CliCode, CliError } from '../errors.js';
import { loadGraphFile } from '../inspect.js';
import type { CliIo } from '../io.js';
import { inPhase } from '../progress.js';
import { type StageAdapterDType, type StageDType, castResidual, checkpointDType, parseStageAdapterDType, parseStageDType } from '../stage-dtype.js';
import { parseMaxError, quantizeOptions } from '../quantize.js';

interface StageOptions {
  model?: string;
  adapter?: string;
  layers?: number;
  graph?: string;
  annotations?: string;
  weights?: string;
  cutoff: string;
  out: string;
  force?: boolean;
  json?: boolean;
  dtype: StageDType;
  adapterDtype: StageAdapterDType;
  quantize?: string;
  maxError?: number;
  adapters?: string;
  budget?: number;
}

/**
 * Resolves `--dtype` (`checkpoint`: the model's stored float dtype; bare graphs: f32) and converts
 * the residual, or with `--quantize` packs its linear weights as int8/int4 constants (LoRA factors
 * stay f32; a bf16/f16 checkpoint is quantized from its stored values). Quantized residuals run
 * with f32 activations, so `--quantize` with `--dtype bf16|f16` is a usage error.
 */
async function withDType(opts: StageOptions, result: SpecializeResult, source: Graph): Promise<SpecializeResult> {
  const q = quantizeOptions(opts.quantize, opts.maxError);
  if (q !== undefined) {
    if (opts.dtype === 'bf16' || opts.dtype === 'f16') throw new CliError(CliCode.USAGE, `--quantize runs with f32 activations: it cannot be combined with --dtype ${opts.dtype}`);
    return withServingOps(quantizeStaged(result, q));
  }
  let dt = opts.dtype;
  if (dt === 'checkpoint') dt = opts.model === undefined ? 'f32' : await checkpointDType(opts.model);
  return withServingOps(dt === 'f32' ? result : castResidual(result, dt, source, { adapterDtype: opts.adapterDtype }));
}

/**
 * The residual with its primitive chains folded into the IR's serving ops (`foldServingOps`: the
 * residual LoRA layer → `loraLinear`), which executors lower from their tables or expand by
 * decomposition — the same computation, so a bundle's numerics do not change.
 */
function withServingOps(result: SpecializeResult): SpecializeResult {
  return { ...result, residual: foldServingOps(result.residual).graph };
}

/** The annotation file of a bare graph: stages of inputs and parameters on `static < dynamic`. */
interface AnnotationFile {
  inputs?: Record<string, string>;
  params?: Record<string, string>;
  defaultInput?: string;
  defaultParam?: string;
}

const ANNOTATION_KEYS = new Set(['inputs', 'params', 'defaultInput', 'defaultParam']);

async function readAnnotations(path: string | undefined): Promise<AnnotationFile> {
  if (path === undefined) return {};
  let raw: unknown;
  try {
    raw = JSON.parse(await readFile(path, 'utf8'));
  } catch (e) {
    throw new CliError(CliCode.IO, `cannot read annotations '${path}': ${errorMessage(e)}`, { cause: e });
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new CliError(CliCode.USAGE, `annotations '${path}' must be a JSON object`);
  for (const [k, v] of Object.entries(raw as Record<string, unknown>)) {
    if (!ANNOTATION_KEYS.has(k)) {
      throw new CliError(CliCode.USAGE, `annotations '${path}': unknown key '${k}'`, { hint: 'a bare graph stages over static < dynamic: use inputs, params, defaultInput, defaultParam' });
    }
    const ok = k.startsWith('default') ? typeof v === 'string' : typeof v === 'object' && v !== null && Object.values(v as Record<string, unknown>).every((s) => typeof s === 'string');
    if (!ok) throw new CliError(CliCode.USAGE, `annotations '${path}': '${k}' must be ${k.startsWith('default') ? 'a stage name' : 'an object of stage names'}`);
  }
  return raw;
}

async function readWeights(path: string | undefined): Promise<Map<string, HostTensor>> {
  const values = new Map<string, HostTensor>();
  if (path === undefined) return values;
  let file: SafetensorsFile;
  try {
    file = await SafetensorsFile.open(path);
  } catch (e) {
    throw new CliError(CliCode.IO, `cannot open weights '${path}': ${errorMessage(e)}`, { cause: e });
  }
  try {
    for (const name of file.names()) values.set(name, await file.readTensor(name));
  } finally {
    await file.close();
  }
  return values;
}

async function stageGraphFile(opts: StageOptions, graphPath: string): Promise<{ graph: Graph; residual: Graph; manifest: BundleManifest }> {
  const graph = loadGraphFile(graphPath);
  const annotations = await readAnnotations(opts.annotations);
  const values = await readWeights(opts.weights);
  const result = await withDType(opts, specialize(graph, { annotations, cutoff: opts.cutoff, values: { get: (n) => values.get(n) } }), graph);
  return { graph, residual: result.residual, manifest: await writeBundle(opts.out, result, { overwrite: opts.force === true }) };
}

/** Format and version of a bundle's `rewrite.json` (docs/bundle.md). */
export const REWRITE_LOG_FORMAT = 'stageml.rewrite';
/** The `rewrite.json` version this CLI writes. */
export const REWRITE_LOG_VERSION = 1;

/**
 * The serving plan of a bundle (`plan.json`, `stageml.plan` v1): what the engine can apply, per
 * (adapter, layer, projection) `materialize` (a merged copy, charged to `budget`) or `residual`
 * (the adapter's slot), for the adapters `dirs`, validated with the planner's own validator.
 */
async function servingPlan(model: string, dirs: readonly { name: string; dir: string }[], budget: number): Promise<Plan | undefined> {
  const adapters = (await Promise.all(dirs.map((a) => loadLoraAdapter(a.dir, { name: a.name })))).filter((a) => a.modules.size > 0);
  if (adapters.length === 0) return undefined;
  let cfgText: string;
  try {
    cfgText = await readFile(join(model, 'config.json'), 'utf8');
  } catch (e) {
    throw new CliError(CliCode.IO, `cannot read ${join(model, 'config.json')}: ${(e as Error).message}`, { cause: e });
  }
  const config = parseLlamaConfig(cfgText, join(model, 'config.json'));
  // The engine serves a unit merged (materialize) or from its slot (residual): nothing else.
  const workload = llamaWorkload(config, adapters, { batch: 1, seq: 1, model: basename(resolve(model)), allowed: () => ['materialize', 'residual'] });
  const planner = new Planner(workload, { executor: { name: 'engine', supportsOp: () => true, lateBinding: true }, budgetCovers: 'materialized' });
  const outcome = planner.plan(budget);
  if (outcome.kind === 'infeasible') throw new PlanError(PlanCode.INFEASIBLE, `no plan fits ${String(budget)} bytes: the least memory any plan needs is ${String(outcome.minMemory)} bytes (${formatBytes(outcome.minMemory)})`, { hint: 'raise --budget' });
  validatePlan(outcome.plan, planner);
  return outcome.plan;
}

async function stageModel(opts: StageOptions, dir: string, io: CliIo): Promise<{ graph: Graph; residual: Graph; manifest: BundleManifest }> {
  const m = await inPhase(io, `loading ${dir}`, () =>
    stagedModelGraph(dir, {
      ...(opts.adapter === undefined ? {} : { adapter: opts.adapter }),
      ...(opts.layers === undefined ? {} : { numLayers: opts.layers }),
    }),
  );
  // The rewrite library over the serving lattice, as `stageml inspect --rewrite` runs it: its log goes into the bundle.
  const rewrite = rewriteGreedy(m.graph, [defaultRules], { context: { lattice: 'serving', annotations: loraServingSpec(m.graph), cutoff: opts.cutoff, sizes: { batch: 1, seq: 1 } } });
  const adapterDirs = opts.adapters !== undefined ? await findAdapterDirs(opts.adapters) : opts.adapter !== undefined ? await findAdapterDirs(opts.adapter) : [];
  const plan = await servingPlan(dir, adapterDirs, opts.budget ?? 0);
  const result = await inPhase(io, opts.quantize === undefined ? 'specializing' : 'specializing and quantizing', () => withDType(opts, specialize(m.graph, { lattice: m.lattice, annotations: m.annotations, cutoff: opts.cutoff, values: { get: (n) => m.values.get(n) } }), m.graph));
  const written = await inPhase(io, `writing ${opts.out}`, () => writeBundle(opts.out, result, { overwrite: opts.force === true, ...(plan === undefined ? {} : { plan: JSON.parse(planToJson(plan)) as unknown }) }));
  // What `stageml serve --bundle` reads: the source model and adapters (absolute), and where the rewrite log is.
  const manifest = { ...written, rewrite: 'rewrite.json', source: { model: resolve(dir), adapters: Object.fromEntries(adapterDirs.map((a) => [a.name, resolve(a.dir)])) } };
  const log = { format: REWRITE_LOG_FORMAT, version: REWRITE_LOG_VERSION, graph: rewrite.graph.name, cutoff: opts.cutoff, sizes: { batch: 1, seq: 1 }, stop: rewrite.stop, iterations: rewrite.iterations, applied: rewrite.applied, estimate: rewrite.estimate, log: rewrite.log };
  try {
    await writeFile(join(opts.out, 'rewrite.json'), `${JSON.stringify(log, null, 2)}\n`);
    await writeFile(join(opts.out, 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  } catch (e) {
    throw new CliError(CliCode.IO, `cannot write ${opts.out}: ${(e as Error).message}`, { cause: e });
  }
  return { graph: m.graph, residual: result.residual, manifest };
}

/**
 * `stageml stage`: specialize a model (with an optional adapter, over the serving lattice
 * `base < adapter < tenant < request < routing < token`) or a bare graph (over `static < dynamic`)
 * at a cutoff stage, and write the residual bundle (manifest.json, residual.ir,
 * constants.safetensors, and residual.json, the IR's JSON form for Python hosts; for a model also
 * plan.json, the serving plan of its adapters under `--budget`, rewrite.json, the rewrite library's
 * log, and `source` in the manifest, the model and adapter directories `serve --bundle` loads). `--dtype bf16|f16|checkpoint` converts the residual to that compute
 * dtype (inputs and outputs stay f32; `gen cuda` needs bf16/f16, `gen triton` takes f32 too); `--adapter-dtype f32|same` says whether the LoRA term stays f32 as PEFT computes it (default) or is rounded to it.
 */
export function registerStage(program: Command, io: CliIo): void {
  program
    .command('stage')
    .description('specialize a model or graph at a stage and write the residual bundle')
    .option('--model <dir>', 'Hugging Face model directory (config.json, model.safetensors)')
    .option('--adapter <dir>', 'a PEFT adapter directory (its tensors are adapter-stage parameters)')
    .option('--layers <n>', 'keep only the first n decoder layers of the model', parsePositiveInt)
    .option('--graph <file>', 'a bare graph (.ir text or .json) instead of a model')
    .option('--annotations <file>', 'stages of the bare graph inputs and parameters (JSON: inputs, params, defaultInput, defaultParam)')
    .option('--weights <file>', 'values of the bare graph parameters (.safetensors)')
    .requiredOption('--cutoff <stage>', 'the last stage computed ahead of time (model: base, adapter, …; graph: static)')
    .requiredOption('--out <dir>', 'the bundle directory to write')
    .option('--dtype <dtype>', 'compute dtype of the residual: f32, bf16, f16, or checkpoint (the float dtype the checkpoint stores; for GPU targets: gen triton takes any of them, gen cuda needs bf16/f16); inputs and outputs stay f32', parseStageDType, 'f32')
    .option('--adapter-dtype <dtype>', 'with --dtype bf16|f16: LoRA factors and their term in f32 (f32, as PEFT computes them on a bf16/f16 base) or rounded to the compute dtype (same: the form gen triton|cuda and the fused GPU kernel take)', parseStageAdapterDType, 'f32')
    .option('--force', 'replace an existing bundle directory')
    .option('--json', 'print the manifest as JSON')
    .option('--quantize <spec>', 'weight-only quantization of the residual linear weights: int8, int4 (blocks of 32), int8:g128, int4:channel, …:asym, or auto (with --max-error)')
    .option('--max-error <e>', 'with --quantize auto: the largest relative weight error per projection (int4, else int8, else f32)', parseMaxError)
    .option('--adapters <dir>', 'the adapters the bundle serves (a PEFT adapter directory, or a directory of them; default: --adapter): planned into plan.json and loaded by `serve --bundle`')
    .option('--budget <bytes>', 'bytes plan.json may spend on merged weight copies (64MiB, 2GB; default 0: every adapter served from its slot)', parseBytes)
    .action(async (opts: StageOptions) => {
      quantizeOptions(opts.quantize, opts.maxError);
      if ((opts.model === undefined) === (opts.graph === undefined)) throw new CliError(CliCode.USAGE, 'give exactly one of --model DIR or --graph FILE');
      if (opts.graph !== undefined && (opts.adapter !== undefined || opts.layers !== undefined)) throw new CliError(CliCode.USAGE, '--adapter and --layers apply to --model only');
      if (opts.graph !== undefined && (opts.adapters !== undefined || opts.budget !== undefined)) throw new CliError(CliCode.USAGE, '--adapters and --budget apply to --model only');
      if (opts.model !== undefined && (opts.annotations !== undefined || opts.weights !== undefined)) throw new CliError(CliCode.USAGE, '--annotations and --weights apply to --graph only');
      const { graph, residual, manifest } = opts.model !== undefined ? await stageModel(opts, opts.model, io) : await stageGraphFile(opts, opts.graph!);
      // The residual's JSON form beside residual.ir, for hosts that load bundles without Node (stageml_torch.bundle).
      try {
        await writeFile(join(opts.out, 'residual.json'), JSON.stringify(graphToJson(residual)));
      } catch (e) {
        throw new CliError(CliCode.IO, `cannot write ${join(opts.out, 'residual.json')}: ${errorMessage(e)}`, { cause: e });
      }
      if (opts.json === true) {
        io.out(JSON.stringify(manifest, null, 2));
        return;
      }
      const r = manifest.report;
      io.out(`staged @${graph.name} at '${manifest.cutoff}' into ${opts.out}`);
      io.out(`  residual: ${String(r?.residualOps ?? 0)} ops (of ${String(r?.originalOps ?? 0)}), ${String(manifest.inputs.length)} inputs, ${String(manifest.params.length)} parameters`);
      io.out(`  constants: ${String(r?.constants ?? 0)} tensors, ${String(r?.constantBytes ?? 0)} bytes`);
      if (opts.quantize !== undefined) io.out(`  quantized (${opts.quantize}): ${String(manifest.params.filter((p) => p.name.endsWith('.qweight')).length)} linear weights`);
    });
}
