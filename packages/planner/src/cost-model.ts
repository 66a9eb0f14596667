import { type AttrValue, type DimBindings, type Graph, type OpKey, type TensorType, opsWithTrait } from '@stageml/ir';
import { type AnalyticCostOptions, type CostEstimate, type CostModel, analyticCostModel, evalDimAt } from '@stageml/rewrite';
import { type Calibration, type GemmMeasurement, gemmShapeClass } from './calibration.js';
import { PlanCode, PlanError } from './errors.js';

/**
 * A cost model the planner (and the rewrite driver) can use: `@stageml/rewrite`'s `CostModel`
 * interface, plus where its numbers come from.
 */
export interface PlannerCostModel extends CostModel {
  /** `calibrated` when built from measurements, `analytic` for the roofline fallback. */
  readonly source: 'analytic' | 'calibrated';
  /** One line naming the source: `analytic roofline (…)` or `calibrated: <executor> on <machine>, <date>`. */
  readonly description: string;
}

/** Options of `plannerCostModel`: a calibration, and roofline parameters for the fallback. */
export interface PlannerCostOptions extends AnalyticCostOptions {
  /** Measurements of the executor on this machine; without one the analytic roofline is used. */
  readonly calibration?: Calibration;
}

// Contractions by registry trait: a new `contraction` op is costed from GEMM measurements too.
const CONTRACTIONS = opsWithTrait('contraction');

/** (k, n) of a contraction op from its weight-like operand; m follows from the FLOP count. */
function contractionKN(op: OpKey, operands: readonly TensorType[], attrs: Readonly<Record<string, AttrValue>>, sizes: DimBindings): [number, number] {
  const dims = (t: TensorType | undefined): number[] => (t === undefined ? [] : t.shape.map((d) => evalDimAt(d, sizes)));
  if (op === 'linear') {
    const [n = 1, k = 1] = dims(operands[1]);
    return [k, n];
  }
  if (op === 'groupedMatmul') {
    const w = dims(operands[1]);
    const [a = 1, b = 1] = w.slice(-2);
    return attrs['transposeW'] === true ? [b, a] : [a, b];
  }
  const rhs = dims(operands[1]);
  const [a = 1, b = 1] = rhs.slice(-2);
  return attrs['transposeB'] === true ? [b, a] : [a, b];
}

function nearest(points: readonly GemmMeasurement[], m: number, k: number, n: number): GemmMeasurement | undefined {
  const cls = gemmShapeClass(m, k, n);
  const pool = points.some((p) => p.shapeClass === cls) ? points.filter((p) => p.shapeClass === cls) : points;
  let best: GemmMeasurement | undefined;
  let bestD = Number.POSITIVE_INFINITY;
  for (const p of pool) {
    const d = Math.log(m / p.m) ** 2 + Math.log(k / p.k) ** 2 + Math.log(n / p.n) ** 2;
    if (d < bestD) {
      best = p;
      bestD = d;
    }
  }
  return best;
}

/**
 * The planner's cost model. With a calibration: every op costs the measured dispatch time plus,
 * for contractions (`linear`, `matmul`, `groupedMatmul`), FLOPs at the rate measured for the
 * nearest GEMM shape of the same class (log-distance in m, k, n), and for every other op its
 * bytes at the measured streaming rate. FLOP and byte counts come from the IR registry, through
 * the analytic model. Without a calibration it is `@stageml/rewrite`'s analytic roofline,
 * max(flops / peak, bytes / bandwidth) + overhead, with the given peak and bandwidth.
 */
export function plannerCostModel(opts: PlannerCostOptions = {}): PlannerCostModel {
  const analytic = analyticCostModel(opts);
  const cal = opts.calibration;
  if (cal === undefined) {
    const peak = opts.peakFlopsPerSecond ?? 4.94e14;
    const bw = opts.bytesPerSecond ?? 4.8e12;
    const overhead = opts.opOverheadSeconds ?? 0;
    return {
      ...analytic,
      source: 'analytic',
      description: `analytic roofline (peak ${peak.toExponential(3)} FLOP/s, ${bw.toExponential(3)} B/s, ${String(overhead * 1e6)} µs per op)`,
    };
  }
  if (cal.gemm.length === 0) throw new PlanError(PlanCode.BAD_CALIBRATION, 'the calibration has no GEMM measurements', { path: '$.gemm' });
  const dispatch = cal.dispatchUs * 1e-6;
  const opCost = (op: OpKey, operands: readonly TensorType[], results: readonly TensorType[], attrs: Readonly<Record<string, AttrValue>>, sizes: DimBindings): CostEstimate => {
    const { flops, bytes } = analytic.opCost(op, operands, results, attrs, sizes);
    if (CONTRACTIONS.has(op) && flops > 0) {
      const [k, n] = contractionKN(op, operands, attrs, sizes);
      const m = Math.max(1, flops / (2 * k * n));
      const rate = nearest(cal.gemm, m, k, n)!.flopsPerSecond;
      return { flops, bytes, seconds: dispatch + flops / rate };
    }
    return { flops, bytes, seconds: dispatch + bytes / cal.bytesPerSecond };
  };
  return {
    source: 'calibrated',
    description: `calibrated: ${cal.executor} on ${cal.machine}, ${cal.date}`,
    opCost,
    requestCost(graph: Graph, sizes: DimBindings, include?: (nodeIndex: number) => boolean): CostEstimate {
      let flops = 0;
      let bytes = 0;
      let seconds = 0;
      graph.nodes.forEach((node, i) => {
        if (node.kind !== 'op' || (include !== undefined && !include(i))) return;
        const c = opCost(
          node.op,
          node.operands.map((v) => graph.values[v]!.type),
          node.results.map((v) => graph.values[v]!.type),
          node.attrs,
          sizes,
        );
        flops += c.flops;
        bytes += c.bytes;
        seconds += c.seconds;
      });
      return { flops, bytes, seconds };
    },
    constantBytes: (type, sizes) => analytic.constantBytes(type, sizes),
  };
}
