import { type Dim, type DimBindings, dimMul, dimSub, dimToString, substituteDim, sym } from '@stageml/ir';
import type { NodeProto } from 'onnx-buf';

import { type ComputeElemType, ElemType, encodeValues } from './dtypes.js';
import { OnnxCode, OnnxLowerError } from './errors.js';
import { type OnnxAttr, nodeProto } from './proto.js';

/** An initializer of the model: a named constant tensor (bytes in its element type). */
export interface InitializerSpec {
  /** Tensor name. */
  readonly name: string;
  /** ONNX element type. */
  readonly elemType: ElemType;
  /** Concrete dims. */
  readonly dims: readonly number[];
  /** Little-endian element bytes. */
  readonly raw: Uint8Array<ArrayBuffer>;
}

/** A graph input's name and declared dims (statically known symbols substituted). */
export interface InputShape {
  readonly name: string;
  readonly shape: readonly Dim[];
}

/** The largest slice bound that is exact in a double; ONNX Slice clamps it to the axis size. */
export const SLICE_END = Number.MAX_SAFE_INTEGER;

/**
 * Emits ONNX nodes and initializers with unique names: the lowering context rules build on. It
 * computes symbolic dims at run time from the shapes of graph inputs (`Shape` with start/end,
 * then integer arithmetic), caches small constants and dims, and names nodes after the IR node
 * being lowered, so run-time errors point at it.
 */
export class OnnxGraphBuilder {
  /** Nodes in topological (emission) order. */
  readonly nodes: NodeProto[] = [];
  /** Initializers (parameters and constants). */
  readonly initializers: InitializerSpec[] = [];
  readonly #names = new Set<string>();
  readonly #constants = new Map<string, string>();
  readonly #dims = new Map<string, string>();
  readonly #shared = new Set<string>();
  readonly #inputs: readonly InputShape[];
  readonly #statics: DimBindings;
  #scope = 'graph';
  #counter = 0;

  /**
   * @param inputs - the graph inputs, whose run-time shapes determine the symbols.
   * @param statics - symbols with values known at lowering time (bound by parameter shapes).
   */
  constructor(inputs: readonly InputShape[], statics: DimBindings) {
    this.#inputs = inputs;
    this.#statics = statics;
  }

  /** Claims `name` so no generated name takes it; false when it is already taken. */
  reserve(name: string): boolean {
    if (this.#names.has(name)) return false;
    this.#names.add(name);
    return true;
  }

  /** A new unique tensor name derived from `hint`. */
  fresh(hint: string): string {
    let name = hint;
    while (this.#names.has(name)) name = `${hint}:${String(++this.#counter)}`;
    this.#names.add(name);
    return name;
  }

  /** Sets the label generated names and node names derive from (the IR value being lowered). */
  setScope(label: string): void {
    this.#scope = label;
  }

  /** Emits a node with `outputs` fresh results; returns their names. */
  emit(opType: string, inputs: readonly string[], attrs: Readonly<Record<string, OnnxAttr>> = {}, outputs = 1): string[] {
    const outs = Array.from({ length: outputs }, () => this.fresh(`${this.#scope}/${opType}`));
    this.nodes.push(nodeProto(opType, inputs, outs, `${this.#scope}/${opType}#${String(this.nodes.length)}`, attrs));
    return outs;
  }

  /** Emits a node whose results take exactly `outputs` (names the caller reserved). */
  emitTo(opType: string, inputs: readonly string[], outputs: readonly string[], attrs: Readonly<Record<string, OnnxAttr>> = {}): void {
    this.nodes.push(nodeProto(opType, inputs, outputs, `${this.#scope}/${opType}#${String(this.nodes.length)}`, attrs));
  }

  /**
   * Emits a single-result node of onnxruntime's `com.microsoft` contrib domain (`MatMulNBits`);
   * the encoded model then imports that domain. Only onnxruntime runs such models.
   */
  msOp(opType: string, inputs: readonly string[], attrs: Readonly<Record<string, OnnxAttr>> = {}): string {
    const out = this.fresh(`${this.#scope}/${opType}`);
    this.nodes.push(nodeProto(opType, inputs, [out], `${this.#scope}/${opType}#${String(this.nodes.length)}`, attrs, 'com.microsoft'));
    return out;
  }

  /** Emits a `com.microsoft` node with `outputs` fresh results (GroupQueryAttention's output and presents); returns their names. */
  msEmit(opType: string, inputs: readonly string[], attrs: Readonly<Record<string, OnnxAttr>>, outputs: number): string[] {
    const outs = Array.from({ length: outputs }, () => this.fresh(`${this.#scope}/${opType}`));
    this.nodes.push(nodeProto(opType, inputs, outs, `${this.#scope}/${opType}#${String(this.nodes.length)}`, attrs, 'com.microsoft'));
    return outs;
  }

  /**
   * Runs `fn` with its nodes emitted into a detached list (an If branch) and returns them with
   * `fn`'s result; run-time dims and shapes first computed inside are forgotten afterwards, so no
   * later node reads a tensor that only exists inside the branch. Constants are initializers
   * (global) and stay shared.
   */
  detached(fn: () => string): { readonly nodes: NodeProto[]; readonly out: string } {
    const start = this.nodes.length;
    const dims = new Map(this.#dims);
    const shared = new Set(this.#shared);
    const inits = this.initializers.length;
    try {
      const out = fn();
      return { nodes: this.nodes.splice(start), out };
    } finally {
      this.nodes.splice(start);
      this.#dims.clear();
      for (const [k, v] of dims) this.#dims.set(k, v);
      this.#shared.clear();
      for (const x of shared) this.#shared.add(x);
      for (const i of this.initializers.slice(inits)) this.#shared.add(i.name);
    }
  }

  /** Whether `name` is an initializer or a cached tensor that later nodes may reuse (never rename it). */
  isShared(name: string): boolean {
    return this.#shared.has(name);
  }

  /** Emits a single-result node; returns the result's name. */
  op(opType: string, inputs: readonly string[], attrs: Readonly<Record<string, OnnxAttr>> = {}): string {
    return this.emit(opType, inputs, attrs)[0]!;
  }

  /** Adds an initializer under exactly `name` (which must be free). */
  initializer(spec: InitializerSpec): string {
    if (!this.reserve(spec.name)) throw new OnnxLowerError(OnnxCode.BAD_GRAPH, `tensor name '${spec.name}' is used twice`);
    this.initializers.push(spec);
    this.#shared.add(spec.name);
    return spec.name;
  }

  /** A constant tensor of a compute type (small ones are shared). */
  constant(elemType: ComputeElemType, dims: readonly number[], values: ArrayLike<number>): string {
    const small = values.length <= 16;
    const key = `${String(elemType)}|${dims.join(',')}|${Array.from(values, (v) => (Object.is(v, -0) ? '-0' : String(v))).join(',')}`;
    const hit = small ? this.#constants.get(key) : undefined;
    if (hit !== undefined) return hit;
    const name = this.fresh(small ? `const[${Array.from(values).slice(0, 4).join(',')}]` : `${this.#scope}/const`);
    this.initializers.push({ name, elemType, dims: [...dims], raw: encodeValues(elemType, values) });
    this.#shared.add(name);
    if (small) this.#constants.set(key, name);
    return name;
  }

  /** A rank-0 constant. */
  scalar(value: number, elemType: ComputeElemType): string {
    return this.constant(elemType, [], [value]);
  }

  /** A 1-D int64 constant (axes, shapes, bounds). */
  int64s(values: readonly number[]): string {
    return this.constant(ElemType.INT64, [values.length], values);
  }

  /** `x` cast to `to` (a plain ONNX Cast). */
  cast(x: string, to: ElemType): string {
    return this.op('Cast', [x], { to });
  }

  /** A dim with every statically known symbol substituted. */
  resolve(d: Dim): Dim {
    return substituteDim(d, this.#statics);
  }

  /** The value of `d` as an int64 tensor of shape [1], computed at run time when symbolic. */
  dim(d: Dim): string {
    return this.#dimOf(this.resolve(d), new Set());
  }

  #dimOf(r: Dim, visiting: ReadonlySet<string>): string {
    if (typeof r === 'number') return this.int64s([r]);
    const key = dimToString(r);
    const hit = this.#dims.get(key);
    if (hit !== undefined) return hit;
    const saved = this.#scope;
    this.#scope = `dim(${key})`;
    try {
      let acc: string | undefined;
      for (const t of r.terms) {
        let term: string | undefined;
        for (const v of t.vars) term = term === undefined ? this.#symbol(v, visiting) : this.op('Mul', [term, this.#symbol(v, visiting)]);
        if (t.coef !== 1) term = this.op('Mul', [term!, this.int64s([t.coef])]);
        acc = acc === undefined ? term : this.op('Add', [acc, term!]);
      }
      if (r.constant !== 0) acc = this.op('Add', [acc!, this.int64s([r.constant])]);
      this.#dims.set(key, acc!);
      this.#shared.add(acc!);
      return acc!;
    } finally {
      this.#scope = saved;
    }
  }

  /** The value of `d` as a rank-0 int64 tensor (Range bounds, TopK needs [1]: use `dim`). */
  dimScalar(d: Dim): string {
    const r = this.resolve(d);
    if (typeof r === 'number') return this.scalar(r, ElemType.INT64);
    return this.op('Squeeze', [this.dim(r), this.int64s([0])]);
  }

  /** A shape as an int64 tensor [rank]: a constant when static, else the run-time concatenation. */
  shape(dims: readonly Dim[]): string {
    const rs = dims.map((d) => this.resolve(d));
    if (rs.every((d): d is number => typeof d === 'number')) return this.int64s(rs);
    if (rs.length === 1) return this.dim(rs[0]!);
    const key = `shape:${rs.map((d) => dimToString(d)).join(',')}`;
    const hit = this.#dims.get(key);
    if (hit !== undefined) return hit;
    const parts = rs.map((d) => this.dim(d));
    const saved = this.#scope;
    this.#scope = key;
    try {
      const v = this.op('Concat', parts, { axis: 0 });
      this.#dims.set(key, v);
      this.#shared.add(v);
      return v;
    } finally {
      this.#scope = saved;
    }
  }

  /**
   * The run-time value of symbol `name`: the size of an input axis that is exactly `name`, else
   * solved from an input axis linear in it whose other symbols are known (`past` from an axis of
   * `past + seq` once `seq` is known: (size − seq) / 1).
   */
  #symbol(name: string, visiting: ReadonlySet<string>): string {
    const key = `sym:${name}`;
    const hit = this.#dims.get(key);
    if (hit !== undefined) return hit;
    let v: string | undefined;
    const plain = this.#inputs.flatMap((i) => i.shape.flatMap((d, axis) => (dimToString(d) === name ? [{ input: i.name, axis }] : [])))[0];
    if (plain !== undefined) v = this.op('Shape', [plain.input], { start: plain.axis, end: plain.axis + 1 });
    const inner = new Set([...visiting, name]);
    for (const i of this.#inputs) {
      for (const [axis, d] of i.shape.entries()) {
        if (v !== undefined || typeof d === 'number' || visiting.has(name)) continue;
        const linear = d.terms.find((t) => t.vars.length === 1 && t.vars[0] === name);
        const others = d.terms.filter((t) => t !== linear);
        if (linear === undefined || others.some((t) => t.vars.includes(name) || t.vars.some((x) => inner.has(x)))) continue;
        try {
          const rest = this.#dimOf(dimSub(d, dimMul(sym(name), linear.coef)), inner);
          const diff = this.op('Sub', [this.op('Shape', [i.name], { start: axis, end: axis + 1 }), rest]);
          v = linear.coef === 1 ? diff : this.op('Div', [diff, this.int64s([linear.coef])]);
        } catch (e) {
          if (!(e instanceof OnnxLowerError && e.code === OnnxCode.UNBOUND_SYMBOL)) throw e;
        }
      }
    }
    if (v === undefined) {
      throw new OnnxLowerError(OnnxCode.UNBOUND_SYMBOL, `symbol '${name}' is not determined by the shape of any graph input, so its value is unknown at run time`, {
        hint: 'give some input an axis of this symbol (alone, or linear in it with otherwise known symbols), or bind it through a parameter shape',
      });
    }
    this.#dims.set(key, v);
    this.#shared.add(v);
    return v;
  }
}
