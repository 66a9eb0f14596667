import { availableParallelism } from 'node:os';
import { type DType, type DecomposedRule, type Graph, type HostTensor, OP_KEYS, type OpKey, type OpNode, type TensorType, type UnsupportedRule, decomposedRule, errorMessage, expandComposites, unsupportedRule } from '@stageml/ir';
import { RuntimeCode, RuntimeError } from '../errors.js';
import { type Executor, type ExecutorCapabilities, type PreparedGraph, PreparedGraphs, type RunOptions, capabilitiesOfTable, checkInputs, expandFor, resolveWeights } from '../executor.js';
import { checkRowsInput } from '../row-inputs.js';
import type { ValueSource } from '../values.js';
import { type CpuAddon, cpuAddonOrigin, loadCpuAddon } from './addon.js';
import { encodeProgram } from './compile.js';

/**
 * How cpu-native runs one op: instructions of the runner (`native`; `decomposeWhen` names the
 * nodes of a composite it expands instead), its registry decomposition, or not at all.
 */
export type CpuNativeRule =
  | { readonly kind: 'native'; readonly decomposeWhen?: (attrs: OpNode['attrs'], operands: readonly TensorType[]) => boolean }
  | DecomposedRule
  | UnsupportedRule;

const NATIVE: CpuNativeRule = { kind: 'native' };
const COMPARE = unsupportedRule('the native runner has no comparison kernels');

// NOTE: the key list repeats `OPS` on purpose (as every backend's table does): adding an op to the
// registry fails this build until cpu-native says how it runs it.
/**
 * How the cpu-native runner handles every op of the registry (elementwise ones on f32;
 * add/sub/mul/… and neg/abs also on i64): `native` ops are runner instructions, `decomposed`
 * composites are expanded into their primitive ops before encoding.
 */
export const CPU_NATIVE_RULES = {
  constant: NATIVE,
  iota: NATIVE,
  randomUniform: unsupportedRule('the native runner has no random source'),
  add: NATIVE,
  sub: NATIVE,
  mul: NATIVE,
  div: NATIVE,
  pow: NATIVE,
  maximum: NATIVE,
  minimum: NATIVE,
  neg: NATIVE,
  abs: NATIVE,
  exp: NATIVE,
  log: NATIVE,
  sqrt: NATIVE,
  rsqrt: NATIVE,
  tanh: NATIVE,
  sigmoid: NATIVE,
  silu: NATIVE,
  gelu: NATIVE,
  sin: NATIVE,
  cos: NATIVE,
  equal: COMPARE,
  notEqual: COMPARE,
  less: COMPARE,
  lessEqual: COMPARE,
  greater: COMPARE,
  greaterEqual: COMPARE,
  where: NATIVE,
  cast: NATIVE,
  matmul: NATIVE,
  linear: NATIVE,
  groupedMatmul: NATIVE,
  quantizedLinear: NATIVE,
  sum: NATIVE,
  mean: NATIVE,
  max: NATIVE,
  argmax: NATIVE,
  softmax: NATIVE,
  rmsNorm: NATIVE,
  layerNorm: NATIVE,
  reshape: NATIVE,
  transpose: NATIVE,
  broadcastTo: NATIVE,
  concat: NATIVE,
  slice: NATIVE,
  gather: NATIVE,
  indexSelect: NATIVE,
  scatterAdd: NATIVE,
  topk: NATIVE,
  rotary: NATIVE,
  attention: NATIVE,
  // The gathered form is one LORA instruction (each row's factors streamed once) added to the base;
  // the grouped and single forms run as their primitive graphs.
  loraBank: { kind: 'native', decomposeWhen: (attrs) => attrs['form'] !== 'gathered' },
  // The gathered form is one LORA_Q instruction reading the int8 codes and their row scales in
  // place (a quarter of the f32 tables' bytes); the other forms dequantize the rows they gather.
  quantizedLoraBank: { kind: 'native', decomposeWhen: (attrs, operands) => attrs['form'] !== 'gathered' || operands[0]!.dtype !== 'f32' },
  // One LORA_LINEAR instruction (base GEMM, shrink and expand in one pass over x) in f32 without
  // biases; other dtypes and biased layers run as the primitive chain.
  loraLinear: { kind: 'native', decomposeWhen: (_attrs, operands) => operands.length > 4 || operands.some((t) => t.dtype !== 'f32') },
  // One ATTENTION_KV instruction reading the position-major cache and the step's keys in place.
  cachedAttention: { kind: 'native', decomposeWhen: (_attrs, operands) => operands[0]!.shape.length !== 4 },
  // Its base LINEAR and the bank's instructions (LORA for the gathered form), as before the op existed.
  loraBankLinear: decomposedRule(),
  // ADD and RMSNORM: the runner has no fused skip norm (the add is one streaming pass either way).
  skipRmsNorm: decomposedRule(),
  // The generated-kernel serving ops (BGMV, an SGMV step, the expert GEMM with expert LoRA) run as
  // the primitive chains they fold, as before the ops existed.
  gatheredLoraLinear: decomposedRule(),
  loraScatterAdd: decomposedRule(),
  groupedLoraMatmul: decomposedRule(),
} as const satisfies Readonly<Record<OpKey, CpuNativeRule>>;

/** Ops the native runner executes, natively or through their decomposition. */
export const CPU_NATIVE_OPS: readonly OpKey[] = OP_KEYS.filter((k) => CPU_NATIVE_RULES[k].kind !== 'unsupported');

/** What cpu-native runs: `CPU_NATIVE_RULES` (its native composites fused, the others expanded), in f32. */
export const CPU_NATIVE_CAPABILITIES: ExecutorCapabilities = capabilitiesOfTable('cpu-native', CPU_NATIVE_RULES);

/** Options of `createCpuNativeExecutor`. */
export interface CpuNativeExecutorOptions {
  /**
   * Threads of the kernels' pool (default: the machine's cores, `os.availableParallelism()`). The
   * pool is one per process: the last executor created sets its size.
   */
  readonly threads?: number;
}

/** The `cpu-native` executor, with what the addon reports. */
export interface CpuNativeExecutor extends Executor {
  /** The instruction set the kernels were built for (`avx512-vnni`, `avx512`, `avx2`, `generic`). */
  readonly isa: string;
  /** Where the addon came from: `prebuilt <isa>` (a shipped linux-x64 file), `source` (built here) or `file` (`STAGEML_CPU_ADDON`). */
  readonly build: string;
  /** Threads of the kernel pool. */
  readonly threads: number;
}

function nativeError(e: unknown): RuntimeError {
  if (e instanceof RuntimeError) return e;
  const code = (e as { code?: unknown }).code;
  const msg = `cpu-native: ${errorMessage(e)}`;
  if (code === 'RT_BAD_VALUE') return new RuntimeError(RuntimeCode.BAD_VALUE, msg, { cause: e });
  if (code === 'RT_UNSUPPORTED') return new RuntimeError(RuntimeCode.UNSUPPORTED_OP, msg, { cause: e });
  return new RuntimeError(RuntimeCode.EVAL_FAILED, msg, { cause: e });
}

/**
 * The buffer of each result a run returned: its outputs, less those reduced to their argmax
 * (`RunOptions.argmax`, whose indices are a small array of their own), lie in it.
 */
const runBuffers = new WeakMap<object, ArrayBuffer>();

/**
 * The buffer behind an earlier result of a cpu-native run (`RunOptions.recycle`): the one its run
 * wrote, or else the one buffer behind every output of `outputs`, if so.
 */
function recycledBuffer(outputs: Readonly<Record<string, HostTensor>> | undefined): ArrayBuffer | undefined {
  const known = outputs === undefined ? undefined : runBuffers.get(outputs);
  if (known !== undefined) return known;
  let buf: ArrayBuffer | undefined;
  for (const t of Object.values(outputs ?? {})) {
    const b = (t.data as ArrayBufferView).buffer as ArrayBuffer | undefined;
    if (b === undefined || (buf !== undefined && b !== buf)) return undefined;
    buf = b;
  }
  return buf;
}

function wrap(dtype: DType, buf: ArrayBuffer, offset: number, count: number): HostTensor['data'] {
  switch (dtype) {
    case 'f32':
      return new Float32Array(buf, offset, count);
    case 'i64':
      return new Float64Array(buf, offset, count);
    case 'i32':
      return new Int32Array(buf, offset, count);
    case 'u8':
    case 'bool':
      return new Uint8Array(buf, offset, count);
    case 'i8':
      return new Int8Array(buf, offset, count);
    case 'f64':
    case 'f16':
    case 'bf16':
      throw new RuntimeError(RuntimeCode.EVAL_FAILED, `cpu-native: no host storage for ${dtype} outputs`);
  }
}

class CpuNativePrepared implements PreparedGraph {
  readonly executor = 'cpu-native';
  #disposed = false;
  #program: object | undefined;

  constructor(
    private readonly addon: CpuAddon,
    private readonly graph: Graph,
    program: object,
    private readonly bindings: Readonly<Record<string, number>>,
    private readonly inputs: readonly string[],
    private readonly outputs: readonly { readonly name: string; readonly dtype: DType }[],
    private readonly symbols: readonly string[],
    /** The inputs a run may give per row: those the program reads only as cached attention's caches. */
    readonly rowInputs: ReadonlySet<string>,
  ) {
    this.#program = program;
  }

  async run(inputs: Readonly<Record<string, HostTensor>>, opts?: RunOptions): Promise<Record<string, HostTensor>> {
    if (this.#disposed || this.#program === undefined) throw new RuntimeError(RuntimeCode.DISPOSED, 'this prepared graph was disposed');
    const rows = opts?.rows ?? {};
    for (const [name, r] of Object.entries(rows)) {
      if (!this.rowInputs.has(name)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `cpu-native: input '${name}' of @${this.graph.name} cannot be given per row (only the caches of cached attention can: ${[...this.rowInputs].join(', ') || 'none here'})`);
      checkRowsInput(name, r);
    }
    const bound = checkInputs(this.graph, inputs, this.bindings, rows);
    const syms = new Float64Array(this.symbols.length);
    this.symbols.forEach((s, i) => {
      const v = bound[s];
      if (v === undefined) throw new RuntimeError(RuntimeCode.BAD_VALUE, `cpu-native: the inputs do not bind the size '${s}'`);
      syms[i] = v;
    });
    // A per-row input goes to the runner as its array of rows (read in place).
    const data = this.inputs.map((n) => rows[n]?.rows ?? (inputs[n]!.data as ArrayBufferView));
    let res: [ArrayBuffer, Float64Array];
    try {
      res = await this.addon.run(this.#program, syms, data, recycledBuffer(opts?.recycle));
    } catch (e) {
      throw nativeError(e);
    }
    // One buffer holds every output; per output: its byte offset, rank and dims.
    const [buf, layout] = res;
    const out: Record<string, HostTensor> = {};
    let at = 0;
    for (const o of this.outputs) {
      const offset = layout[at++]!;
      const rank = layout[at++]!;
      const shape: number[] = [];
      let count = 1;
      for (let i = 0; i < rank; i++) {
        const d = layout[at++]!;
        shape.push(d);
        count *= d;
      }
      out[o.name] = { dtype: o.dtype, shape, data: wrap(o.dtype, buf, offset, count) };
    }
    // Greedy picks: each row's argmax made by the addon (SIMD over the row the run just wrote)
    // instead of a JavaScript loop over the vocabulary; the output becomes i64 indices of its
    // leading dims, as an executor whose results cross to the host returns it (`argmaxRows` reads both).
    for (const name of opts?.argmax ?? []) {
      const t = out[name];
      const n = t?.dtype === 'f32' ? t.shape.at(-1) : undefined;
      if (n === undefined || n === 0) continue;
      out[name] = { dtype: 'i64', shape: t!.shape.slice(0, -1), data: this.addon.argmax(t!.data as Float32Array, n) };
    }
    runBuffers.set(out, buf);
    return out;
  }

  dispose(): void {
    this.#disposed = true;
    // The program (and its packed weights) is freed when the last run holding it resolves.
    this.#program = undefined;
  }
}

/**
 * The `cpu-native` executor: graphs run on this package's own C++ kernels (built once per machine
 * with its C++ compiler, `-march=native`; see `loadCpuAddon`), in-process, with no per-node
 * framework overhead. Block-quantized linears (`quantizedLinear`, 4- and 8-bit, blocks that are
 * multiples of 32) run int8 dot products on activations quantized per 32 inputs (AVX-512 VNNI);
 * f32 linears and matmuls read row-major weights in place (weights fed as inputs are not copied);
 * a slot-table gather feeding a batched matmul is read in place; attention runs over the key/value
 * inputs as given, and cached attention's position-major caches may be given per row
 * (`RunOptions.rows`, listed in `rowInputs`): each sequence's own KV buffer read in place. Runs are asynchronous (a libuv worker drives the pool) and one at a time per
 * process. Errors: no compiler or a failed build is `RT_BACKEND_UNAVAILABLE`; an op or dtype the
 * kernels lack is `RT_UNSUPPORTED_OP` at `prepare`; bad run inputs `RT_BAD_VALUE`.
 */
export function createCpuNativeExecutor(opts: CpuNativeExecutorOptions = {}): CpuNativeExecutor {
  const threads = opts.threads ?? availableParallelism();
  if (!Number.isSafeInteger(threads) || threads < 1 || threads > 256) throw new RuntimeError(RuntimeCode.BAD_VALUE, `cpu-native: threads must be an integer in [1, 256], got ${String(threads)}`);
  const addon = loadCpuAddon();
  const got = addon.threads(threads);
  const isa = addon.isa();
  const live = new PreparedGraphs('cpu-native');
  return {
    name: 'cpu-native',
    capabilities: CPU_NATIVE_CAPABILITIES,
    isa,
    build: cpuAddonOrigin() ?? 'source',
    threads: got,
    dispose(): Promise<void> {
      live.disposeAll();
      return Promise.resolve();
    },
    prepare(source: Graph, weights?: ValueSource): Promise<PreparedGraph> {
      try {
        live.check();
        const graph = expandComposites(expandFor(source, CPU_NATIVE_CAPABILITIES), (op, attrs, operands) => {
          const rule = CPU_NATIVE_RULES[op] as CpuNativeRule | undefined;
          return rule?.kind === 'native' && rule.decomposeWhen?.(attrs, operands) === true;
        });
        const { values, bindings } = resolveWeights(graph, weights);
        const enc = encodeProgram(graph, values);
        let program: object;
        try {
          program = addon.compile(enc.ints, enc.floats, enc.params);
        } catch (e) {
          throw nativeError(e);
        }
        const rowInputs = new Set(Array.from(addon.rowInputs(program), (i) => enc.inputs[i]!));
        return Promise.resolve(live.track(new CpuNativePrepared(addon, graph, program, bindings, enc.inputs, enc.outputs, enc.symbols, rowInputs)));
      } catch (e) {
        return Promise.reject(e instanceof Error ? e : new RuntimeError(RuntimeCode.EVAL_FAILED, String(e)));
      }
    },
  };
}
