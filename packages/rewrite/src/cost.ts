import { type AttrValue, type Dim, type DimBindings, type Graph, type OpKey, type TensorType, opDef, typeBytes } from '@stageml/ir';
import { RewriteError, RwCode } from './errors.js';

/** Work and estimated time of one execution (of an op, a subgraph or a request). */
export interface CostEstimate {
  /** Floating-point operations. */
  readonly flops: number;
  /** Bytes read and written. */
  readonly bytes: number;
  /** Estimated wall time in seconds. */
  readonly seconds: number;
}

/**
 * What rewrite guards ask about cost. The analytic default (`analyticCostModel`) reads the IR
 * registry's FLOP and byte counts and applies a roofline; the planner may supply a calibrated
 * model with the same interface. All sizes are per request: symbolic dims (`batch`, `seq`) are
 * evaluated at `sizes`.
 */
export interface CostModel {
  /** Cost of one execution of op `op` with these operand and result types and attributes. */
  opCost(op: OpKey, operands: readonly TensorType[], results: readonly TensorType[], attrs: Readonly<Record<string, AttrValue>>, sizes: DimBindings): CostEstimate;
  /** Total cost of the op nodes of `graph` (only those `include` accepts, when given: e.g. the dynamic ones). */
  requestCost(graph: Graph, sizes: DimBindings, include?: (nodeIndex: number) => boolean): CostEstimate;
  /** Bytes a constant of type `type` occupies once materialized. */
  constantBytes(type: TensorType, sizes: DimBindings): number;
}

/** Parameters of the analytic roofline model. */
export interface AnalyticCostOptions {
  /** Peak arithmetic throughput in FLOP/s (default 4.94e14: H200 SXM, dense TF32 tensor cores). */
  readonly peakFlopsPerSecond?: number;
  /** Memory bandwidth in bytes/s (default 4.8e12: H200 SXM HBM3e). */
  readonly bytesPerSecond?: number;
  /** Fixed time added to every op execution, e.g. a kernel launch (default 0). */
  readonly opOverheadSeconds?: number;
}

/**
 * Evaluates a dim at `sizes`; symbols without a size count as 1 (a cost estimate must not fail on
 * a dim the caller did not size, and 1 is the smallest non-empty size).
 */
export function evalDimAt(d: Dim, sizes: DimBindings): number {
  if (typeof d === 'number') return d;
  let acc = d.constant;
  for (const t of d.terms) {
    let v = t.coef;
    for (const name of t.vars) v *= sizes[name] ?? 1;
    acc += v;
  }
  return acc;
}

function positive(name: string, v: number): number {
  if (!(v > 0) || !Number.isFinite(v)) throw new RewriteError(RwCode.BAD_OPTION, `${name} must be a positive finite number, got ${String(v)}`);
  return v;
}

/**
 * The analytic cost model: FLOPs and bytes from each op's registry `cost`, evaluated at the
 * request's sizes, and time from a roofline, `max(flops / peak, bytes / bandwidth) + overhead`.
 */
export function analyticCostModel(opts: AnalyticCostOptions = {}): CostModel {
  const peak = positive('peakFlopsPerSecond', opts.peakFlopsPerSecond ?? 4.94e14);
  const bandwidth = positive('bytesPerSecond', opts.bytesPerSecond ?? 4.8e12);
  const overhead = opts.opOverheadSeconds ?? 0;
  if (!(overhead >= 0) || !Number.isFinite(overhead)) throw new RewriteError(RwCode.BAD_OPTION, `opOverheadSeconds must be ≥ 0, got ${String(overhead)}`);
  // NOTE: types are made concrete first, so the registry's cost formulas run on numbers rather
  // than on symbolic polynomials (the same value, an order of magnitude faster).
  const concrete = (t: TensorType, sizes: DimBindings): TensorType => ({ dtype: t.dtype, shape: t.shape.map((d) => evalDimAt(d, sizes)) });
  const opCost = (op: OpKey, operands: readonly TensorType[], results: readonly TensorType[], attrs: Readonly<Record<string, AttrValue>>, sizes: DimBindings): CostEstimate => {
    const c = opDef(op).cost(
      operands.map((t) => concrete(t, sizes)),
      results.map((t) => concrete(t, sizes)),
      attrs,
    );
    const flops = evalDimAt(c.flops, sizes);
    const bytes = evalDimAt(c.bytes, sizes);
    return { flops, bytes, seconds: Math.max(flops / peak, bytes / bandwidth) + overhead };
  };
  return {
    opCost,
    requestCost(graph, sizes, include) {
      let flops = 0;
      let bytes = 0;
      let seconds = 0;
      graph.nodes.forEach((n, i) => {
        if (n.kind !== 'op' || (include !== undefined && !include(i))) return;
        const c = opCost(
          n.op,
          n.operands.map((v) => graph.values[v]!.type),
          n.results.map((v) => graph.values[v]!.type),
          n.attrs,
          sizes,
        );
        flops += c.flops;
        bytes += c.bytes;
        seconds += c.seconds;
      });
      return { flops, bytes, seconds };
    },
    constantBytes: (type, sizes) => evalDimAt(typeBytes(type), sizes),
  };
}
