import type { AttrValue, DType, OpKey, TensorType } from '@stageml/ir';
import { chooseBankForm } from '@stageml/peft';
import type { CostModel } from '@stageml/rewrite';
import { PlanCode, PlanError } from './errors.js';
import { type ExecutorCapabilities, whyNotExecutable } from './executor-caps.js';
import { PLAN_KINDS, type PlanKind, type UnitGroup, type Workload } from './workload.js';

/** Memory and per-request time of one kind for one unit. */
export interface KindCost {
  /** Bytes of the constants this kind keeps resident for the unit (0 for `fallback`). */
  readonly memoryBytes: number;
  /** Seconds one request spends in this unit (its share of the batch's base GEMM included). */
  readonly seconds: number;
}

/** The form of the shared bank of one projection shape. */
export type BankForm = 'grouped' | 'gathered';

/** Every kind's numbers for the units of one group, and which kinds are usable there. */
export interface GroupCosts {
  /** Numbers of every kind, usable or not (for explanations). */
  readonly kinds: Readonly<Record<PlanKind, KindCost>>;
  /** Kinds the workload allows and the executor can run, in `PLAN_KINDS` order (never empty). */
  readonly usable: readonly PlanKind[];
  /** Form of the bank serving this shape (SGMV `grouped` or BGMV `gathered`). */
  readonly bankForm: BankForm;
  /** Rank the bank stores factors at (the largest rank of the shape when gathered). */
  readonly bankRank: number;
}

/** Knobs of the per-kind cost formulas. */
export interface KindCostOptions {
  /** Factor on the low-rank work of the generic path (`fallback`); ≥ 1, default 2. */
  readonly fallbackPenalty?: number;
  /** Bank form: chosen per projection shape by `chooseBankForm` (`auto`, default) or fixed. */
  readonly bankForm?: 'auto' | BankForm;
}

/** An operand: a shape in the workload's dtype, or an i64 index vector of a length. */
type Operand = readonly number[] | { readonly index: number };
type Op = [OpKey, readonly Operand[], readonly Operand[], Readonly<Record<string, AttrValue>>?];

/**
 * Computes per-kind memory and per-request seconds of each unit group through the cost model's
 * `opCost` on the ops each kind's form runs, with B = batch, R = ⌈seq·rowShare⌉ rows per request
 * and Rb = ⌈B·seq·rowShare⌉ rows per batch:
 *
 * - base = linear(x[Rb, in], W) / B, every kind's share of the batch's base GEMM;
 * - materialize = base (the merged weight replaces W);
 * - residual = base + linear(x[R, in], A) + linear(·, B) + mul + add on one request's rows;
 * - grouped-bank = base + the bank's ops: SGMV (`grouped`: index-select, two linears, scale,
 *   scatter-add on the request's rows) or BGMV (`gathered`: gathers, two batched matmuls at the
 *   bank rank, scale, add over the whole batch, divided by B);
 * - fallback = base + penalty · (residual − base).
 *
 * Results are cached by shape, so 32 identical layers of 1,000 adapters cost a few evaluations.
 */
export class KindCostTable {
  private readonly cache = new Map<string, Readonly<Record<PlanKind, KindCost>>>();
  private readonly banks = new Map<string, { form: BankForm; rank: number }>();
  private readonly penalty: number;

  /** Prepares the table for `workload`; the bank form of each projection shape is fixed here. */
  constructor(
    private readonly workload: Workload,
    private readonly costModel: CostModel,
    private readonly caps: ExecutorCapabilities,
    opts: KindCostOptions = {},
  ) {
    this.penalty = opts.fallbackPenalty ?? 2;
    if (!(this.penalty >= 1) || !Number.isFinite(this.penalty))
      throw new PlanError(PlanCode.BAD_OPTION, `fallbackPenalty must be a finite number ≥ 1, got ${String(this.penalty)}`);
    const ranks = new Map<string, { inDim: number; outDim: number; ranks: number[]; adapters: Set<string> }>();
    for (const a of workload.adapters) {
      for (const g of a.groups) {
        const key = bankKey(g);
        const e = ranks.get(key) ?? {
          inDim: g.inFeatures,
          outDim: g.outFeatures,
          ranks: [],
          adapters: new Set<string>(),
        };
        e.ranks.push(g.rank);
        e.adapters.add(a.name);
        ranks.set(key, e);
      }
    }
    const dispatchElements = this.dispatchElements();
    for (const [key, e] of ranks) {
      const form =
        opts.bankForm === undefined || opts.bankForm === 'auto'
          ? chooseBankForm({
              rows: workload.batch,
              groups: Math.min(workload.batch, e.adapters.size),
              ranks: [...new Set(e.ranks)],
              inDim: e.inDim,
              outDim: e.outDim,
              dispatchElements,
            })
          : opts.bankForm;
      this.banks.set(key, { form, rank: Math.max(...e.ranks) });
    }
  }

  /** Dispatch cost in element-operations, the unit `chooseBankForm` takes, from the cost model. */
  private dispatchElements(): number {
    const len = 1 << 20;
    const one = this.t(['add', [[1], [1]], [[1]]]);
    const big = this.t(['add', [[len], [len]], [[len]]]);
    const perElement = (big - one) / len;
    return perElement > 0 ? Math.max(1, one / perElement) : 20_000;
  }

  private t([op, operands, results, attrs]: Op): number {
    const dtype: DType = this.workload.dtype;
    const types = (xs: readonly Operand[]): TensorType[] => xs.map((x) => ('index' in x ? { dtype: 'i64', shape: [x.index] } : { dtype, shape: x }));
    return this.costModel.opCost(op, types(operands), types(results), attrs ?? {}, {}).seconds;
  }

  private bytes(shape: readonly number[]): number {
    return this.costModel.constantBytes({ dtype: this.workload.dtype, shape }, {});
  }

  /** Numbers and usable kinds of the units of group `g`. */
  costs(g: UnitGroup): GroupCosts {
    const bank = this.banks.get(bankKey(g)) ?? {
      form: 'grouped' as const,
      rank: g.rank,
    };
    const key = `${bankKey(g)}|${String(g.rank)}|${String(g.rowShare ?? 1)}`;
    let kinds = this.cache.get(key);
    if (kinds === undefined) {
      kinds = this.compute(g, bank);
      this.cache.set(key, kinds);
    }
    const allowed = g.allowed ?? PLAN_KINDS;
    const usable = PLAN_KINDS.filter((k) => allowed.includes(k) && whyNotExecutable(this.caps, k) === undefined);
    if (usable.length === 0) {
      const why = PLAN_KINDS.filter((k) => allowed.includes(k)).map((k) => whyNotExecutable(this.caps, k) ?? '');
      throw new PlanError(PlanCode.NOT_EXECUTABLE, `no allowed kind of ${g.projection} (${allowed.join(', ')}) is executable: ${why.join('; ')}`);
    }
    return {
      kinds,
      usable,
      bankForm: bank.form,
      bankRank: bank.form === 'gathered' ? bank.rank : g.rank,
    };
  }

  private compute(g: UnitGroup, bank: { form: BankForm; rank: number }): Record<PlanKind, KindCost> {
    const { batch, seq } = this.workload;
    const { inFeatures: i, outFeatures: o, rank: r } = g;
    const share = g.rowShare ?? 1;
    const rows = Math.max(1, Math.ceil(seq * share));
    const batchRows = Math.max(1, Math.ceil(batch * seq * share));
    const base =
      this.t([
        'linear',
        [
          [batchRows, i],
          [o, i],
        ],
        [[batchRows, o]],
      ]) / batch;
    const lowRank = (R: number, rank: number): number =>
      this.t([
        'linear',
        [
          [R, i],
          [rank, i],
        ],
        [[R, rank]],
      ]) +
      this.t([
        'linear',
        [
          [R, rank],
          [o, rank],
        ],
        [[R, o]],
      ]) +
      this.t(['mul', [[R, o], []], [[R, o]]]);
    const residualExtra =
      lowRank(rows, r) +
      this.t([
        'add',
        [
          [rows, o],
          [rows, o],
        ],
        [[rows, o]],
      ]);
    let bankExtra: number;
    if (bank.form === 'grouped') {
      bankExtra =
        this.t(['indexSelect', [[batchRows, i], { index: rows }], [[rows, i]], { axis: 0 }]) +
        lowRank(rows, r) +
        this.t(['scatterAdd', [[batchRows, o], { index: rows }, [rows, o]], [[batchRows, o]], { axis: 0 }]);
    } else {
      const rb = bank.rank;
      const perBatch =
        this.t(['gather', [[batch, rb, i], { index: batch }], [[batch, rb, i]], { axis: 0 }]) +
        this.t(['gather', [[batch, o, rb], { index: batch }], [[batch, o, rb]], { axis: 0 }]) +
        this.t([
          'matmul',
          [
            [batch, rows, i],
            [batch, rb, i],
          ],
          [[batch, rows, rb]],
          { transposeA: false, transposeB: true },
        ]) +
        this.t([
          'matmul',
          [
            [batch, rows, rb],
            [batch, o, rb],
          ],
          [[batch, rows, o]],
          { transposeA: false, transposeB: true },
        ]) +
        this.t(['gather', [[batch], { index: batch }], [[batch]], { axis: 0 }]) +
        this.t(['reshape', [[batch]], [[batch, 1, 1]]]) +
        this.t([
          'mul',
          [
            [batch, rows, o],
            [batch, 1, 1],
          ],
          [[batch, rows, o]],
        ]) +
        this.t([
          'add',
          [
            [batch, rows, o],
            [batch, rows, o],
          ],
          [[batch, rows, o]],
        ]);
      bankExtra = perBatch / batch;
    }
    const factorBytes = (rank: number): number => this.bytes([rank, i]) + this.bytes([o, rank]);
    return {
      materialize: { memoryBytes: this.bytes([o, i]), seconds: base },
      residual: { memoryBytes: factorBytes(r), seconds: base + residualExtra },
      'grouped-bank': {
        memoryBytes: factorBytes(bank.form === 'gathered' ? bank.rank : r),
        seconds: base + bankExtra,
      },
      fallback: {
        memoryBytes: 0,
        seconds: base + this.penalty * residualExtra,
      },
    };
  }
}

function bankKey(g: UnitGroup): string {
  return `${g.projection}|${String(g.inFeatures)}|${String(g.outFeatures)}|${g.experts === undefined ? 'dense' : String(g.experts)}`;
}
