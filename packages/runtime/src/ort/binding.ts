import { errorMessage } from '@stageml/ir';

/** Element types the ORT executor exchanges tensors in (the compute types of `@stageml/onnx-lower`). */
export type OrtDataType = 'float32' | 'float64' | 'int64' | 'int32' | 'bool';

/** Typed-array storage of each `OrtDataType`. */
export type OrtData = Float32Array | Float64Array | BigInt64Array | Int32Array | Uint8Array;

/** The part of an onnxruntime tensor the executor uses. */
export interface OrtTensor {
  readonly type: string;
  readonly dims: readonly number[];
  readonly data: unknown;
}

/** Session options the executor sets (a subset of onnxruntime-common's `SessionOptions`). */
export interface OrtSessionOptions {
  readonly executionProviders: readonly string[];
  readonly intraOpNumThreads: number;
  readonly interOpNumThreads: number;
  readonly graphOptimizationLevel: 'disabled' | 'basic' | 'extended' | 'all';
  readonly executionMode: 'sequential' | 'parallel';
  readonly enableCpuMemArena: boolean;
  readonly enableMemPattern: boolean;
  readonly logSeverityLevel: 0 | 1 | 2 | 3 | 4;
  /** ONNX external data files given in memory (`path` as the model's tensors name them). */
  readonly externalData?: readonly { readonly path: string; readonly data: Uint8Array }[];
}

/** The part of an onnxruntime inference session the executor uses. */
export interface OrtSession {
  readonly inputNames: readonly string[];
  readonly outputNames: readonly string[];
  /** Runs the session; `fetches` maps output names to preallocated tensors (or null: allocated by onnxruntime). */
  run(feeds: Readonly<Record<string, OrtTensor>>, fetches?: Readonly<Record<string, OrtTensor | null>>): Promise<Readonly<Record<string, OrtTensor>>>;
  release(): Promise<void>;
}

/** The part of the `onnxruntime-node` module the executor uses. */
export interface OrtModule {
  readonly InferenceSession: { create(model: string | Uint8Array, options: OrtSessionOptions): Promise<OrtSession> };
  readonly Tensor: new (type: OrtDataType, data: OrtData, dims: readonly number[]) => OrtTensor;
  readonly env: { readonly versions: Readonly<Record<string, string | undefined>> };
}

/** Outcome of loading onnxruntime-node: the module, or why it is not usable here. */
export type OrtLoad = { readonly ok: true; readonly ort: OrtModule; readonly version: string } | { readonly ok: false; readonly reason: string; readonly cause?: unknown };

// NOTE: onnxruntime-node is an optional peer dependency (a native binding with per-platform binaries,
// 245 MB unpacked, left out of README command 1's serving install),
// so it is imported through a variable: bundlers and type checkers must not require it.
const MODULE = 'onnxruntime-node';

let loading: Promise<OrtLoad> | undefined;

async function importOrt(): Promise<OrtLoad> {
  let mod: unknown;
  try {
    const specifier: string = MODULE;
    mod = await import(specifier);
  } catch (e) {
    return { ok: false, reason: `cannot import ${MODULE} (${errorMessage(e)})`, cause: e };
  }
  // A CommonJS module imported from ESM may put its exports on `default`.
  const m = mod as Partial<OrtModule> & { default?: Partial<OrtModule> };
  const ort = typeof m.InferenceSession?.create === 'function' ? m : m.default;
  if (ort?.InferenceSession === undefined || ort.Tensor === undefined || ort.env === undefined) {
    return { ok: false, reason: `${MODULE} does not export InferenceSession and Tensor` };
  }
  const version = ort.env.versions['node'] ?? ort.env.versions['common'] ?? 'unknown';
  return { ok: true, ort: ort as OrtModule, version };
}

/** Loads onnxruntime-node once per process (later calls reuse the outcome); never throws. */
export function loadOrt(): Promise<OrtLoad> {
  loading ??= importOrt();
  return loading;
}
