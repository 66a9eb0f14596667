import { type Graph, type HostTensor, StageError, dtypeBytes, errorMessage, exactIn, graphParams, roundFloat32InPlace, rounderFor } from '@stageml/ir';
import { type PrefixCache, prefixCacheOf } from './prefix-cache.js';
import { type LlamaConfig, type TextTokenizer, loadTokenizer, readLlamaConfig, readParam } from '@stageml/models';
import { type CacheStore, type Executor, type FileTensorRef, type PreparedGraph, type TorchDeviceTensors, interpreterExecutor, quantizeLinears } from '@stageml/runtime';
import { type Checkpoint, openCheckpoint } from '@stageml/safetensors';
import { type Plan, checkPlan, validatePlanDocument } from '@stageml/planner';
import { ENGINE_ADAPTER_DTYPES, ENGINE_DTYPES, type EngineAdapterDType, type EngineDType, castEngineGraph, tensorBytes } from './dtype.js';
import { EngineCode, EngineError } from './errors.js';
import { engineGraph, paramsToInputs } from './graph.js';
import { type EngineOptions, type ProgramForm, positiveInt } from './options.js';
import type { SlotModule } from './slot-linear.js';
import { SlotTables } from './slots.js';
import { checkInt8Dtype, checkInt8Factors } from './factor-quant.js';
import { type StagedPrograms, foldProgram, isWeightParam, stageEnginePrograms, stageProgram } from './stage-program.js';

/**
 * Program preparation for `Engine.load`: checks the options, reads the config and the checkpoint,
 * stages the engine's programs (`stageEnginePrograms`), prepares them on the executor with the
 * base weights (inputs, parameters or quantized copies) and allocates the slot tables. What it
 * returns is everything the engine's parts are built from; nothing here runs a step.
 */

/** What `loadEngine` resolved and prepared: the inputs of the engine's parts. */
export interface EngineParts {
  readonly executor: Executor;
  readonly programs: Partial<Record<ProgramForm, PreparedGraph>>;
  /**
   * Where `programs`' slot forms were built without the output tables (`slotLinear`'s
   * `outTables: false`, weights as inputs): prepares the same forms with them, for steps with a
   * row on a slot that holds DoRA scales or LoRA biases (`ProgramRunner`). Undefined: `programs`
   * have them.
   */
  readonly outPrograms?: () => Promise<Partial<Record<ProgramForm, PreparedGraph>>>;
  readonly tables: SlotTables;
  readonly shapes: Map<string, readonly number[]>;
  readonly weightBytes: number;
  /** The part of `weightBytes` the executor read and holds on its device only (`deviceWeights`). */
  readonly deviceWeightBytes: number;
  /** Whether the host holds the weights' values (false with `deviceWeights`: lanes cannot be built). */
  readonly hostWeights: boolean;
  readonly maxCpuLoras: number;
  readonly prefillChunk: number;
  readonly weightInputs: Readonly<Record<string, HostTensor>>;
  /** Whether every base weight is an input of the slot programs (f32 `weights: 'inputs'`): lanes, merges and scoring need it. */
  readonly allWeightInputs: boolean;
  /** Whether the base program reads the weights as inputs (false: it holds its own, `packBase`). */
  readonly baseTakesWeights: boolean;
  readonly memoryBudget: number | undefined;
  readonly replanEvery: number;
  readonly fixedPlan: Plan | undefined;
  readonly dtype: EngineDType;
  readonly adapterDtype: EngineAdapterDType;
  /** The executor's caches when sequences' KV lives there (`EngineOptions.residentKv`). */
  readonly caches: CacheStore | undefined;
  readonly hostKvCopy: boolean;
  readonly recycleOutputs: boolean;
  readonly executorPicks: boolean;
  readonly mergeWaste: number;
  readonly staging: StagedPrograms;
  /** The prefix cache (`EngineOptions.prefixCaching`), or undefined where it is off. */
  readonly prefix: PrefixCache | undefined;
}

/** A loaded model: its config, its tokenizer (when the directory has one) and the engine's parts. */
export interface LoadedEngine {
  readonly config: LlamaConfig;
  readonly tokenizer: TextTokenizer | undefined;
  readonly parts: EngineParts;
}

/** The options `loadEngine` checks before it reads anything, resolved to their defaults. */
interface Settings {
  readonly maxLoras: number;
  readonly rank: number;
  readonly onDevice: TorchDeviceTensors | undefined;
  readonly maxCpuLoras: number;
  readonly prefillChunk: number;
  readonly replanEvery: number;
  readonly mergeWaste: number;
  readonly memoryBudget: number | undefined;
  readonly fixedPlan: Plan | undefined;
  readonly wantDtype: EngineDType | 'checkpoint';
  readonly adapterDtype: EngineAdapterDType;
}

/** `opts` checked (`ENGINE_BAD_OPTIONS`) and resolved, before the model directory is read. */
function settingsOf(opts: EngineOptions): Settings {
  const maxLoras = positiveInt('maxLoras', opts.maxLoras, 16);
  const rank = positiveInt('maxLoraRank', opts.maxLoraRank, 64);
  const deviceStore = deviceTensorsOf(opts.executor ?? interpreterExecutor);
  const hostNeeds = opts.weights === 'program' ? "weights: 'program'" : opts.quantize !== undefined ? 'quantize' : opts.packBase === true ? 'packBase' : opts.memoryBudget !== undefined ? 'memoryBudget' : opts.plan !== undefined ? 'a plan' : undefined;
  if (opts.deviceWeights !== undefined && typeof opts.deviceWeights !== 'boolean') throw new EngineError(EngineCode.BAD_OPTIONS, `deviceWeights must be true or false, got ${String(opts.deviceWeights)}`);
  if (opts.deviceWeights === true && deviceStore === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `deviceWeights needs an executor with device tensors (the torch executor); '${(opts.executor ?? interpreterExecutor).name}' has none`);
  if (opts.deviceWeights === true && hostNeeds !== undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `deviceWeights keeps the weights off the host; ${hostNeeds} needs their values there`);
  const onDevice = opts.deviceWeights ?? (deviceStore !== undefined && hostNeeds === undefined) ? deviceStore : undefined;
  const maxCpuLoras = positiveInt('maxCpuLoras', opts.maxCpuLoras, onDevice === undefined ? maxLoras : 1);
  const prefillChunk = positiveInt('prefillChunk', opts.prefillChunk, 32);
  const replanEvery = positiveInt('replanEvery', opts.replanEvery, 512);
  const mergeWaste = opts.stepMergeWaste ?? 0.25;
  if (!(typeof mergeWaste === 'number' && Number.isFinite(mergeWaste) && mergeWaste >= 0)) throw new EngineError(EngineCode.BAD_OPTIONS, `stepMergeWaste must be a finite number ≥ 0, got ${String(opts.stepMergeWaste)}`);
  const memoryBudget = opts.memoryBudget;
  if (memoryBudget !== undefined && !(Number.isFinite(memoryBudget) && memoryBudget >= 0)) throw new EngineError(EngineCode.BAD_OPTIONS, `memoryBudget must be a number of bytes ≥ 0, got ${String(memoryBudget)}`);
  if (memoryBudget !== undefined && (opts.weights === 'program' || opts.quantize !== undefined)) throw new EngineError(EngineCode.BAD_OPTIONS, "memoryBudget (plans with merged copies) needs weights: 'inputs' (and no quantize)");
  let fixedPlan: Plan | undefined;
  if (opts.plan !== undefined) {
    if (memoryBudget !== undefined) throw new EngineError(EngineCode.BAD_OPTIONS, 'give a memoryBudget to plan under or a fixed plan, not both');
    if (opts.weights === 'program' || opts.quantize !== undefined) throw new EngineError(EngineCode.BAD_OPTIONS, "a plan (merged copies) needs weights: 'inputs' (and no quantize)");
    fixedPlan = checkPlan(opts.plan);
    validatePlanDocument(fixedPlan);
  }
  if (opts.quantize !== undefined && opts.weights === 'inputs') throw new EngineError(EngineCode.BAD_OPTIONS, "quantize packs the weights into the programs: it needs weights: 'program'");
  const wantDtype = opts.dtype ?? 'f32';
  if (!(ENGINE_DTYPES as readonly string[]).includes(wantDtype) && wantDtype !== 'checkpoint') throw new EngineError(EngineCode.BAD_OPTIONS, `dtype must be one of ${ENGINE_DTYPES.join(', ')} or checkpoint, got '${wantDtype as string}'`);
  const adapterDtype = opts.adapterDtype ?? 'f32';
  if (!(ENGINE_ADAPTER_DTYPES as readonly string[]).includes(adapterDtype)) throw new EngineError(EngineCode.BAD_OPTIONS, `adapterDtype must be one of ${ENGINE_ADAPTER_DTYPES.join(', ')}, got '${adapterDtype as string}'`);
  return { maxLoras, rank, onDevice, maxCpuLoras, prefillChunk, replanEvery, mergeWaste, memoryBudget, fixedPlan, wantDtype, adapterDtype };
}

/** The weights `loadWeights` read: host tensors (or device handles) by name, and what they cost. */
interface ReadWeights {
  readonly dtype: EngineDType;
  readonly weights: Map<string, HostTensor>;
  readonly shapes: Map<string, readonly number[]>;
  readonly weightBytes: number;
  readonly deviceWeightBytes: number;
  readonly staging: StagedPrograms;
}

/**
 * Reads the checkpoint's weights for `graphs32` (host copies in the compute dtype, or handles the
 * executor's device read itself) and stages the programs; weights no residual reads are dropped.
 */
async function loadWeights(dir: string, s: Settings, executor: Executor, graphs32: readonly Graph[], forms: readonly ProgramForm[], separateHead: boolean, quantized: boolean): Promise<ReadWeights> {
  const { onDevice, wantDtype, adapterDtype } = s;
  const graph = graphs32[0]!;
  const ckpt = await openCheckpoint(dir);
  const weights = new Map<string, HostTensor>();
  const shapes = new Map<string, readonly number[]>();
  let weightBytes = 0;
  let deviceWeightBytes = 0;
  try {
    const dtype = wantDtype === 'checkpoint' ? storedDType(ckpt, dir) : wantDtype;
    if (dtype !== 'f32') {
      const runs = executor.capabilities.dtypes ?? ['f32'];
      if (!runs.includes(dtype)) throw new EngineError(EngineCode.UNSUPPORTED_DTYPE, `the executor '${executor.name}' cannot run ${dtype} programs (it runs ${runs.join(', ')})`, { hint: 'use --executor torch (or interpreter), or --dtype f32' });
      if (quantized) throw new EngineError(EngineCode.BAD_OPTIONS, `quantize packs f32 weights: it needs dtype f32, not ${dtype}`);
    }
    const refs: { name: string; ref: FileTensorRef }[] = [];
    for (const p of graphParams(graph)) {
      if (separateHead && p.name === 'lm_head.weight') continue;
      const want = graph.values[p.results[0]!]!.type.shape as number[];
      const info = onDevice !== undefined && ckpt.has(p.name) ? ckpt.info(p.name) : undefined;
      if (info !== undefined && SAFETENSORS_FLOATS[info.dtype] !== undefined && info.shape.length === want.length && info.shape.every((d, i) => d === want[i])) {
        // Read by the worker itself, from the file: no host copy.
        refs.push({ name: p.name, ref: { file: ckpt.fileOf(p.name), tensor: p.name, dtype, shape: want } });
        shapes.set(p.name, want);
        continue;
      }
      const t = await readParam(ckpt, dir, p.name, want);
      // A tensor stored in the compute dtype (a bf16 checkpoint served in bf16) is exact: rounding
      // it would be the identity, so it is skipped; anything else rounds in place.
      const stored = ckpt.has(p.name) ? SAFETENSORS_FLOATS[ckpt.info(p.name).dtype] : undefined;
      const held = dtype === 'f32' ? t : stored !== undefined && exactIn(stored, dtype) ? { dtype, shape: t.shape, data: t.data } : roundInPlace(t, dtype);
      weights.set(p.name, held);
      shapes.set(p.name, t.shape);
      weightBytes += tensorBytes(held);
    }
    if (refs.length > 0) {
      try {
        const handles = await onDevice!.load(refs.map((r) => r.ref));
        refs.forEach((r, i) => weights.set(r.name, handles[i]!));
      } catch (e) {
        if (e instanceof StageError) throw new EngineError(EngineCode.RUN_FAILED, `the executor could not read the weights of '${dir}' itself: ${errorMessage(e)}`, { cause: e });
        throw e;
      }
      deviceWeightBytes = refs.reduce((a, r) => a + r.ref.shape.reduce((x, y) => x * y, 1) * dtypeBytes(dtype), 0);
      weightBytes += deviceWeightBytes;
    }
    if (separateHead) {
      weights.set('lm_head.weight', weights.get('model.embed_tokens.weight')!);
      shapes.set('lm_head.weight', shapes.get('model.embed_tokens.weight')!);
    }
    // The programs are the staging pipeline's residuals (stage-program.ts): weights folding reads
    // come from the host copy, or from the checkpoint when the weights live on the device.
    const onHost = new Set(refs.map((r) => r.name));
    const cast = dtype;
    const staging = await stageEnginePrograms(cast === 'f32' ? graphs32 : graphs32.map((g) => castProgram(g, cast, adapterDtype)), forms, async (n) => {
      if (!onHost.has(n)) return weights.get(n)!;
      const t = await readParam(ckpt, dir, n, shapes.get(n) as number[]);
      return cast === 'f32' ? t : roundInPlace(t, cast);
    });
    // Weights read only by folded values are not inputs of any residual.
    for (const [n, t] of [...weights]) {
      if (staging.weightNames.has(n)) continue;
      weights.delete(n);
      if (!onHost.has(n)) weightBytes -= tensorBytes(t);
    }
    return { dtype, weights, shapes, weightBytes, deviceWeightBytes, staging };
  } finally {
    await ckpt.close();
  }
}

/**
 * Loads `config.json`, the checkpoint and the tokenizer from `dir`, stages the engine's programs
 * and prepares each once on the executor with the base weights (missing or wrongly shaped tensors
 * are `MODEL_BAD_WEIGHT` naming file and key); bad options are `ENGINE_BAD_OPTIONS`.
 */
export async function loadEngine(dir: string, opts: EngineOptions): Promise<LoadedEngine> {
  const s = settingsOf(opts);
  const { maxLoras, rank, onDevice } = s;
  const config = await readLlamaConfig(dir);
  // The tokenizer is read and built while the weights load (on a torch executor the worker reads
  // them: Node waits); a failure is reported where it is awaited, at the end.
  const tokenizer = loadTokenizer(dir);
  tokenizer.catch(() => undefined);
  const executor = opts.executor ?? interpreterExecutor;
  if (opts.residentKv === true && executor.caches === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `residentKv needs an executor that holds caches (the torch executor); '${executor.name}' does not`);
  if (opts.residentKv === true && config.slidingWindow !== undefined) throw new EngineError(EngineCode.BAD_OPTIONS, 'residentKv: a sliding-window model builds its per-query masks on the host (give residentKv false or leave it out)');
  const caches = opts.residentKv === false || config.slidingWindow !== undefined ? undefined : executor.caches;
  if (opts.hostKvCopy !== undefined && typeof opts.hostKvCopy !== 'boolean') throw new EngineError(EngineCode.BAD_OPTIONS, `hostKvCopy must be true or false, got ${String(opts.hostKvCopy)}`);
  if (opts.executorPicks !== undefined && typeof opts.executorPicks !== 'boolean') throw new EngineError(EngineCode.BAD_OPTIONS, `executorPicks must be true or false, got ${String(opts.executorPicks)}`);
  const modules: SlotModule[] = [];
  if (opts.slotForm !== undefined && !['auto', 'gathered', 'grouped'].includes(opts.slotForm)) throw new EngineError(EngineCode.BAD_OPTIONS, `slotForm must be 'auto', 'gathered' or 'grouped' ('single' alone cannot serve two adapters in a batch; 'auto' includes it), got '${opts.slotForm as string}'`);
  const int8Factors = checkInt8Factors(s.adapterDtype, s.wantDtype, config.moe !== undefined, onDevice !== undefined);
  // NOTE: int8 factors run the gathered form alone by default: its kernel (cpu-native's LORA_Q)
  // reads the codes in place for any mix, one adapter included, where the grouped and single
  // forms would dequantize their slots' rows through the op's decomposition every step.
  const autoForms: ProgramForm[] = int8Factors ? ['gathered'] : ['gathered', 'grouped', 'single'];
  const slotForms: ProgramForm[] = opts.slotForm === undefined || opts.slotForm === 'auto' ? autoForms : [opts.slotForm];
  // Base-only batches run a program without slot tables (the slot path costs a base row as much
  // as an adapter row) — except where each program holds its own f32 copy of the weights.
  if (opts.packBase !== undefined && typeof opts.packBase !== 'boolean') throw new EngineError(EngineCode.BAD_OPTIONS, `packBase must be true or false, got ${String(opts.packBase)}`);
  const packBase = opts.packBase === true;
  const withBase = packBase || opts.quantize !== undefined || (opts.weights ?? 'inputs') === 'inputs';
  const forms: ProgramForm[] = withBase ? [...slotForms, 'base'] : slotForms;
  // A tied model whose weights are inputs reads its head as `lm_head.weight` (the embedding's
  // tensor, not a copy), so a lane can replace the head alone.
  const separateHead = config.tieWordEmbeddings && opts.quantize === undefined && (opts.weights ?? 'inputs') === 'inputs';
  const asInputs = opts.quantize === undefined && (opts.weights ?? 'inputs') === 'inputs';
  // Programs whose weights are inputs are built without the DoRA/bias output tables (a plain LoRA
  // projection is then its `loraBank` op alone); the forms with them are prepared when a slot first
  // needs them (`outPrograms`). Programs that hold their own weights keep them from the start.
  const lean = asInputs && !packBase;
  // NOTE: the slot modules are filled in by building the first program (`engineGraph`).
  const graphs32 = forms.map((f, i) => engineGraph(config, f, maxLoras + 1, rank, i === 0 ? modules : [], { separateHead, outTables: !lean, int8Factors }));
  const read = await loadWeights(dir, s, executor, graphs32, forms, separateHead, opts.quantize !== undefined);
  const { dtype, weights, staging } = read;
  checkInt8Dtype(int8Factors, dtype);
  let weightBytes = read.weightBytes;
  const residuals = staging.staged.map((st) => st.residual);
  const programs: Partial<Record<ProgramForm, PreparedGraph>> = {};
  // One cache for every program, so each weight is packed once and the packed copy is shared.
  const quantize = opts.quantize === undefined ? undefined : 'bits' in opts.quantize ? { spec: opts.quantize, cache: new WeakMap() } : { ...opts.quantize, cache: opts.quantize.cache ?? new WeakMap() };
  const oneCopy = weightBytes;
  let copies = 0;
  const shared = new Map<string, HostTensor>();
  for (const [i, f] of forms.entries()) {
    // The base program takes the weights as parameters (its own, pre-packed copy) with packBase.
    const st = staging.staged[i]!;
    const folded = staging.folded[i]!;
    if (asInputs && !(packBase && f === 'base')) programs[f] = await executor.prepare(paramsToInputs(residuals[i]!, (n) => isWeightParam(st, n)), { get: (n) => folded[n] });
    else if (quantize === undefined) {
      programs[f] = await executor.prepare(residuals[i]!, { get: (n) => weights.get(n) ?? folded[n] });
      copies++;
    }
    else {
      const q = quantizeLinears(residuals[i]!, { ...Object.fromEntries(weights), ...folded }, quantize);
      if (i === 0) weightBytes = Object.values(q.constants).reduce((a, t) => a + t.data.byteLength, 0);
      // The f32 tensors left unquantized (embeddings, norms) are one host copy every program
      // reads as inputs, not a copy per program; the packed linears are the programs' own.
      for (const [n, t] of Object.entries(q.constants)) if (weights.get(n) === t) shared.set(n, t);
      programs[f] = await executor.prepare(paramsToInputs(q.graph, (n) => shared.has(n)), { get: (n) => q.constants[n] });
    }
  }
  const weightInputs = asInputs ? Object.fromEntries(weights) : Object.fromEntries(shared);
  // Bytes of every copy: the shared host copy (inputs) and each program's own.
  if (quantize === undefined) weightBytes = oneCopy * (copies + (asInputs ? 1 : 0));
  const baseTakesWeights = quantize !== undefined || (asInputs && !packBase);
  const factorDtype = s.adapterDtype === 'int8' ? 'i8' : dtype !== 'f32' && s.adapterDtype === 'same' ? dtype : 'f32';
  const tables = onDevice === undefined ? new SlotTables(maxLoras + 1, rank, modules, factorDtype) : await SlotTables.onDevice(onDevice, maxLoras + 1, rank, modules, factorDtype);
  const outPrograms = lean ? async (): Promise<Partial<Record<ProgramForm, PreparedGraph>>> => {
    const out: Partial<Record<ProgramForm, PreparedGraph>> = {};
    try {
      for (const f of slotForms) {
        const built = engineGraph(config, f, maxLoras + 1, rank, [], { separateHead, outTables: true, int8Factors });
        const st = stageProgram(dtype === 'f32' ? built : castProgram(built, dtype, s.adapterDtype), f);
        const folded = foldProgram(st, { get: (n) => staging.foldSources.get(n) });
        out[f] = await executor.prepare(paramsToInputs(st.residual, (n) => isWeightParam(st, n)), { get: (n) => folded[n] });
      }
    } catch (e) {
      for (const p of Object.values(out)) p.dispose();
      throw e;
    }
    return out;
  } : undefined;
  const parts: EngineParts = { executor, programs, ...(outPrograms === undefined ? {} : { outPrograms }), tables, shapes: read.shapes, weightBytes, deviceWeightBytes: read.deviceWeightBytes, hostWeights: onDevice === undefined, maxCpuLoras: s.maxCpuLoras, prefillChunk: s.prefillChunk, weightInputs, allWeightInputs: asInputs, baseTakesWeights, memoryBudget: s.memoryBudget, replanEvery: s.replanEvery, fixedPlan: s.fixedPlan, dtype, adapterDtype: s.adapterDtype, caches, hostKvCopy: opts.hostKvCopy === true, recycleOutputs: opts.recycleOutputs === true, executorPicks: opts.executorPicks ?? executor.capabilities.devicePicks === true, mergeWaste: s.mergeWaste, staging, prefix: prefixCacheOf(opts.prefixCaching) };
  return { config, tokenizer: await tokenizer, parts };
}

/**
 * An engine program (built in f32) at a bf16/f16 compute dtype: the slot tables are its factor
 * inputs, `attention_mask` its mask, and the KV cache (`past_*` in, `new_*` out) is of the
 * compute dtype (exact: every cached value was computed in it), so no executor widens it.
 */
export function castProgram(g: Graph, dtype: 'bf16' | 'f16', adapterDtype: EngineAdapterDType): Graph {
  return castEngineGraph(g, dtype, { adapterDtype, isFactorInput: (n) => n.startsWith('slots.'), maskInputs: new Set(['attention_mask']), dtypeInputs: (n) => n.startsWith('past_'), dtypeOutputs: (n) => n.startsWith('new_') });
}

/** `t` rounded to `dtype` in place (`t` was just read and is not shared), relabelled. */
function roundInPlace(t: HostTensor, dtype: 'bf16' | 'f16'): HostTensor {
  const d = t.data;
  if (d instanceof Float32Array) roundFloat32InPlace(d, dtype);
  else {
    const round = rounderFor(dtype);
    for (let i = 0; i < d.length; i++) d[i] = round(d[i]!);
  }
  return { dtype, shape: t.shape, data: d };
}

const SAFETENSORS_FLOATS: Readonly<Record<string, EngineDType>> = { F32: 'f32', BF16: 'bf16', F16: 'f16' };

/** The float dtype a checkpoint stores (of most of its float elements); another one is `ENGINE_BAD_OPTIONS`. */
function storedDType(ckpt: Checkpoint, dir: string): EngineDType {
  const top = ckpt.storedFloatDType();
  const dt = top === undefined ? undefined : SAFETENSORS_FLOATS[top];
  if (dt === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `the checkpoint in '${dir}' stores ${top ?? 'no float tensors'}; dtype checkpoint needs F32, BF16 or F16`, { hint: 'give dtype f32, bf16 or f16' });
  return dt;
}

/** The executor's device tensors (the torch executor's `device`), or undefined when it has none. */
function deviceTensorsOf(executor: Executor): TorchDeviceTensors | undefined {
  const d = (executor as { readonly device?: Partial<TorchDeviceTensors> }).device;
  return typeof d === 'object' && typeof d.load === 'function' && typeof d.zeros === 'function' && typeof d.write === 'function' ? (d as TorchDeviceTensors) : undefined;
}
