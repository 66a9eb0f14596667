import { attr } from '../attrs.js';
import { dimEquals, dimProduct, dimToString } from '../dim.js';
import { allocData, rounderFor } from '../dtype.js';
import { defineOp, evalError, shapeError } from '../op-def.js';
import { shapeToString } from '../types.js';
import { requireIndex, requireNumeric, sameDType } from './common.js';

/**
 * y[n] = x[n] · w[g_n] (or w[g_n]ᵀ): each row multiplied by the matrix of its group. The MoE
 * expert GEMM: rows are (token, slot) pairs routed to expert g_n; executors group rows by expert
 * and run one GEMM per expert (MegaBlocks / fused_moe style) rather than a loop over tokens.
 */
export const groupedMatmul = defineOp({
  key: 'groupedMatmul',
  summary: 'Row-wise matrix product with a per-row choice of matrix: y[n] = x[n]·w[g_n] (MoE expert GEMMs, grouped by expert).',
  semantics: 'y[n, m] = Σ_k x[n, k] · w[g_n, k, m]   (transposeW: w[g_n, m, k])',
  operands: ['x', 'w', 'groups'],
  attrs: { transposeW: attr.bool({ default: false }) },
  traits: ['contraction'],
  infer: ([x, w, g], a) => {
    const dtype = sameDType('groupedMatmul', [x!, w!]);
    requireNumeric('groupedMatmul', x!);
    requireIndex('groupedMatmul', g!, 'groups');
    if (x!.shape.length !== 2) shapeError('groupedMatmul', `x must be [rows, in], got ${shapeToString(x!.shape)}`);
    if (w!.shape.length !== 3) shapeError('groupedMatmul', `w must be [groups, in, out] (or [groups, out, in] with transposeW), got ${shapeToString(w!.shape)}`);
    if (g!.shape.length !== 1 || !dimEquals(g!.shape[0]!, x!.shape[0]!)) {
      shapeError('groupedMatmul', `groups must be [${dimToString(x!.shape[0]!)}], got ${shapeToString(g!.shape)}`);
    }
    const k = a.transposeW ? w!.shape[2]! : w!.shape[1]!;
    const m = a.transposeW ? w!.shape[1]! : w!.shape[2]!;
    if (!dimEquals(k, x!.shape[1]!)) shapeError('groupedMatmul', `x ${shapeToString(x!.shape)} and w ${shapeToString(w!.shape)} disagree on the contraction dim`);
    return [{ dtype, shape: [x!.shape[0]!, m] }];
  },
  flops: ([x], [y]) => dimProduct([2, x!.shape[0]!, x!.shape[1]!, y!.shape[1]!]),
  evaluate: ([x, w, g], a) => {
    const [n, k] = x!.shape as [number, number];
    const [e, d1, d2] = w!.shape as [number, number, number];
    const m = a.transposeW ? d1 : d2;
    const out = allocData(x!.dtype, n * m);
    const round = rounderFor(x!.dtype);
    // Group rows by their matrix, then one pass per group: the grouped-GEMM schedule.
    const rowsOf: number[][] = Array.from({ length: e }, () => []);
    for (let r = 0; r < n; r++) {
      const gi = g!.data[r]!;
      if (!Number.isInteger(gi) || gi < 0 || gi >= e) evalError('groupedMatmul', `group ${String(gi)} of row ${String(r)} is out of range [0, ${String(e)})`);
      rowsOf[gi]!.push(r);
    }
    const [sk, sm] = a.transposeW ? [1, k] : [m, 1];
    for (let gi = 0; gi < e; gi++) {
      const base = gi * d1 * d2;
      for (const r of rowsOf[gi]!) {
        for (let j = 0; j < m; j++) {
          let acc = 0;
          for (let p = 0; p < k; p++) acc += x!.data[r * k + p]! * w!.data[base + p * sk + j * sm]!;
          out[r * m + j] = round(acc);
        }
      }
    }
    return [{ dtype: x!.dtype, shape: [n, m], data: out }];
  },
});
