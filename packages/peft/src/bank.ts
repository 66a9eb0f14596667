import type { GraphBuilder, Value } from '@stageml/ir';
import type { LoraValues } from './attach.js';

/** One adapter's rows in a mixed batch: the row indices (i64[n]) and the adapter's factors. */
export interface BankGroup {
  /** Rows (along axis 0 of x) that use this adapter. */
  readonly rows: Value;
  /** The adapter's factors for this layer. */
  readonly lora: LoraValues;
}

/**
 * A linear layer over a mixed batch, SGMV-style: every row gets the base output, and each
 * adapter's delta is computed on its own rows only and added back in place, so adapters of
 * different ranks are never padded to the largest and base-only rows cost nothing extra:
 *
 *   y = x·Wᵀ + b;  for each group g: y[rows_g] += s_g · (x[rows_g]·A_gᵀ)·B_gᵀ
 *
 * Rows are indices along axis 0 of `x` (sequences of a batch); duplicates across groups add.
 */
export function bankLinearGrouped(b: GraphBuilder, x: Value, w: Value, bias: Value | undefined, groups: readonly BankGroup[]): Value {
  let y = b.linear(x, w, bias);
  for (const g of groups) {
    const xs = b.indexSelect(x, g.rows, 0);
    const delta = b.mul(b.linear(b.linear(xs, g.lora.A), g.lora.B, g.lora.biasB), b.scalar(g.lora.scale, w.type.dtype));
    y = b.scatterAdd(y, g.rows, delta, 0);
  }
  return y;
}

/** Stacked factors of all adapters for the gathered (BGMV-style) form. */
export interface StackedLora {
  /** A of every adapter, padded to rank r: [n_adapters, r, in]; slot 0 may be all zeros (base-only). */
  readonly A: Value;
  /** B of every adapter: [n_adapters, out, r]. */
  readonly B: Value;
  /** Per-adapter scales [n_adapters]. */
  readonly scales: Value;
}

/**
 * A linear layer over a mixed batch, BGMV-style: each row gathers its adapter's factors by index
 * and applies them in one batched matmul. `adapterOfRow` is i64[rows]; x is [rows, seq, in]. Ranks
 * are padded to the stack's r (zero rows of A and columns of B add nothing), so this form pays
 * for the largest rank on every row: the planner chooses it only where many small groups would
 * otherwise cost more in dispatch than the padding does.
 *
 *   y[i] = x[i]·Wᵀ + b + s[a_i] · (x[i]·A[a_i]ᵀ)·B[a_i]ᵀ
 */
export function bankLinearGathered(b: GraphBuilder, x: Value, w: Value, bias: Value | undefined, stacked: StackedLora, adapterOfRow: Value): Value {
  const base = b.linear(x, w, bias);
  const aRows = b.gather(stacked.A, adapterOfRow, 0);
  const bRows = b.gather(stacked.B, adapterOfRow, 0);
  const shrink = b.matmul(x, aRows, { transposeB: true });
  const expand = b.matmul(shrink, bRows, { transposeB: true });
  const rank = x.type.shape.length;
  const s = b.reshape(b.gather(stacked.scales, adapterOfRow, 0), [-1, ...Array.from({ length: rank - 1 }, () => 1)]);
  return b.add(base, b.mul(expand, s));
}

/**
 * Chooses the bank form by a simple cost estimate: SGMV runs two small GEMMs per adapter group
 * (dispatch-bound when groups are many and tiny); BGMV gathers `rows × r × (in + out)` factor
 * elements and pads every row to the largest rank. Returns `grouped` unless gathering is cheaper.
 */
export function chooseBankForm(opts: {
  readonly rows: number;
  readonly groups: number;
  readonly ranks: readonly number[];
  readonly inDim: number;
  readonly outDim: number;
  /** Cost of one op dispatch in element-operations (executor-specific; default 20000). */
  readonly dispatchElements?: number;
}): 'grouped' | 'gathered' {
  const rMax = Math.max(0, ...opts.ranks);
  const dispatch = opts.dispatchElements ?? 20_000;
  const grouped = opts.groups * 6 * dispatch + opts.ranks.reduce((a, r) => a + r * (opts.inDim + opts.outDim), 0) * 2;
  const gathered = 6 * dispatch + opts.rows * rMax * (opts.inDim + opts.outDim) * 3;
  return gathered < grouped ? 'gathered' : 'grouped';
}
