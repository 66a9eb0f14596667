import { type DType, type Dim, type TensorType, dimToString } from '@stageml/ir';
import { LowerCode, LowerError } from './errors.js';
import { elementType, scalarLiteral, tensorTypeOf } from './types.js';

/** A tensor SSA value of the function being emitted, with its IR type. */
export interface ValueRef {
  /** SSA name, `%name` (or `%name#1` for one result of a multi-result op). */
  readonly ssa: string;
  /** IR type (symbolic dims print as `?`). */
  readonly type: TensorType;
}

/** One operand of a `linalg.generic`: a value and its indexing map's result expressions. */
export interface GenericOperand {
  readonly value: ValueRef;
  /** One affine expression per operand dim over loop dims `d0…`: `d1`, `0`, `d2 floordiv 4`. */
  readonly map: readonly string[];
}

/** A `linalg.generic` to emit. */
export interface GenericSpec {
  /** Number of loops. */
  readonly loops: number;
  /** Loops that are reductions (the rest are parallel). */
  readonly reductions?: readonly number[];
  readonly ins: readonly GenericOperand[];
  /** Inits (`outs`), each with its map; one result per init. */
  readonly outs: readonly GenericOperand[];
  /** The region: block arguments (ins, then outs) → the values to yield, one per init. */
  readonly body: (args: readonly string[]) => readonly string[];
}

const CONST_NAMES = new Map<number, string>([
  [0, 'zero'],
  [1, 'one'],
  [Number.NEGATIVE_INFINITY, 'ninf'],
  [Number.POSITIVE_INFINITY, 'inf'],
]);

const SSA_BODY = /^[A-Za-z_$.-][A-Za-z0-9_$.-]*$/;

/** Makes an IR name a valid MLIR SSA suffix (`layers/0:q` → `layers_0_q`, `0x` → `_0x`). */
export function sanitizeName(name: string): string {
  let s = name.replace(/[^A-Za-z0-9_$.-]/g, '_');
  if (s === '' || !SSA_BODY.test(s)) s = `_${s}`;
  return s;
}

/**
 * Writes the body of one `func.func`: named SSA values, region temporaries, and a prologue that
 * holds every index constant and symbolic size, so they dominate every use (including uses inside
 * regions). Symbolic dims are polynomials over symbols bound from the arguments' `tensor.dim`s.
 */
export class FunctionEmitter {
  readonly #prologue: string[] = [];
  readonly #body: string[] = [];
  readonly #names = new Set<string>();
  readonly #consts = new Map<string, string>();
  readonly #dims = new Map<string, string>();
  readonly #symbols = new Map<string, string>();
  readonly #graph: string;
  #indent = 2;
  #temp = 0;

  /** An emitter for a function of graph `graph` (named in errors). */
  constructor(graph: string) {
    this.#graph = graph;
  }

  /** A fresh, unique SSA name derived from `hint` (`%hint`, `%hint_1`, …). */
  fresh(hint: string): string {
    const base = sanitizeName(hint);
    let name = base;
    for (let k = 1; this.#names.has(name); k++) name = `${base}_${String(k)}`;
    this.#names.add(name);
    return `%${name}`;
  }

  /** A fresh numbered SSA name for a temporary (`%7`); never clashes with sanitized names. */
  temp(): string {
    return `%${String(this.#temp++)}`;
  }

  /** Appends a line of the current block. */
  line(text: string): void {
    this.#body.push(`${' '.repeat(this.#indent)}${text}`);
  }

  /** Emits `%tmp = expr` and returns `%tmp`. */
  let(expr: string): string {
    const t = this.temp();
    this.line(`${t} = ${expr}`);
    return t;
  }

  /** Emits `%name = expr` with a fresh name from `hint` and returns it. */
  def(hint: string, expr: string): string {
    const n = this.fresh(hint);
    this.line(`${n} = ${expr}`);
    return n;
  }

  /** Emits `open`, the lines `inner` writes one level deeper, then `close`. */
  nested(open: string, inner: () => void, close: string): void {
    this.line(open);
    this.#indent += 2;
    try {
      inner();
    } finally {
      this.#indent -= 2;
    }
    this.line(close);
  }

  /** A prologue constant of `dtype` (cached): `arith.constant 0 : index`. */
  constant(dtype: DType | 'index', v: number): string {
    const elem = dtype === 'index' ? 'index' : elementType(dtype);
    const lit = dtype === 'index' ? String(v) : scalarLiteral(dtype, v);
    const key = `${lit}:${elem}`;
    let ssa = this.#consts.get(key);
    if (ssa === undefined) {
      const hint = dtype === 'index' ? `c${String(v).replace('-', 'm')}` : `${CONST_NAMES.get(v) ?? 'cst'}_${elem}`;
      ssa = this.fresh(hint);
      // NOTE: `true`/`false` are typed (i1) already; `arith.constant true : i1` does not parse.
      this.#prologue.push(`    ${ssa} = arith.constant ${lit}${elem === 'i1' ? '' : ` : ${elem}`}`);
      this.#consts.set(key, ssa);
    }
    return ssa;
  }

  /** An index constant (cached in the prologue). */
  index(v: number): string {
    return this.constant('index', v);
  }

  /** Binds symbol `name` to dim `axis` of argument `arg` (prologue `tensor.dim`). */
  bindSymbol(name: string, arg: ValueRef, axis: number): void {
    if (this.#symbols.has(name)) return;
    const ssa = this.fresh(name);
    this.#prologue.push(`    ${ssa} = tensor.dim ${arg.ssa}, ${this.index(axis)} : ${tensorTypeOf(arg.type)}`);
    this.#symbols.set(name, ssa);
  }

  /** Binds symbol `name` to an index value already computed in the prologue. */
  bindSymbolTo(name: string, ssa: string): void {
    if (!this.#symbols.has(name)) this.#symbols.set(name, ssa);
  }

  /** Whether `name` is bound. */
  hasSymbol(name: string): boolean {
    return this.#symbols.has(name);
  }

  /** Emits `%name = expr` in the prologue with a fresh name from `hint` and returns it. */
  prologueDef(hint: string, expr: string): string {
    const n = this.fresh(hint);
    this.#prologue.push(`    ${n} = ${expr}`);
    return n;
  }

  /** Emits `%t = expr` in the prologue and returns `%t`. */
  prologueLet(expr: string): string {
    const t = this.temp();
    this.#prologue.push(`    ${t} = ${expr}`);
    return t;
  }

  /**
   * The index SSA value of a dim: a constant, a bound symbol, or a polynomial of them computed
   * once in the prologue. An unbound symbol is `LOWER_UNBOUND_DIM`.
   */
  dim(d: Dim): string {
    if (typeof d === 'number') return this.index(d);
    const key = dimToString(d);
    const cached = this.#dims.get(key);
    if (cached !== undefined) return cached;
    let acc: string | undefined;
    for (const term of d.terms) {
      let v: string | undefined;
      for (const s of term.vars) {
        const ssa = this.#symbols.get(s);
        if (ssa === undefined) {
          throw new LowerError(LowerCode.UNBOUND_DIM, `symbol '${s}' of dim '${key}' is not the size of any argument dim, so the MLIR function cannot compute it`, {
            at: { graph: this.#graph },
            hint: 'give the residual an input or parameter whose shape mentions the symbol, or specialize the symbol to a number',
          });
        }
        v = v === undefined ? ssa : this.prologueLet(`arith.muli ${v}, ${ssa} : index`);
      }
      const mag = Math.abs(term.coef);
      if (mag !== 1) v = this.prologueLet(`arith.muli ${v!}, ${this.index(mag)} : index`);
      if (acc === undefined) acc = term.coef < 0 ? this.prologueLet(`arith.subi ${this.index(0)}, ${v!} : index`) : v!;
      else acc = this.prologueLet(`arith.${term.coef < 0 ? 'subi' : 'addi'} ${acc}, ${v!} : index`);
    }
    if (d.constant !== 0) acc = this.prologueLet(`arith.${d.constant < 0 ? 'subi' : 'addi'} ${acc!}, ${this.index(Math.abs(d.constant))} : index`);
    this.#dims.set(key, acc!);
    return acc!;
  }

  /** SSA sizes of the symbolic dims of a shape, in order (the operands of `tensor.empty`). */
  dynamicSizes(shape: readonly Dim[]): string[] {
    return shape.filter((d) => typeof d !== 'number').map((d) => this.dim(d));
  }

  /** A mixed static/dynamic size list: `[%n, 4, 16]`. */
  sizeList(shape: readonly Dim[]): string {
    return `[${shape.map((d) => (typeof d === 'number' ? String(d) : this.dim(d))).join(', ')}]`;
  }

  /** `tensor.empty(…) : T` for `type`. */
  empty(type: TensorType, hint = 'empty'): ValueRef {
    return { ssa: this.def(hint, `tensor.empty(${this.dynamicSizes(type.shape).join(', ')}) : ${tensorTypeOf(type)}`), type };
  }

  /** A tensor of `type` filled with `v` (`tensor.empty` + `linalg.fill`). */
  filled(type: TensorType, v: number | string, hint = 'init'): ValueRef {
    const e = this.empty(type, `${hint}_empty`);
    const scalar = typeof v === 'string' ? v : this.constant(type.dtype, v);
    const t = tensorTypeOf(type);
    return { ssa: this.def(hint, `linalg.fill ins(${scalar} : ${elementType(type.dtype)}) outs(${e.ssa} : ${t}) -> ${t}`), type };
  }

  /** Emits a `linalg.generic` and returns its results, named from `hint`. */
  generic(spec: GenericSpec, hint: string): ValueRef[] {
    const dims = Array.from({ length: spec.loops }, (_, i) => `d${String(i)}`).join(', ');
    const all = [...spec.ins, ...spec.outs];
    const maps = all.map((o) => `affine_map<(${dims}) -> (${o.map.join(', ')})>`);
    const red = new Set(spec.reductions ?? []);
    const iters = Array.from({ length: spec.loops }, (_, i) => (red.has(i) ? '"reduction"' : '"parallel"'));
    const list = (xs: readonly GenericOperand[]): string => `${xs.map((o) => o.value.ssa).join(', ')} : ${xs.map((o) => tensorTypeOf(o.value.type)).join(', ')}`;
    const outTypes = spec.outs.map((o) => tensorTypeOf(o.value.type));
    const multi = spec.outs.length > 1;
    const name = this.fresh(hint);
    const head = `${name}${multi ? `:${String(spec.outs.length)}` : ''} = linalg.generic {indexing_maps = [${maps.join(', ')}], iterator_types = [${iters.join(', ')}]}`;
    const ins = spec.ins.length === 0 ? '' : ` ins(${list(spec.ins)})`;
    const args = all.map(() => this.temp());
    const blockArgs = all.map((o, i) => `${args[i]!}: ${elementType(o.value.type.dtype)}`).join(', ');
    this.line(`${head}${ins} outs(${list(spec.outs)}) {`);
    this.line(`^bb0(${blockArgs}):`);
    this.#indent += 2;
    try {
      const ys = spec.body(args);
      this.line(`linalg.yield ${ys.join(', ')} : ${spec.outs.map((o) => elementType(o.value.type.dtype)).join(', ')}`);
    } finally {
      this.#indent -= 2;
    }
    this.line(`} -> ${multi ? `(${outTypes.join(', ')})` : outTypes[0]!}`);
    return spec.outs.map((o, i) => ({ ssa: multi ? `${name}#${String(i)}` : name, type: o.value.type }));
  }

  /** The function body: prologue, then the emitted lines. */
  bodyLines(): string[] {
    return [...this.#prologue, ...this.#body.map((l) => `  ${l}`)];
  }
}

/** Identity map expressions `d{from}…d{from+rank-1}`. */
export function identityMap(rank: number, from = 0): string[] {
  return Array.from({ length: rank }, (_, i) => `d${String(from + i)}`);
}

/**
 * Map expressions of an operand broadcast (NumPy rules) against an output shape: operand dims
 * align to the right; a static 1 facing a dim other than 1 reads index 0.
 */
export function broadcastMap(shape: readonly Dim[], out: readonly Dim[]): string[] {
  const off = out.length - shape.length;
  return shape.map((d, i) => (d === 1 && out[off + i] !== 1 ? '0' : `d${String(off + i)}`));
}
