import { type Dim, type DimBindings, dimEquals, dimProduct, dimToString, evalDim, isStaticDim, parseDim, checkDim } from './dim.js';
import { type DType, dtypeBytes, parseDType } from './dtype.js';
import { IrCode, IrError } from './errors.js';

/** The type of a tensor value: element type and shape (static and symbolic dims). */
export interface TensorType {
  /** Element type. */
  readonly dtype: DType;
  /** Dimensions, outermost first; `[]` is a scalar. */
  readonly shape: readonly Dim[];
}

/** Builds a tensor type; dims may be numbers, symbol names or `Dim`s. */
export function tensorType(dtype: DType, shape: readonly (Dim | string)[]): TensorType {
  return {
    dtype,
    shape: shape.map((d, i) => (typeof d === 'string' ? parseDim(d) : checkDim(d, `dim ${String(i)}`))),
  };
}

/** Shorthand for an f32 tensor type. */
export function f32(shape: readonly (Dim | string)[]): TensorType {
  return tensorType('f32', shape);
}

/** Whether two types are identical (same dtype, rank and dims). */
export function typeEquals(a: TensorType, b: TensorType): boolean {
  return a.dtype === b.dtype && shapeEquals(a.shape, b.shape);
}

/** Whether two shapes are identical. */
export function shapeEquals(a: readonly Dim[], b: readonly Dim[]): boolean {
  return a.length === b.length && a.every((d, i) => dimEquals(d, b[i]!));
}

/** Number of elements of a type (symbolic when its shape is). */
export function numElements(t: TensorType): Dim {
  return dimProduct(t.shape);
}

/** Bytes a value of this type occupies (symbolic when its shape is). */
export function typeBytes(t: TensorType): Dim {
  return dimProduct([...t.shape, dtypeBytes(t.dtype)]);
}

/** Whether every dim of the type is a known integer. */
export function isStaticType(t: TensorType): boolean {
  return t.shape.every(isStaticDim);
}

/** Evaluates every dim of `t` under `bindings`. */
export function concreteShape(t: TensorType, bindings: DimBindings): number[] {
  return t.shape.map((d) => evalDim(d, bindings));
}

/** Text of a shape: `[batch, seq, 4096]`. */
export function shapeToString(shape: readonly Dim[]): string {
  return `[${shape.map(dimToString).join(', ')}]`;
}

/** Text of a type: `f32[batch, seq, 4096]`. */
export function typeToString(t: TensorType): string {
  return `${t.dtype}${shapeToString(t.shape)}`;
}

/** Parses `f32[batch, 64]`; throws coded errors on bad dtypes or dims. */
export function parseType(text: string): TensorType {
  const m = /^\s*([a-z0-9]+)\s*\[(.*)\]\s*$/s.exec(text);
  if (m === null) throw new IrError(IrCode.PARSE_ERROR, `bad tensor type '${text}' (expected e.g. f32[batch, 64])`);
  const dtype = parseDType(m[1]!);
  const body = m[2]!.trim();
  return { dtype, shape: body === '' ? [] : body.split(',').map((s) => parseDim(s)) };
}

/**
 * Normalizes an axis against a rank (negative axes count from the end); throws `IR_BAD_ATTR` when
 * out of range.
 */
export function normalizeAxis(axis: number, rank: number, what = 'axis'): number {
  const a = axis < 0 ? axis + rank : axis;
  if (!Number.isInteger(a) || a < 0 || a >= rank) {
    throw new IrError(IrCode.BAD_ATTR, `${what} ${String(axis)} is out of range for rank ${String(rank)}`);
  }
  return a;
}

/**
 * NumPy broadcasting of shapes: align from the right; equal dims stay, a 1 stretches. Two different
 * symbolic dims do not broadcast (we cannot prove them equal). Throws `IR_SHAPE_MISMATCH`.
 */
export function broadcastShapes(shapes: readonly (readonly Dim[])[]): Dim[] {
  const rank = Math.max(0, ...shapes.map((s) => s.length));
  const out: Dim[] = [];
  for (let i = 0; i < rank; i++) {
    let acc: Dim = 1;
    for (const s of shapes) {
      const d = s[s.length - rank + i];
      if (d === undefined || d === 1) continue;
      if (acc === 1) acc = d;
      else if (!dimEquals(acc, d)) {
        throw new IrError(
          IrCode.SHAPE_MISMATCH,
          `shapes ${shapes.map(shapeToString).join(' and ')} do not broadcast (dim ${dimToString(acc)} vs ${dimToString(d)})`,
        );
      }
    }
    out.push(acc);
  }
  return out;
}
