import { attr } from '../attrs.js';
import { type Dim, dimAdd, dimDivExact, dimEquals, dimProduct, dimSub, dimToString, isStaticDim } from '../dim.js';
import { allocData } from '../dtype.js';
import { IrCode, IrError } from '../errors.js';
import { defineOp, shapeError } from '../op-def.js';
import { broadcastStrides, forEachIndex, sizeOf, stridesOf } from '../tensor.js';
import { broadcastShapes, normalizeAxis, shapeEquals, shapeToString } from '../types.js';
import { sameDType, splitAt } from './common.js';

function badAttr(op: string, msg: string): never {
  throw new IrError(IrCode.BAD_ATTR, `${op}: ${msg}`);
}

/** Resolves a reshape target against an element count: at most one −1, which is inferred. */
function resolveReshape(op: string, from: readonly Dim[], target: readonly Dim[]): Dim[] {
  const total = dimProduct(from);
  const holes = target.filter((d) => d === -1).length;
  if (holes > 1) badAttr(op, 'at most one dim may be −1');
  for (const d of target) if (typeof d === 'number' && d < -1) badAttr(op, `dim ${String(d)} is negative`);
  if (holes === 1) {
    const known = dimProduct(target.filter((d) => d !== -1));
    const q = dimDivExact(total, known);
    if (q === undefined || (typeof q === 'number' && q < 0)) {
      shapeError(op, `cannot infer −1: ${shapeToString(from)} does not split into ${shapeToString(target)}`);
    }
    return target.map((d) => (d === -1 ? q : d));
  }
  if (!dimEquals(dimProduct(target), total)) {
    shapeError(op, `${shapeToString(from)} and ${shapeToString(target)} have different element counts`);
  }
  return [...target];
}

/** y = x with a new shape (row-major order kept). */
export const reshape = defineOp({
  key: 'reshape',
  summary: 'Reinterprets the elements in row-major order under a new shape; one dim may be −1 (inferred).',
  semantics: 'flat(y) = flat(x), shape(y) = shape',
  operands: ['x'],
  attrs: { shape: attr.dims({}) },
  traits: ['shape-only'],
  infer: ([x], a) => [{ dtype: x!.dtype, shape: resolveReshape('reshape', x!.shape, a.shape) }],
  evaluate: ([x], a) => {
    const shape = resolveReshape('reshape', x!.shape, a.shape) as number[];
    return [{ dtype: x!.dtype, shape, data: x!.data.slice() }];
  },
});

function checkPerm(op: string, perm: readonly number[], rank: number): number[] {
  if (perm.length !== rank) badAttr(op, `perm has ${String(perm.length)} entries for rank ${String(rank)}`);
  const p = perm.map((a) => normalizeAxis(a, rank, 'perm entry'));
  if (new Set(p).size !== rank) badAttr(op, `perm [${perm.join(', ')}] is not a permutation`);
  return p;
}

/** y = x with axes permuted. */
export const transpose = defineOp({
  key: 'transpose',
  summary: 'Permutes axes: result axis i is operand axis perm[i].',
  semantics: 'y[i_{perm[0]}, …] = x[i_0, …]; shape(y)[i] = shape(x)[perm[i]]',
  operands: ['x'],
  attrs: { perm: attr.ints({}) },
  traits: ['shape-only'],
  infer: ([x], a) => {
    const p = checkPerm('transpose', a.perm, x!.shape.length);
    return [{ dtype: x!.dtype, shape: p.map((i) => x!.shape[i]!) }];
  },
  evaluate: ([x], a) => {
    const p = checkPerm('transpose', a.perm, x!.shape.length);
    const outShape = p.map((i) => x!.shape[i]!);
    const st = stridesOf(x!.shape);
    const out = allocData(x!.dtype, x!.data.length);
    const xd = x!.data;
    forEachIndex(outShape, [p.map((i) => st[i]!)], (i, offs) => {
      out[i] = xd[offs[0]!]!;
    });
    return [{ dtype: x!.dtype, shape: outShape, data: out }];
  },
});

/** y = x broadcast to a shape. */
export const broadcastTo = defineOp({
  key: 'broadcastTo',
  summary: 'Broadcasts to a target shape under NumPy rules.',
  semantics: 'y[i] = x[i with stretched axes at 0]',
  operands: ['x'],
  attrs: { shape: attr.dims({}) },
  traits: ['shape-only'],
  infer: ([x], a) => {
    const target = a.shape;
    for (const d of target) if (typeof d === 'number' && d < 0) badAttr('broadcastTo', `negative dim ${String(d)} in the target shape`);
    const b = broadcastShapes([x!.shape, target]);
    if (!shapeEquals(b, target)) shapeError('broadcastTo', `${shapeToString(x!.shape)} does not broadcast to ${shapeToString(target)}`);
    return [{ dtype: x!.dtype, shape: [...target] }];
  },
  evaluate: ([x], a) => {
    const target = a.shape as readonly number[];
    const out = allocData(x!.dtype, sizeOf(target));
    const xd = x!.data;
    forEachIndex(target, [broadcastStrides(x!.shape, target)], (i, offs) => {
      out[i] = xd[offs[0]!]!;
    });
    return [{ dtype: x!.dtype, shape: [...target], data: out }];
  },
});

/** y = concatenation along an axis. */
export const concat = defineOp({
  key: 'concat',
  summary: 'Concatenates one or more tensors along an axis; other dims must agree.',
  semantics: 'y = [x₀ ‖ x₁ ‖ …] along axis',
  operands: ['xs...'],
  attrs: { axis: attr.int({}) },
  traits: ['shape-only'],
  infer: (xs, a) => {
    const dtype = sameDType('concat', xs);
    const rank = xs[0]!.shape.length;
    const axis = normalizeAxis(a.axis, rank);
    let total: Dim = 0;
    for (const x of xs) {
      if (x.shape.length !== rank) shapeError('concat', 'operands have different ranks');
      x.shape.forEach((d, i) => {
        if (i !== axis && !dimEquals(d, xs[0]!.shape[i]!)) {
          shapeError('concat', `dim ${String(i)} differs: ${shapeToString(xs[0]!.shape)} vs ${shapeToString(x.shape)}`);
        }
      });
      total = dimAdd(total, x.shape[axis]!);
    }
    const shape = [...xs[0]!.shape];
    shape[axis] = total;
    return [{ dtype, shape }];
  },
  evaluate: (xs, a) => {
    const axis = normalizeAxis(a.axis, xs[0]!.shape.length);
    const total = xs.reduce((acc, x) => acc + x.shape[axis]!, 0);
    const shape = [...xs[0]!.shape];
    shape[axis] = total;
    const { outer, inner } = splitAt(shape, axis);
    const out = allocData(xs[0]!.dtype, sizeOf(shape));
    let offset = 0;
    for (const x of xs) {
      const chunk = x.shape[axis]! * inner;
      for (let o = 0; o < outer; o++) {
        out.set(x.data.subarray(o * chunk, (o + 1) * chunk), o * total * inner + offset);
      }
      offset += chunk;
    }
    return [{ dtype: xs[0]!.dtype, shape, data: out }];
  },
});

interface SliceBounds {
  start: Dim;
  length: Dim;
}

/** Python slice semantics on static sizes; on symbolic sizes bounds must be in range and step 1. */
function sliceBounds(size: Dim, start: Dim, end: Dim | undefined, step: number): SliceBounds {
  if (isStaticDim(size) && isStaticDim(start) && (end === undefined || isStaticDim(end))) {
    const norm = (v: number): number => Math.min(Math.max(v < 0 ? v + size : v, 0), size);
    const s = norm(start);
    const e = end === undefined ? size : norm(end);
    return { start: s, length: Math.max(0, Math.ceil((e - s) / step)) };
  }
  if (step !== 1) badAttr('slice', 'step must be 1 when the axis or a bound is symbolic');
  const fix = (v: Dim): Dim => (typeof v === 'number' && v < 0 ? dimAdd(size, v) : v);
  const s = fix(start);
  const e = end === undefined ? size : fix(end);
  return { start: s, length: dimSub(e, s) };
}

/** y = x[start:end:step] along an axis. */
export const slice = defineOp({
  key: 'slice',
  summary: 'Takes start:end:step along one axis with Python semantics (negative bounds count from the end).',
  semantics: 'y = x[…, start:end:step, …] along axis',
  operands: ['x'],
  attrs: {
    axis: attr.int({}),
    start: attr.dim({ default: 0 }),
    end: attr.dim({ optional: true }),
    step: attr.int({ default: 1, min: 1 }),
  },
  traits: ['shape-only'],
  infer: ([x], a) => {
    const axis = normalizeAxis(a.axis, x!.shape.length);
    const { length } = sliceBounds(x!.shape[axis]!, a.start, a.end, a.step);
    if (typeof length === 'number' && length < 0) shapeError('slice', `negative length ${dimToString(length)}`);
    const shape = [...x!.shape];
    shape[axis] = length;
    return [{ dtype: x!.dtype, shape }];
  },
  evaluate: ([x], a) => {
    const axis = normalizeAxis(a.axis, x!.shape.length);
    const size = x!.shape[axis]!;
    const b = sliceBounds(size, a.start, a.end, a.step);
    const start = b.start as number;
    const length = b.length as number;
    if (start < 0 || length < 0 || start + (length - 1) * a.step >= size + (length === 0 ? 1 : 0)) {
      throw new IrError(IrCode.EVAL_ERROR, `slice: bounds out of range for size ${String(size)}`);
    }
    const { outer, inner } = splitAt(x!.shape, axis);
    const shape = [...x!.shape];
    shape[axis] = length;
    const out = allocData(x!.dtype, sizeOf(shape));
    const xd = x!.data;
    let w = 0;
    for (let o = 0; o < outer; o++) {
      for (let j = 0; j < length; j++) {
        const src = (o * size + start + j * a.step) * inner;
        out.set(xd.subarray(src, src + inner), w);
        w += inner;
      }
    }
    return [{ dtype: x!.dtype, shape, data: out }];
  },
});
