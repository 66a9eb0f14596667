import { normalizeAttrs } from './attrs.js';
import type { Dim } from './dim.js';
import type { DType } from './dtype.js';
import { IrCode, IrError, StageError } from './errors.js';
import type { Graph, GraphNode, GraphOutput, ValueId, ValueInfo } from './graph.js';
import { operandArity } from './op-def.js';
import { type AttrsIn, type OpKey, opDef } from './ops/index.js';
import type { TensorType } from './types.js';
import { tensorType } from './types.js';

/** A handle on a value being built: its id, name and static type. */
export interface Value {
  /** Value id in the graph under construction. */
  readonly id: ValueId;
  /** Unique value name. */
  readonly name: string;
  /** Static type. */
  readonly type: TensorType;
}

/** Options of a `GraphBuilder`. */
export interface BuilderOptions {
  /**
   * Hash-cons pure ops: applying the same op to the same operands with the same attributes returns
   * the existing value (common-subexpression elimination for free). Default true.
   */
  readonly intern?: boolean;
}

/** Options of one op application. */
export interface ApplyOptions {
  /** Base name for the result value (made unique with a numeric suffix when taken). */
  readonly name?: string;
  /** Base names of each result of a multi-result op (take precedence over `name`). */
  readonly names?: readonly string[];
}

const NAME_RE = /^[A-Za-z0-9_.$\-/:]+$/;

/**
 * A `JSON.stringify` replacer for hash-consing keys. JSON prints NaN and ±Infinity as null and −0
 * as 0, so `constant(NaN)` and `constant(Infinity)` (or 0 and −0) would intern to one node; this
 * spells those numbers out.
 */
export function internKeyReplacer(_key: string, v: unknown): unknown {
  return typeof v === 'number' && (!Number.isFinite(v) || Object.is(v, -0)) ? `#${Object.is(v, -0) ? '-0' : String(v)}` : v;
}

/**
 * Builds graphs: the tracer of StageML. TypeScript functions call its op methods on `Value`s;
 * every call infers the result type through the op registry, so a graph under construction is
 * always well typed. Names are readable and unique (`scope('layers.0', …)` prefixes them).
 */
export class GraphBuilder {
  readonly #name: string;
  readonly #intern: boolean;
  readonly #nodes: GraphNode[] = [];
  readonly #values: ValueInfo[] = [];
  readonly #outputs: GraphOutput[] = [];
  readonly #taken = new Set<string>();
  readonly #counters = new Map<string, number>();
  readonly #interned = new Map<string, ValueId[]>();
  readonly #issued = new WeakSet<Value>();
  readonly #handles: Value[] = [];
  #prefix = '';

  /** Starts an empty graph called `name`. */
  constructor(name: string, opts: BuilderOptions = {}) {
    this.#name = name;
    this.#intern = opts.intern ?? true;
  }

  /** Name of the graph under construction. */
  get name(): string {
    return this.#name;
  }

  /** Runs `fn` with `prefix.` prepended to the names of values it creates. */
  scope<T>(prefix: string, fn: () => T): T {
    const saved = this.#prefix;
    this.#prefix = `${saved}${prefix}.`;
    try {
      return fn();
    } finally {
      this.#prefix = saved;
    }
  }

  /** Declares a graph input (a late-bound value supplied at run time). */
  input(name: string, type: TensorType | [DType, readonly (Dim | string)[]]): Value {
    return this.#leaf('input', name, Array.isArray(type) ? tensorType(type[0], type[1]) : type);
  }

  /** Declares a parameter: a named weight whose data the weight store provides. */
  param(name: string, type: TensorType | [DType, readonly (Dim | string)[]]): Value {
    return this.#leaf('param', name, Array.isArray(type) ? tensorType(type[0], type[1]) : type);
  }

  #leaf(kind: 'input' | 'param', name: string, type: TensorType): Value {
    if (!NAME_RE.test(name)) {
      throw new IrError(IrCode.BAD_ATTR, `${kind} name '${name}' has characters outside [A-Za-z0-9_.$-/:]`);
    }
    if (this.#taken.has(name)) {
      throw new IrError(IrCode.DUPLICATE_NAME, `a value named '${name}' already exists in @${this.#name}`);
    }
    const id = this.#values.length;
    this.#taken.add(name);
    this.#values.push({ name, type, node: this.#nodes.length, index: 0 });
    this.#nodes.push({ kind, name, operands: [], results: [id] });
    return this.#handle(id);
  }

  #handle(id: ValueId): Value {
    const existing = this.#handles[id];
    if (existing !== undefined) return existing;
    const info = this.#values[id]!;
    const h: Value = Object.freeze({ id, name: info.name, type: info.type });
    this.#issued.add(h);
    this.#handles[id] = h;
    return h;
  }

  /** The handle of an existing value by id (for passes that rebuild graphs). */
  value(id: ValueId): Value {
    if (this.#values[id] === undefined) throw new IrError(IrCode.UNDEFINED_VALUE, `no value #${String(id)} in @${this.#name}`);
    return this.#handle(id);
  }

  #fresh(base: string): string {
    const want = `${this.#prefix}${base}`;
    if (!this.#taken.has(want)) {
      this.#taken.add(want);
      return want;
    }
    let n = this.#counters.get(want) ?? 0;
    let name: string;
    do {
      n++;
      name = `${want}_${String(n)}`;
    } while (this.#taken.has(name));
    this.#counters.set(want, n);
    this.#taken.add(name);
    return name;
  }

  /**
   * Applies registry op `key` to `operands` with `attrs`, returning all results. Throws the op's
   * coded error (shape, dtype, attribute, operand count) pointing at the node being built.
   */
  apply<K extends OpKey>(key: K, operands: readonly Value[], attrs?: AttrsIn<K>, opts: ApplyOptions = {}): Value[] {
    const def = opDef(key);
    const at = { graph: this.#name, node: this.#nodes.length };
    const arity = operandArity(def.operands);
    if (operands.length < arity.min || operands.length > arity.max) {
      const want = arity.max === arity.min ? String(arity.min) : `${String(arity.min)}..${arity.max === Infinity ? '∞' : String(arity.max)}`;
      throw new IrError(IrCode.OPERAND_COUNT, `${def.name} takes ${want} operands, got ${String(operands.length)}`, { at });
    }
    for (const v of operands) {
      if (!this.#issued.has(v)) {
        throw new IrError(IrCode.UNDEFINED_VALUE, `operand %${v.name} does not belong to @${this.#name}`, { at });
      }
    }
    const norm = normalizeAttrs(def.name, def.attrs, (attrs ?? {}), at);
    const ids = operands.map((v) => v.id);
    const internKey = this.#intern && def.effect === 'pure' ? `${key}(${ids.join(',')})${JSON.stringify(norm, internKeyReplacer)}` : undefined;
    if (internKey !== undefined) {
      const hit = this.#interned.get(internKey);
      if (hit !== undefined) return hit.map((id) => this.#handle(id));
    }
    let types: TensorType[];
    try {
      types = def.infer(
        operands.map((v) => v.type),
        norm,
      );
    } catch (e) {
      if (e instanceof StageError) throw new IrError(e.code as IrError['code'], e.message, { at, cause: e, hint: e.hint });
      throw new IrError(IrCode.SHAPE_MISMATCH, `${def.name}: type inference failed`, { at, cause: e });
    }
    const nodeIndex = this.#nodes.length;
    const results: ValueId[] = types.map((type, index) => {
      const id = this.#values.length;
      const base = opts.names?.[index] ?? opts.name ?? (def.results > 1 ? `${key}.${String(index)}` : key);
      this.#values.push({ name: this.#fresh(base), type, node: nodeIndex, index });
      return id;
    });
    this.#nodes.push({ kind: 'op', op: key, operands: ids, attrs: norm, results });
    if (internKey !== undefined) this.#interned.set(internKey, results);
    return results.map((id) => this.#handle(id));
  }

  /** Applies a single-result op and returns its result. */
  op<K extends OpKey>(key: K, operands: readonly Value[], attrs?: AttrsIn<K>, opts?: ApplyOptions): Value {
    return this.apply(key, operands, attrs, opts)[0]!;
  }

  /** Marks `value` as the graph output called `name`. */
  output(name: string, value: Value): void {
    if (!this.#issued.has(value)) throw new IrError(IrCode.UNDEFINED_VALUE, `output value %${value.name} does not belong to @${this.#name}`);
    if (this.#outputs.some((o) => o.name === name)) throw new IrError(IrCode.DUPLICATE_NAME, `duplicate output name '${name}'`);
    this.#outputs.push({ name, value: value.id });
  }

  /** Finishes the graph. The builder may keep being used; later calls do not change this graph. */
  build(): Graph {
    return {
      name: this.#name,
      nodes: [...this.#nodes],
      values: [...this.#values],
      outputs: [...this.#outputs],
    };
  }

  // ---- sugar: one verb per op ------------------------------------------------------------

  /** A literal tensor (row-major `values`, or one value splatted). */
  constant(values: number | readonly number[], dtype: DType = 'f32', shape: readonly number[] = []): Value {
    return this.op('constant', [], { value: typeof values === 'number' ? [values] : values, dtype, shape });
  }
  /** A scalar literal of `dtype`. */
  scalar(value: number, dtype: DType = 'f32'): Value {
    return this.constant(value, dtype, []);
  }
  /** Indices along `axis` of `shape`. */
  iota(shape: readonly (Dim | string)[], axis = 0, dtype: DType = 'i64'): Value {
    return this.op('iota', [], { shape: tensorType(dtype, shape).shape, axis, dtype });
  }
  /** Fresh uniform samples in [0, 1) of `shape` (random: never folded or CSE'd). */
  randomUniform(shape: readonly (Dim | string)[], dtype: DType = 'f32'): Value {
    return this.op('randomUniform', [], { shape: tensorType(dtype, shape).shape, dtype });
  }
  /** a + b. */
  add(a: Value, b: Value): Value {
    return this.op('add', [a, b]);
  }
  /** a − b. */
  sub(a: Value, b: Value): Value {
    return this.op('sub', [a, b]);
  }
  /** a · b (element-wise). */
  mul(a: Value, b: Value): Value {
    return this.op('mul', [a, b]);
  }
  /** a / b. */
  div(a: Value, b: Value): Value {
    return this.op('div', [a, b]);
  }
  /** a^b. */
  pow(a: Value, b: Value): Value {
    return this.op('pow', [a, b]);
  }
  /** max(a, b). */
  maximum(a: Value, b: Value): Value {
    return this.op('maximum', [a, b]);
  }
  /** min(a, b). */
  minimum(a: Value, b: Value): Value {
    return this.op('minimum', [a, b]);
  }
  /** −x. */
  neg(x: Value): Value {
    return this.op('neg', [x]);
  }
  /** eˣ. */
  exp(x: Value): Value {
    return this.op('exp', [x]);
  }
  /** ln x. */
  log(x: Value): Value {
    return this.op('log', [x]);
  }
  /** √x. */
  sqrt(x: Value): Value {
    return this.op('sqrt', [x]);
  }
  /** 1/√x. */
  rsqrt(x: Value): Value {
    return this.op('rsqrt', [x]);
  }
  /** |x|. */
  abs(x: Value): Value {
    return this.op('abs', [x]);
  }
  /** sin x. */
  sin(x: Value): Value {
    return this.op('sin', [x]);
  }
  /** cos x. */
  cos(x: Value): Value {
    return this.op('cos', [x]);
  }
  /** tanh x. */
  tanh(x: Value): Value {
    return this.op('tanh', [x]);
  }
  /** σ(x). */
  sigmoid(x: Value): Value {
    return this.op('sigmoid', [x]);
  }
  /** x·σ(x). */
  silu(x: Value): Value {
    return this.op('silu', [x]);
  }
  /** GELU. */
  gelu(x: Value, approximate: 'none' | 'tanh' = 'none'): Value {
    return this.op('gelu', [x], { approximate });
  }
  /** cond ? a : b. */
  where(cond: Value, a: Value, b: Value): Value {
    return this.op('where', [cond, a, b]);
  }
  /** a = b (bool). */
  equal(a: Value, b: Value): Value {
    return this.op('equal', [a, b]);
  }
  /** a ≠ b (bool). */
  notEqual(a: Value, b: Value): Value {
    return this.op('notEqual', [a, b]);
  }
  /** a < b (bool). */
  less(a: Value, b: Value): Value {
    return this.op('less', [a, b]);
  }
  /** a ≤ b (bool). */
  lessEqual(a: Value, b: Value): Value {
    return this.op('lessEqual', [a, b]);
  }
  /** a > b (bool). */
  greater(a: Value, b: Value): Value {
    return this.op('greater', [a, b]);
  }
  /** a ≥ b (bool). */
  greaterEqual(a: Value, b: Value): Value {
    return this.op('greaterEqual', [a, b]);
  }
  /** Converts to `dtype`. */
  cast(x: Value, dtype: DType): Value {
    return this.op('cast', [x], { dtype });
  }
  /** Batched matrix product. */
  matmul(a: Value, b: Value, attrs: AttrsIn<'matmul'> = {}): Value {
    return this.op('matmul', [a, b], attrs);
  }
  /** x · wᵀ (+ bias). */
  linear(x: Value, w: Value, bias?: Value): Value {
    return this.op('linear', bias === undefined ? [x, w] : [x, w, bias]);
  }
  /** Rows of `x` each multiplied by the expert weight its `groups` entry names (MoE). */
  groupedMatmul(x: Value, w: Value, groups: Value, attrs: AttrsIn<'groupedMatmul'> = {}): Value {
    return this.op('groupedMatmul', [x, w, groups], attrs);
  }

  /**
   * x · dequantize(qweight, scales, zeroPoints)ᵀ: a linear layer over a block-quantized weight
   * (see the `quantizedLinear` op for the layout).
   */
  quantizedLinear(x: Value, qweight: Value, scales: Value, zeroPoints: Value | undefined, attrs: AttrsIn<'quantizedLinear'>): Value {
    return this.op('quantizedLinear', zeroPoints === undefined ? [x, qweight, scales] : [x, qweight, scales, zeroPoints], attrs);
  }
  /** Σ over axes. */
  sum(x: Value, axes: readonly number[] = [], keepDims = false): Value {
    return this.op('sum', [x], { axes, keepDims });
  }
  /** Mean over axes. */
  mean(x: Value, axes: readonly number[] = [], keepDims = false): Value {
    return this.op('mean', [x], { axes, keepDims });
  }
  /** Max over axes. */
  max(x: Value, axes: readonly number[] = [], keepDims = false): Value {
    return this.op('max', [x], { axes, keepDims });
  }
  /** Index of the maximum along `axis`. */
  argmax(x: Value, axis = -1, keepDims = false): Value {
    return this.op('argmax', [x], { axis, keepDims });
  }
  /** Softmax along `axis`. */
  softmax(x: Value, axis = -1): Value {
    return this.op('softmax', [x], { axis });
  }
  /** RMS normalization over the last axis. */
  rmsNorm(x: Value, weight: Value | undefined, eps: number): Value {
    return this.op('rmsNorm', weight === undefined ? [x] : [x, weight], { eps });
  }
  /** Layer normalization over the last axis. */
  layerNorm(x: Value, weight?: Value, bias?: Value, eps = 1e-5): Value {
    const ops = [x, ...(weight === undefined ? [] : [weight]), ...(bias === undefined ? [] : [bias])];
    return this.op('layerNorm', ops, { eps });
  }
  /** New shape, same elements (one dim may be −1). */
  reshape(x: Value, shape: readonly (Dim | string)[]): Value {
    return this.op('reshape', [x], { shape: shape.map((d) => (d === -1 ? -1 : tensorType('f32', [d]).shape[0]!)) });
  }
  /** Permutes axes. */
  transpose(x: Value, perm: readonly number[]): Value {
    return this.op('transpose', [x], { perm });
  }
  /** Broadcasts to `shape`. */
  broadcastTo(x: Value, shape: readonly (Dim | string)[]): Value {
    return this.op('broadcastTo', [x], { shape: tensorType('f32', shape).shape });
  }
  /** Concatenation along `axis`. */
  concat(xs: readonly Value[], axis: number): Value {
    return this.op('concat', xs, { axis });
  }
  /** x[start:end:step] along `axis`. */
  slice(x: Value, axis: number, start: Dim, end?: Dim, step = 1): Value {
    return this.op('slice', [x], end === undefined ? { axis, start, step } : { axis, start, end, step });
  }
  /** Rows of `table` at `indices` along `axis`. */
  gather(table: Value, indices: Value, axis = 0): Value {
    return this.op('gather', [table, indices], { axis });
  }
  /** Entries of `x` at a 1-D `index` along `axis`. */
  indexSelect(x: Value, index: Value, axis = 0): Value {
    return this.op('indexSelect', [x, index], { axis });
  }
  /** x with `updates` added at `index` along `axis`. */
  scatterAdd(x: Value, index: Value, updates: Value, axis = 0): Value {
    return this.op('scatterAdd', [x, index, updates], { axis });
  }
  /** The k largest entries along `axis` and their indices. */
  topk(x: Value, k: number, axis = -1, largest = true): [values: Value, indices: Value] {
    const [v, i] = this.apply('topk', [x], { k, axis, largest });
    return [v!, i!];
  }
  /** Rotary position embedding. */
  rotary(x: Value, cos: Value, sin: Value, interleaved = false): Value {
    return this.op('rotary', [x, cos, sin], { interleaved });
  }
  /** Scaled dot-product attention. */
  attention(q: Value, k: Value, v: Value, attrs: AttrsIn<'attention'> = {}, mask?: Value): Value {
    return this.op('attention', mask === undefined ? [q, k, v] : [q, k, v, mask], attrs);
  }
  /**
   * Per-row adapter updates from slot tables added to `base` (`loraBank`); `select` is the grouped
   * form's row → group one-hot or the single form's row mask (absent for `gathered`). `zeroTail`
   * promises that in every slot the rank rows after A's first all-zero row are zero (see the op).
   */
  loraBank(form: 'gathered' | 'grouped' | 'single', x: Value, base: Value, A: Value, B: Value, index: Value, select?: Value, opts: { zeroTail?: boolean } = {}): Value {
    return this.op('loraBank', select === undefined ? [x, base, A, B, index] : [x, base, A, B, index, select], opts.zeroTail === true ? { form, zeroTail: true } : { form });
  }
  /**
   * `loraBank` over int8 tables A, B with per-rank-row scales aScale, bScale [slots, R]
   * (`quantizedLoraBank`); operands and options as `loraBank`'s.
   */
  quantizedLoraBank(form: 'gathered' | 'grouped' | 'single', x: Value, base: Value, A: Value, aScale: Value, B: Value, bScale: Value, index: Value, select?: Value, opts: { zeroTail?: boolean } = {}): Value {
    const operands = [x, base, A, aScale, B, bScale, index, ...(select === undefined ? [] : [select])];
    return this.op('quantizedLoraBank', operands, opts.zeroTail === true ? { form, zeroTail: true } : { form });
  }
  /**
   * A linear with one LoRA adapter in residual form, x·wᵀ + bias + s·((x·Aᵀ)·Bᵀ + biasB)
   * (`loraLinear`); `bias` is the base layer's, `biasB` B's (PEFT's `lora_bias`).
   */
  loraLinear(x: Value, w: Value, A: Value, B: Value, scale: number, opts: { bias?: Value | undefined; biasB?: Value | undefined } = {}): Value {
    const operands = [x, w, A, B, ...(opts.bias === undefined ? [] : [opts.bias]), ...(opts.biasB === undefined ? [] : [opts.biasB])];
    return this.op('loraLinear', operands, opts.biasB === undefined ? { scale } : { scale, loraBias: true });
  }
  /**
   * BGMV: a linear plus each row's LoRA update gathered from stacked factors A [L, r, in],
   * B [L, out, r] and scales [L] by `ids` (`gatheredLoraLinear`).
   */
  gatheredLoraLinear(x: Value, w: Value, A: Value, B: Value, scales: Value, ids: Value, bias?: Value): Value {
    return this.op('gatheredLoraLinear', bias === undefined ? [x, w, A, B, scales, ids] : [x, w, A, B, scales, ids, bias]);
  }
  /** One SGMV step: acc with s·((x[rows]·Aᵀ)·Bᵀ + biasB) scatter-added at `rows` (`loraScatterAdd`). */
  loraScatterAdd(acc: Value, x: Value, rows: Value, A: Value, B: Value, scale: number, biasB?: Value): Value {
    return this.op('loraScatterAdd', biasB === undefined ? [acc, x, rows, A, B] : [acc, x, rows, A, B, biasB], { scale });
  }
  /** A MoE expert GEMM with per-expert LoRA factors (`groupedLoraMatmul`). */
  groupedLoraMatmul(x: Value, w: Value, A: Value, B: Value, groups: Value, attrs: AttrsIn<'groupedLoraMatmul'>): Value {
    return this.op('groupedLoraMatmul', [x, w, A, B, groups], attrs);
  }
  /**
   * A base linear `x·wᵀ (+ bias)` and its per-row adapter updates from slot tables in one op
   * (`loraBankLinear`); `select` is the grouped and single forms' operand, as in `loraBank`.
   */
  loraBankLinear(form: 'gathered' | 'grouped' | 'single', x: Value, w: Value, A: Value, B: Value, index: Value, select?: Value, opts: { bias?: Value; zeroTail?: boolean } = {}): Value {
    const operands = [x, w, A, B, index, ...(select === undefined ? [] : [select]), ...(opts.bias === undefined ? [] : [opts.bias])];
    return this.op('loraBankLinear', operands, opts.zeroTail === true ? { form, zeroTail: true } : { form });
  }
  /** A residual add and the RMS norm of its sum (`skipRmsNorm`): returns [sum, normed]. */
  skipRmsNorm(x: Value, residual: Value, weight: Value | undefined, eps: number): [Value, Value] {
    const [sum, y] = this.apply('skipRmsNorm', weight === undefined ? [x, residual] : [x, residual, weight], { eps });
    return [sum!, y!];
  }
  /** Attention over a position-major resident KV cache plus the step's keys and values (`cachedAttention`). */
  cachedAttention(q: Value, pastK: Value, pastV: Value, k: Value, v: Value, attrs: AttrsIn<'cachedAttention'> = {}, mask?: Value): Value {
    return this.op('cachedAttention', mask === undefined ? [q, pastK, pastV, k, v] : [q, pastK, pastV, k, v, mask], attrs);
  }
}

/**
 * Traces `fn` into a graph: `fn` receives a builder and returns the output values (one value, a
 * list named `out0…`, or a record of named outputs).
 */
export function traceGraph(
  name: string,
  fn: (b: GraphBuilder) => Value | readonly Value[] | Readonly<Record<string, Value>>,
  opts?: BuilderOptions,
): Graph {
  const b = new GraphBuilder(name, opts);
  const out = fn(b);
  if (isValue(out)) b.output('out', out);
  else if (Array.isArray(out)) (out as readonly Value[]).forEach((v, i) => { b.output(`out${String(i)}`, v); });
  else for (const [k, v] of Object.entries(out as Record<string, Value>)) b.output(k, v);
  return b.build();
}

function isValue(x: unknown): x is Value {
  return typeof x === 'object' && x !== null && 'id' in x && 'type' in x && 'name' in x;
}
