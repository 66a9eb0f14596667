import { cpus } from 'node:os';
import { GraphBuilder, hostTensor, errorMessage } from '@stageml/ir';
import type { Executor } from '@stageml/runtime';
import { PlanCode, PlanError } from './errors.js';

function show(v: unknown): string {
  return v === undefined ? 'nothing' : JSON.stringify(v);
}

/** `format` field of every calibration document. */
export const CALIBRATION_FORMAT = 'stageml.calibration';
/** The calibration document version this reader and writer speak. */
export const CALIBRATION_VERSION = 1;

/**
 * Shape classes with distinct GEMM efficiency: `vector` (m ≤ 8 rows: decode, bandwidth-bound),
 * `skinny` (an inner or output dim ≤ 128: LoRA shrink/expand), `large` (everything else).
 */
export type GemmShapeClass = 'vector' | 'skinny' | 'large';

/** The shape class of an [m, k] · [k, n] GEMM. */
export function gemmShapeClass(m: number, k: number, n: number): GemmShapeClass {
  if (m <= 8) return 'vector';
  return Math.min(k, n) <= 128 ? 'skinny' : 'large';
}

/** One measured GEMM: `linear(x [m, k], w [n, k])`, median wall time of one run. */
export interface GemmMeasurement {
  /** Shape class of (m, k, n). */
  readonly shapeClass: GemmShapeClass;
  /** Rows of x. */
  readonly m: number;
  /** Contraction dim. */
  readonly k: number;
  /** Output features. */
  readonly n: number;
  /** Median seconds of one run, dispatch included. */
  readonly seconds: number;
  /** 2·m·k·n / (seconds − dispatch): the arithmetic rate the executor sustains at this shape. */
  readonly flopsPerSecond: number;
}

/** Measurements of one executor on one machine (`stageml.calibration` v1). */
export interface Calibration {
  /** Always `stageml.calibration`. */
  readonly format: typeof CALIBRATION_FORMAT;
  /** Always 1. */
  readonly version: typeof CALIBRATION_VERSION;
  /** Executor measured (`interpreter`, `tfjs-wasm`, …). */
  readonly executor: string;
  /** Free-text machine description (CPU, platform, runtime). */
  readonly machine: string;
  /** ISO-8601 time of the measurement. */
  readonly date: string;
  /** GEMM rates by shape. */
  readonly gemm: readonly GemmMeasurement[];
  /** Fixed cost of dispatching one op, in microseconds. */
  readonly dispatchUs: number;
  /** Streaming rate of elementwise ops (operand + result bytes per second). */
  readonly bytesPerSecond: number;
}

const TOP_KEYS = ['format', 'version', 'executor', 'machine', 'date', 'gemm', 'dispatchUs', 'bytesPerSecond'];
const GEMM_KEYS = ['shapeClass', 'm', 'k', 'n', 'seconds', 'flopsPerSecond'];

function bad(path: string, msg: string): never {
  throw new PlanError(PlanCode.BAD_CALIBRATION, msg, { path });
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function positive(v: unknown, path: string, allowZero = false): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0 || (!allowZero && v === 0))
    bad(path, `must be a ${allowZero ? 'non-negative' : 'positive'} finite number, got ${show(v)}`);
  return v;
}

function str(v: unknown, path: string): string {
  if (typeof v !== 'string' || v.length === 0) bad(path, 'must be a non-empty string');
  return v;
}

function noExtra(v: Record<string, unknown>, keys: readonly string[], path: string): void {
  for (const k of Object.keys(v)) if (!keys.includes(k)) bad(`${path}.${k}`, `unknown field (allowed: ${keys.join(', ')})`);
}

/** Checks parsed JSON against `stageml.calibration` v1 and returns it typed; violations are `PLAN_BAD_CALIBRATION` naming the JSON path. */
export function checkCalibration(doc: unknown): Calibration {
  if (!isRecord(doc)) bad('$', 'a calibration must be a JSON object');
  if (doc['format'] !== CALIBRATION_FORMAT) bad('$.format', `expected '${CALIBRATION_FORMAT}', got ${show(doc['format'])}`);
  if (doc['version'] !== CALIBRATION_VERSION) bad('$.version', `unknown version ${show(doc['version'])} (this reader knows ${String(CALIBRATION_VERSION)})`);
  noExtra(doc, TOP_KEYS, '$');
  const gemm = doc['gemm'];
  if (!Array.isArray(gemm)) bad('$.gemm', 'must be an array');
  return {
    format: CALIBRATION_FORMAT,
    version: CALIBRATION_VERSION,
    executor: str(doc['executor'], '$.executor'),
    machine: str(doc['machine'], '$.machine'),
    date: str(doc['date'], '$.date'),
    gemm: gemm.map((g: unknown, i) => {
      const p = `$.gemm[${String(i)}]`;
      if (!isRecord(g)) bad(p, 'must be an object');
      noExtra(g, GEMM_KEYS, p);
      const dims = (['m', 'k', 'n'] as const).map((d) => {
        const v = g[d];
        if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1) bad(`${p}.${d}`, 'must be a positive integer');
        return v;
      }) as [number, number, number];
      const shapeClass = gemmShapeClass(...dims);
      if (g['shapeClass'] !== shapeClass) bad(`${p}.shapeClass`, `is ${show(g['shapeClass'])}, but [${dims.join(', ')}] is '${shapeClass}'`);
      return {
        shapeClass,
        m: dims[0],
        k: dims[1],
        n: dims[2],
        seconds: positive(g['seconds'], `${p}.seconds`),
        flopsPerSecond: positive(g['flopsPerSecond'], `${p}.flopsPerSecond`),
      };
    }),
    dispatchUs: positive(doc['dispatchUs'], '$.dispatchUs', true),
    bytesPerSecond: positive(doc['bytesPerSecond'], '$.bytesPerSecond'),
  };
}

/** Parses a calibration document from JSON text; bad JSON is `PLAN_BAD_CALIBRATION` at `$`. */
export function parseCalibration(text: string): Calibration {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new PlanError(PlanCode.BAD_CALIBRATION, `not JSON: ${errorMessage(e)}`, { path: '$', cause: e });
  }
  return checkCalibration(doc);
}

/** The JSON text of a calibration (fixed key order, trailing newline); `parseCalibration` returns an equal value. */
export function calibrationToJson(c: Calibration): string {
  const checked = checkCalibration(c);
  return `${JSON.stringify(checked, TOP_KEYS.concat(GEMM_KEYS), 2)}\n`;
}

/** What `calibrate` measures. */
export interface CalibrateOptions {
  /** GEMM shapes [m, k, n] to time (default: two per shape class, small enough for the interpreter). */
  readonly shapes?: readonly (readonly [number, number, number])[];
  /** Timed runs per measurement; the median is kept (default 5). */
  readonly repeats?: number;
  /** Ops in the chain used to separate dispatch cost from work (default 64). */
  readonly chain?: number;
  /** Machine description (default: CPU model and count, platform, Node version). */
  readonly machine?: string;
  /** Time stamp (default now). */
  readonly date?: Date;
}

/** Default calibration shapes: decode-like, LoRA shrink/expand-like and square GEMMs. */
export const DEFAULT_CALIBRATION_SHAPES: readonly (readonly [number, number, number])[] = [
  [1, 256, 256],
  [1, 512, 512],
  [64, 256, 16],
  [64, 16, 256],
  [64, 256, 256],
  [128, 256, 256],
];

function filled(shape: number[], seed: number): ReturnType<typeof hostTensor> {
  const n = shape.reduce((a, b) => a * b, 1);
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) data[i] = Math.sin(i * 0.7 + seed) * 0.5;
  return hostTensor('f32', shape, data);
}

async function medianSeconds(run: () => Promise<unknown>, repeats: number): Promise<number> {
  await run();
  const times: number[] = [];
  for (let i = 0; i < repeats; i++) {
    const t0 = performance.now();
    await run();
    times.push((performance.now() - t0) / 1000);
  }
  times.sort((a, b) => a - b);
  return times[times.length >> 1]!;
}

/**
 * Measures `executor` on this machine: per-op dispatch cost (a chain of `chain` one-element adds
 * minus a single add, divided by chain − 1), elementwise streaming rate (a 2^16-element add), and
 * the GEMM rate of every shape. Each figure is the median of `repeats` runs after one warm-up.
 */
export async function calibrate(executor: Executor, opts: CalibrateOptions = {}): Promise<Calibration> {
  const repeats = opts.repeats ?? 5;
  const chain = opts.chain ?? 64;
  if (!Number.isSafeInteger(repeats) || repeats < 1) throw new PlanError(PlanCode.BAD_OPTION, `repeats must be a positive integer, got ${String(repeats)}`);
  if (!Number.isSafeInteger(chain) || chain < 2) throw new PlanError(PlanCode.BAD_OPTION, `chain must be an integer ≥ 2, got ${String(chain)}`);
  const time = async (
    build: (b: GraphBuilder) => void,
    inputs: Record<string, ReturnType<typeof hostTensor>>,
    weights: Record<string, ReturnType<typeof hostTensor>> = {},
  ): Promise<number> => {
    const b = new GraphBuilder('calibrate');
    build(b);
    const prepared = await executor.prepare(b.build(), weights);
    try {
      return await medianSeconds(() => prepared.run(inputs), repeats);
    } finally {
      prepared.dispose();
    }
  };
  const adds = (n: number, len: number) => (b: GraphBuilder) => {
    const x = b.input('x', ['f32', [len]]);
    let y = b.add(x, x);
    for (let i = 1; i < n; i++) y = b.add(y, x);
    b.output('y', y);
  };
  const one = await time(adds(1, 1), { x: filled([1], 1) });
  const many = await time(adds(chain, 1), { x: filled([1], 1) });
  const dispatch = Math.max(0, (many - one) / (chain - 1));
  const len = 1 << 16;
  const stream = await time(adds(1, len), { x: filled([len], 2) });
  const bytesPerSecond = (3 * 4 * len) / Math.max(stream - dispatch, stream * 0.05);
  const gemm: GemmMeasurement[] = [];
  for (const [m, k, n] of opts.shapes ?? DEFAULT_CALIBRATION_SHAPES) {
    const seconds = await time(
      (b) => {
        b.output('y', b.linear(b.input('x', ['f32', [m, k]]), b.param('w', ['f32', [n, k]])));
      },
      { x: filled([m, k], 3) },
      { w: filled([n, k], 4) },
    );
    gemm.push({
      shapeClass: gemmShapeClass(m, k, n),
      m,
      k,
      n,
      seconds,
      flopsPerSecond: (2 * m * k * n) / Math.max(seconds - dispatch, seconds * 0.05),
    });
  }
  const cpu = cpus();
  return {
    format: CALIBRATION_FORMAT,
    version: CALIBRATION_VERSION,
    executor: executor.name,
    machine: opts.machine ?? `${String(cpu.length)}× ${cpu[0]?.model.trim() ?? 'unknown CPU'}, ${process.platform}-${process.arch}, Node ${process.version}`,
    date: (opts.date ?? new Date()).toISOString(),
    gemm,
    dispatchUs: dispatch * 1e6,
    bytesPerSecond,
  };
}
