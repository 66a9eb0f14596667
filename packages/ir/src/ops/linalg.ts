import { attr } from '../attrs.js';
import { type Dim, dimAdd, dimEquals, dimProduct, dimToString } from '../dim.js';
import { allocData, rounderFor } from '../dtype.js';
import { defineOp, shapeError } from '../op-def.js';
import { type HostTensor, broadcastStrides, forEachIndex, sizeOf } from '../tensor.js';
import { type TensorType, broadcastShapes, shapeToString } from '../types.js';
import { requireNumeric, requireRank, sameDType } from './common.js';

interface MatmulDims {
  batch: Dim[];
  m: Dim;
  k: Dim;
  n: Dim;
}

function matmulDims(op: string, a: TensorType, b: TensorType, ta: boolean, tb: boolean): MatmulDims {
  requireRank(op, a, 2, 'lhs');
  requireRank(op, b, 2, 'rhs');
  const ra = a.shape.length;
  const rb = b.shape.length;
  const m = ta ? a.shape[ra - 1]! : a.shape[ra - 2]!;
  const ka = ta ? a.shape[ra - 2]! : a.shape[ra - 1]!;
  const kb = tb ? b.shape[rb - 1]! : b.shape[rb - 2]!;
  const n = tb ? b.shape[rb - 2]! : b.shape[rb - 1]!;
  if (!dimEquals(ka, kb)) {
    shapeError(
      op,
      `contraction dims differ: lhs ${shapeToString(a.shape)} gives ${dimToString(ka)}, rhs ${shapeToString(b.shape)} gives ${dimToString(kb)}`,
    );
  }
  const batch = broadcastShapes([a.shape.slice(0, ra - 2), b.shape.slice(0, rb - 2)]);
  return { batch, m, k: ka, n };
}

/** y = op(a) · op(b), batched with broadcasting over leading dims. */
export const matmul = defineOp({
  key: 'matmul',
  summary: 'Batched matrix product over the last two axes, broadcasting leading axes, with transpose flags.',
  semantics: 'y[…, i, j] = Σₖ op(a)[…, i, k] · op(b)[…, k, j], op = transpose when its flag is set',
  operands: ['lhs', 'rhs'],
  attrs: { transposeA: attr.bool({ default: false }), transposeB: attr.bool({ default: false }) },
  traits: ['contraction'],
  infer: ([a, b], at) => {
    const dtype = sameDType('matmul', [a!, b!]);
    requireNumeric('matmul', a!);
    const d = matmulDims('matmul', a!, b!, at.transposeA, at.transposeB);
    return [{ dtype, shape: [...d.batch, d.m, d.n] }];
  },
  flops: ([a, b], _res, at) => {
    const d = matmulDims('matmul', a!, b!, at.transposeA, at.transposeB);
    return dimProduct([2, ...d.batch, d.m, d.n, d.k]);
  },
  evaluate: ([a, b], at) => [evalMatmul(a!, b!, at.transposeA, at.transposeB)],
});

function evalMatmul(a: HostTensor, b: HostTensor, ta: boolean, tb: boolean): HostTensor {
  const ra = a.shape.length;
  const rb = b.shape.length;
  const m = ta ? a.shape[ra - 1]! : a.shape[ra - 2]!;
  const k = ta ? a.shape[ra - 2]! : a.shape[ra - 1]!;
  const kb = tb ? b.shape[rb - 1]! : b.shape[rb - 2]!;
  const n = tb ? b.shape[rb - 2]! : b.shape[rb - 1]!;
  if (k !== kb) shapeError('matmul', `contraction dims differ at run time: ${String(k)} vs ${String(kb)}`);
  const batch = broadcastShapes([a.shape.slice(0, ra - 2), b.shape.slice(0, rb - 2)]) as number[];
  const out = allocData(a.dtype, sizeOf(batch) * m * n);
  const round = rounderFor(a.dtype);
  // Strides of each operand's batch dims, in units of whole matrices.
  const aBatch = broadcastStrides(a.shape.slice(0, ra - 2), batch).map((s) => s * m * k);
  const bBatch = broadcastStrides(b.shape.slice(0, rb - 2), batch).map((s) => s * k * n);
  // Element strides inside one matrix of op(a) [m, k] and op(b) [k, n].
  const [aI, aK] = ta ? [1, m] : [k, 1];
  const [bK, bJ] = tb ? [1, k] : [n, 1];
  const ad = a.data;
  const bd = b.data;
  let outBase = 0;
  forEachIndex(batch, [aBatch, bBatch], (_i, offs) => {
    const a0 = offs[0]!;
    const b0 = offs[1]!;
    for (let i = 0; i < m; i++) {
      for (let j = 0; j < n; j++) {
        let acc = 0;
        let ai = a0 + i * aI;
        let bj = b0 + j * bJ;
        for (let p = 0; p < k; p++) {
          acc += ad[ai]! * bd[bj]!;
          ai += aK;
          bj += bK;
        }
        out[outBase + i * n + j] = round(acc);
      }
    }
    outBase += m * n;
  });
  return { dtype: a.dtype, shape: [...batch, m, n], data: out };
}

/** y = x · wᵀ + bias (PyTorch's `F.linear`). */
export const linear = defineOp({
  key: 'linear',
  summary: "Affine map over the last axis with a [out, in] weight and optional bias, as PyTorch's F.linear.",
  semantics: 'y[…, o] = Σᵢ x[…, i] · w[o, i] + bias[o]',
  operands: ['x', 'w', 'bias?'],
  traits: ['contraction'],
  infer: ([x, w, bias]) => {
    const dtype = sameDType('linear', bias === undefined ? [x!, w!] : [x!, w!, bias]);
    requireNumeric('linear', x!);
    requireRank('linear', x!, 1, 'x');
    if (w!.shape.length !== 2) shapeError('linear', `w must be [out, in], got ${shapeToString(w!.shape)}`);
    const [out, inW] = w!.shape as [Dim, Dim];
    const inX = x!.shape[x!.shape.length - 1]!;
    if (!dimEquals(inX, inW)) {
      shapeError('linear', `x ${shapeToString(x!.shape)} and w ${shapeToString(w!.shape)} disagree on the input dim`);
    }
    if (bias !== undefined && (bias.shape.length !== 1 || !dimEquals(bias.shape[0]!, out))) {
      shapeError('linear', `bias must be [${dimToString(out)}], got ${shapeToString(bias.shape)}`);
    }
    return [{ dtype, shape: [...x!.shape.slice(0, -1), out] }];
  },
  flops: ([x, w, bias]) => {
    const rows = dimProduct(x!.shape.slice(0, -1));
    const [out, inW] = w!.shape as [Dim, Dim];
    const f = dimProduct([2, rows, out, inW]);
    return bias === undefined ? f : dimAdd(f, dimProduct([rows, out]));
  },
  evaluate: ([x, w, bias]) => {
    const inDim = x!.shape[x!.shape.length - 1]!;
    const outDim = w!.shape[0]!;
    if (w!.shape[1] !== inDim) shapeError('linear', 'input dims differ at run time');
    const rowsExact = sizeOf(x!.shape.slice(0, -1));
    const out = allocData(x!.dtype, rowsExact * outDim);
    const round = rounderFor(x!.dtype);
    const xd = x!.data;
    const wd = w!.data;
    for (let r = 0; r < rowsExact; r++) {
      for (let o = 0; o < outDim; o++) {
        let acc = bias === undefined ? 0 : bias.data[o]!;
        const xb = r * inDim;
        const wb = o * inDim;
        for (let i = 0; i < inDim; i++) acc += xd[xb + i]! * wd[wb + i]!;
        out[r * outDim + o] = round(acc);
      }
    }
    return [{ dtype: x!.dtype, shape: [...x!.shape.slice(0, -1), outDim], data: out }];
  },
});
