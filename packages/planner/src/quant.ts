import { type HostTensor, type PackedWeight, dequantizeWeight, quantizeWeight } from '@stageml/ir';
import { PlanCode, PlanError } from './errors.js';
import { PLAN_KINDS, type PlanKind } from './workload.js';

/** Symmetric integer quantization: bits and the block one scale covers. */
export interface QuantConfig {
  /** 8 (int8, q ∈ [−127, 127]) or 4 (int4, q ∈ [−7, 7]); the restricted symmetric range. */
  readonly bits: 8 | 4;
  /** One scale per output row (`channel`), or per `group` consecutive input elements of a row. */
  readonly granularity: 'channel' | { readonly group: number };
}

/** A quantized [rows, cols] matrix: q ∈ [−qmax, qmax] and one scale per block of `blockCols` columns of a row. */
export interface QuantizedMatrix {
  /** Rows. */
  readonly rows: number;
  /** Columns. */
  readonly cols: number;
  /** Columns per block (cols for per-channel). */
  readonly blockCols: number;
  /** Integer values, row-major. */
  readonly q: Int8Array;
  /** Scales, [rows, ⌈cols / blockCols⌉] row-major. */
  readonly scales: Float64Array;
}

/** Unit roundoff of float64. */
const U = 2 ** -53;

/** Round half to even (PyTorch's `torch.round`), not JavaScript's half-up `Math.round`. */
export function roundHalfEven(v: number): number {
  const f = Math.floor(v);
  const d = v - f;
  if (d < 0.5) return f;
  if (d > 0.5) return f + 1;
  return f % 2 === 0 ? f : f + 1;
}

function qmaxOf(cfg: QuantConfig): number {
  // NOTE: typed 8 | 4, but configurations come from JSON and flags too.
  const bits: number = cfg.bits;
  if (bits !== 8 && bits !== 4) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `bits must be 8 or 4, got ${String(bits)}`);
  return 2 ** (bits - 1) - 1;
}

function blockColsOf(cfg: QuantConfig, cols: number): number {
  if (cfg.granularity === 'channel') return cols;
  const g = cfg.granularity.group;
  if (!Number.isSafeInteger(g) || g < 1) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `group size must be a positive integer, got ${String(g)}`);
  return Math.min(g, cols);
}

/**
 * Symmetric quantization of a row-major [rows, cols] matrix: per block, scale = max(max|m|, 1e-12)
 * / qmax and q = round-half-even(m / scale). |m / scale| ≤ qmax, so no value is clamped.
 */
export function quantizeSymmetric(m: ArrayLike<number>, rows: number, cols: number, cfg: QuantConfig): QuantizedMatrix {
  const qmax = qmaxOf(cfg);
  const blockCols = blockColsOf(cfg, cols);
  const blocks = Math.ceil(cols / blockCols);
  const q = new Int8Array(rows * cols);
  const scales = new Float64Array(rows * blocks);
  for (let r = 0; r < rows; r++) {
    for (let b = 0; b < blocks; b++) {
      const lo = r * cols + b * blockCols;
      const hi = r * cols + Math.min(cols, (b + 1) * blockCols);
      let amax = 0;
      for (let i = lo; i < hi; i++) amax = Math.max(amax, Math.abs(m[i]!));
      const s = Math.max(amax, 1e-12) / qmax;
      scales[r * blocks + b] = s;
      for (let i = lo; i < hi; i++) q[i] = Math.max(-qmax, Math.min(qmax, roundHalfEven(m[i]! / s)));
    }
  }
  return { rows, cols, blockCols, q, scales };
}

/** Value (o, i) of a quantized matrix, dequantized: q · scale. */
export function dequantizedAt(m: QuantizedMatrix, o: number, i: number): number {
  return m.q[o * m.cols + i]! * m.scales[o * Math.ceil(m.cols / m.blockCols) + Math.floor(i / m.blockCols)]!;
}

/** Inputs of the analysis: base weight W [out, in] and LoRA factors A [r, in], B [out, r] with scale s. */
export interface QuantAnalysisInput {
  /** Base weight W [out, in]. */
  readonly weight: HostTensor;
  /** LoRA A [r, in]. */
  readonly A: HostTensor;
  /** LoRA B [out, r]. */
  readonly B: HostTensor;
  /** LoRA scale s. */
  readonly scale: number;
}

/**
 * Merge-then-quantize versus quantized base plus exact delta, for one layer:
 * E = QD(W') − (QD(W) + D), D = s·B·A, W' = W + D, and Δy = x·Eᵀ.
 */
export interface QuantAnalysis {
  /** The quantization. */
  readonly config: QuantConfig;
  /** Quantized base. */
  readonly base: QuantizedMatrix;
  /** Quantized merged weight. */
  readonly merged: QuantizedMatrix;
  /** The delta D = s·B·A, row-major [out, in] (float64). */
  readonly delta: Float64Array;
  /** Per-block bound on |E| (same layout as the scales): (s'_b + s_b)/2 plus float64 rounding terms. */
  readonly entryBound: Float64Array;
  /** G with ‖Δy‖₂ ≤ G·‖x‖₂ for every x: min(‖U‖_F, √(‖U‖₁·‖U‖∞)) of the elementwise bound U. A priori (scales only). */
  readonly gainBound: number;
  /**
   * ‖E‖_F of the actual quantized matrices (slightly inflated for float64 rounding): a posteriori,
   * and also a gain bound (‖E·x‖ ≤ ‖E‖₂‖x‖ ≤ ‖E‖_F‖x‖), never above `gainBound`. Much tighter when
   * the delta is small against the quantization step (both roundings then mostly agree).
   */
  readonly gain: number;
  /** ‖QD(W) + D‖_F, the dynamic path's weight. */
  readonly referenceNorm: number;
  /** Bound on ‖E‖_F: min(‖U‖_F, ‖E‖_F measured, inflated for rounding). */
  readonly frobeniusBound: number;
  /**
   * frobeniusBound / referenceNorm. For inputs with covariance σ²·I, E‖Δy‖² = σ²‖E‖²_F and
   * E‖y‖² = σ²‖QD(W) + D‖²_F, so this bounds the root-mean-square relative output error.
   */
  readonly relativeWeightBound: number;
}

function dims(t: HostTensor, name: string): [number, number] {
  if (t.shape.length !== 2) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `${name} must be a matrix, got shape [${t.shape.join(', ')}]`);
  return [t.shape[0]!, t.shape[1]!];
}

/**
 * Analyses quantizing the merged weight W' = W + s·B·A against quantizing W and adding the exact
 * delta. Per entry, |QD(M) − M| ≤ scale·(1/2 + 3u·qmax) (rounding to the nearest integer moves at
 * most half a step; u = 2⁻⁵³ covers the float64 divide and multiply), and forming W' in float64
 * adds at most u·|W'| ≤ u·qmax·s'·(1 + u). So |E| ≤ U elementwise with U constant on each block,
 * and ‖Δy‖ = ‖E·x‖ ≤ ‖E‖₂‖x‖ ≤ ‖U‖₂‖x‖ ≤ min(‖U‖_F, √(‖U‖₁‖U‖∞))·‖x‖ (|E| ≤ U ⇒ ‖E‖₂ ≤ ‖U‖₂
 * for non-negative U; Frobenius and Hölder bound ‖U‖₂). See docs/planner.md for the derivation.
 */
export function analyzeQuantization(input: QuantAnalysisInput, config: QuantConfig): QuantAnalysis {
  const [out, inDim] = dims(input.weight, 'weight');
  const [r, inA] = dims(input.A, 'A');
  const [outB, rB] = dims(input.B, 'B');
  if (inA !== inDim || outB !== out || rB !== r) {
    throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `shapes do not fit: W [${String(out)}, ${String(inDim)}], A [${String(r)}, ${String(inA)}], B [${String(outB)}, ${String(rB)}]`);
  }
  if (!Number.isFinite(input.scale)) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `the LoRA scale must be finite, got ${String(input.scale)}`);
  const qmax = qmaxOf(config);
  const W = input.weight.data;
  const delta = new Float64Array(out * inDim);
  const mergedW = new Float64Array(out * inDim);
  for (let o = 0; o < out; o++) {
    for (let i = 0; i < inDim; i++) {
      let acc = 0;
      for (let j = 0; j < r; j++) acc += input.B.data[o * r + j]! * input.A.data[j * inDim + i]!;
      const d = input.scale * acc;
      delta[o * inDim + i] = d;
      mergedW[o * inDim + i] = W[o * inDim + i]! + d;
    }
  }
  const base = quantizeSymmetric(W, out, inDim, config);
  const merged = quantizeSymmetric(mergedW, out, inDim, config);
  const blocks = Math.ceil(inDim / base.blockCols);
  const entryBound = new Float64Array(out * blocks);
  const colSums = new Float64Array(inDim);
  let fro2 = 0;
  let rowMax = 0;
  for (let o = 0; o < out; o++) {
    let rowSum = 0;
    for (let b = 0; b < blocks; b++) {
      const s = base.scales[o * blocks + b]!;
      const sm = merged.scales[o * blocks + b]!;
      const u = (s + sm) * (0.5 + 3 * U * qmax) + U * qmax * sm * (1 + U);
      entryBound[o * blocks + b] = u;
      const width = Math.min(inDim, (b + 1) * base.blockCols) - b * base.blockCols;
      fro2 += u * u * width;
      rowSum += u * width;
      for (let i = b * base.blockCols; i < b * base.blockCols + width; i++) colSums[i] = colSums[i]! + u;
    }
    rowMax = Math.max(rowMax, rowSum);
  }
  const colMax = colSums.reduce((a, v) => Math.max(a, v), 0);
  // NOTE: (1 + 1e-12) absorbs the float64 rounding of these sums and square roots.
  const gainBound = Math.min(Math.sqrt(fro2), Math.sqrt(colMax * rowMax)) * (1 + 1e-12);
  let e2 = 0;
  let ref2 = 0;
  for (let o = 0; o < out; o++) {
    for (let i = 0; i < inDim; i++) {
      const dyn = dequantizedAt(base, o, i) + delta[o * inDim + i]!;
      const e = dequantizedAt(merged, o, i) - dyn;
      e2 += e * e;
      ref2 += dyn * dyn;
    }
  }
  const referenceNorm = Math.sqrt(ref2);
  const measured = Math.sqrt(e2) * (1 + 1e-12);
  const gain = Math.min(gainBound, measured);
  const frobeniusBound = Math.min(Math.sqrt(fro2) * (1 + 1e-12), measured);
  return {
    config,
    base,
    merged,
    delta,
    entryBound,
    gainBound,
    gain,
    referenceNorm,
    frobeniusBound,
    relativeWeightBound: referenceNorm > 0 ? frobeniusBound / referenceNorm : frobeniusBound > 0 ? Number.POSITIVE_INFINITY : 0,
  };
}

/** Output-space numbers of an analysis on activations X [n, in]. */
export interface OutputErrorBound {
  /** Sound bound on ‖ΔY‖_F: √(Σ_rows min(‖U·|x|‖, gain·‖x‖)²), per row the elementwise triangle inequality or the gain bound. */
  readonly bound: number;
  /** ‖X·(QD(W) + D)ᵀ‖_F, the dynamic path's output. */
  readonly reference: number;
  /** bound / reference (∞ when the reference is 0 and the bound is not). */
  readonly relative: number;
}

/** Bounds the output error of `analysis` on activations `x` [n, in] (rows are tokens). */
export function outputErrorBound(analysis: QuantAnalysis, x: HostTensor): OutputErrorBound {
  const { rows: out, cols: inDim, blockCols } = analysis.base;
  const [n, inX] = dims(x, 'x');
  if (inX !== inDim) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `x has ${String(inX)} features, the layer takes ${String(inDim)}`);
  const blocks = Math.ceil(inDim / blockCols);
  const absBlock = new Float64Array(blocks);
  let bound2 = 0;
  let ref2 = 0;
  for (let t = 0; t < n; t++) {
    absBlock.fill(0);
    let x2 = 0;
    for (let i = 0; i < inDim; i++) {
      const v = x.data[t * inDim + i]!;
      absBlock[Math.floor(i / blockCols)] = absBlock[Math.floor(i / blockCols)]! + Math.abs(v);
      x2 += v * v;
    }
    let row2 = 0;
    for (let o = 0; o < out; o++) {
      let b = 0;
      for (let k = 0; k < blocks; k++) b += analysis.entryBound[o * blocks + k]! * absBlock[k]!;
      row2 += b * b;
      let y = 0;
      for (let i = 0; i < inDim; i++) y += (dequantizedAt(analysis.base, o, i) + analysis.delta[o * inDim + i]!) * x.data[t * inDim + i]!;
      ref2 += y * y;
    }
    bound2 += Math.min(row2, analysis.gain * analysis.gain * x2);
  }
  const bound = Math.sqrt(bound2) * (1 + 1e-12);
  const reference = Math.sqrt(ref2);
  return {
    bound,
    reference,
    relative: reference > 0 ? bound / reference : bound > 0 ? Number.POSITIVE_INFINITY : 0,
  };
}

/**
 * The quantization gate's decision: `accept` when the sound bound is within `threshold`. With
 * activations the bound is on the relative output error ‖ΔY‖/‖Y‖ on them (`outputErrorBound`);
 * without, the weight-space bound ‖E‖_F / ‖QD(W) + D‖_F (which bounds the root-mean-square
 * relative output error for isotropic inputs). An expected outcome, so a discriminated union rather than
 * an error.
 */
export interface QuantDecision {
  /** `accept` when `bound ≤ threshold`. */
  readonly kind: 'accept' | 'reject';
  /** What the bound is on. */
  readonly measure: 'relative-output' | 'relative-weight';
  /** The sound bound the decision used. */
  readonly bound: number;
  /** The threshold it was compared with. */
  readonly threshold: number;
}

/** Decides whether materializing a merged weight under `analysis`'s quantization is acceptable at `threshold`. */
export function acceptQuantization(analysis: QuantAnalysis, threshold: number, x?: HostTensor): QuantDecision {
  if (!(threshold >= 0) || !Number.isFinite(threshold)) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `threshold must be a finite number ≥ 0, got ${String(threshold)}`);
  const [measure, bound] = x === undefined ? (['relative-weight', analysis.relativeWeightBound] as const) : (['relative-output', outputErrorBound(analysis, x).relative] as const);
  return {
    kind: bound <= threshold ? 'accept' : 'reject',
    measure,
    bound,
    threshold,
  };
}

/**
 * Parses a quantization spec: `int8` / `int4` (per output channel) or `int8:g<N>` / `int4:g<N>`
 * (per group of N inputs). Anything else is `PLAN_BAD_QUANT_CONFIG`.
 */
export function parseQuantConfig(spec: string): QuantConfig {
  const m = /^int(8|4)(?::g(\d+))?$/.exec(spec.trim());
  if (m === null) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `quantization must be int8, int4, int8:g<N> or int4:g<N>, got '${spec}'`);
  const bits = m[1] === '8' ? 8 : 4;
  return m[2] === undefined ? { bits, granularity: 'channel' } : { bits, granularity: { group: Number(m[2]) } };
}

/** The kinds a unit may take after the gate: every kind when accepted, all but `materialize` when rejected. */
export function kindsAfterGate(decision: QuantDecision): PlanKind[] {
  return PLAN_KINDS.filter((k) => decision.kind === 'accept' || k !== 'materialize');
}

/** Measured error of a packed (executable) weight against the weight it came from. */
export interface WeightQuantError {
  /** Per [out, blocks] block: max |Ŵ − W| over the block, plus f32 rounding of the dequantized value. */
  readonly entryBound: Float64Array;
  /** Inputs per block. */
  readonly blockSize: number;
  /** Bound on ‖Ŵ − W‖_F. */
  readonly frobenius: number;
  /** ‖W‖_F. */
  readonly reference: number;
  /** frobenius / reference: bounds the RMS relative output error for isotropic inputs. */
  readonly relative: number;
  /** The dequantized weight Ŵ [out, in] (float64). */
  readonly dequantized: Float64Array;
}

const F32_U = 2 ** -24;

/**
 * Measures what executing `packed` (a `quantizedLinear`'s operands) instead of `weight` [out, in]
 * changes: entrywise |Ŵ − W| per block (a posteriori, exact in float64; plus 2⁻²⁴|Ŵ| for kernels
 * that form Ŵ in f32), and the relative Frobenius error the quantization gate compares.
 */
export function weightQuantizationError(weight: HostTensor, packed: PackedWeight): WeightQuantError {
  const [out, inF] = dims(weight, 'weight');
  const { bits, blockSize, inFeatures } = packed.attrs;
  if (inFeatures !== inF || packed.qweight.shape[0] !== out) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `packed weight is [${String(packed.qweight.shape[0])}, ${String(inFeatures)}], the weight [${String(out)}, ${String(inF)}]`);
  const deq = dequantizeWeight(packed.qweight, packed.scales, packed.zeroPoints, bits, blockSize, inFeatures);
  const blocks = Math.ceil(inF / blockSize);
  const entryBound = new Float64Array(out * blocks);
  let e2 = 0;
  let r2 = 0;
  for (let o = 0; o < out; o++) {
    for (let i = 0; i < inF; i++) {
      const k = o * inF + i;
      const e = Math.abs(deq[k]! - weight.data[k]!) + F32_U * Math.abs(deq[k]!);
      const bi = o * blocks + Math.floor(i / blockSize);
      if (e > entryBound[bi]!) entryBound[bi] = e;
      e2 += e * e;
      r2 += weight.data[k]! * weight.data[k]!;
    }
  }
  const frobenius = Math.sqrt(e2) * (1 + 1e-12);
  const reference = Math.sqrt(r2);
  return { entryBound, blockSize, frobenius, reference, relative: reference > 0 ? frobenius / reference : frobenius > 0 ? Number.POSITIVE_INFINITY : 0, dequantized: deq };
}

/**
 * A sound bound on ‖X·Ŵᵀ(computed) − X·Wᵀ‖_F for activations X [n, in] when a kernel runs the
 * packed weight: per output, Σ_blocks entryBound·‖x_block‖₁ (the weight's error), plus, with
 * `int8Activations` (onnxruntime MatMulNBits accuracy level 4, llama.cpp's Q8_0/Q4_0 dot
 * products), (s/2)·Σᵢ|Ŵ_oi| with s = max|x_row| / 127 (any activation blocking rounds each x_i by
 * at most half its block's step, and no block's step exceeds the row's), plus (K + 16)·2⁻²²·Σᵢ|x_i||Ŵ_oi|
 * for f32 accumulation and scale arithmetic.
 */
export function quantizedLinearErrorBound(err: WeightQuantError, x: HostTensor, opts: { readonly int8Activations?: boolean } = {}): OutputErrorBound {
  const [n, inF] = dims(x, 'x');
  const out = err.dequantized.length / inF;
  if (!Number.isInteger(out)) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `x has ${String(inF)} features, which do not divide the weight`);
  const nb = Math.ceil(inF / err.blockSize);
  const slack = (inF + 16) * 2 ** -22;
  let bound2 = 0;
  let ref2 = 0;
  const absBlock = new Float64Array(nb);
  for (let t = 0; t < n; t++) {
    absBlock.fill(0);
    let amax = 0;
    for (let i = 0; i < inF; i++) {
      const v = Math.abs(x.data[t * inF + i]!);
      absBlock[Math.floor(i / err.blockSize)] = absBlock[Math.floor(i / err.blockSize)]! + v;
      amax = Math.max(amax, v);
    }
    const half = opts.int8Activations === true ? (amax / 127 / 2) * (1 + 1e-5) : 0;
    for (let o = 0; o < out; o++) {
      let b = 0;
      for (let k = 0; k < nb; k++) b += err.entryBound[o * nb + k]! * absBlock[k]!;
      let absW = 0;
      let absXW = 0;
      let y = 0;
      for (let i = 0; i < inF; i++) {
        const w = err.dequantized[o * inF + i]!;
        const xv = x.data[t * inF + i]!;
        absW += Math.abs(w);
        absXW += Math.abs(w * xv);
        y += (w * xv);
      }
      b += half * absW + slack * absXW;
      bound2 += b * b;
      ref2 += y * y;
    }
  }
  const bound = Math.sqrt(bound2) * (1 + 1e-12);
  const reference = Math.sqrt(ref2);
  return { bound, reference, relative: reference > 0 ? bound / reference : bound > 0 ? Number.POSITIVE_INFINITY : 0 };
}

/** A weight quantization candidate of `weightQuantChooser`, as `quantizeWeight` takes it. */
export interface WeightQuantCandidate {
  readonly bits: 4 | 8;
  readonly blockSize: number;
  readonly symmetric?: boolean;
}

/**
 * `--quantize auto --max-error E`: per weight, the first candidate (default int4 then int8, blocks
 * of 32, symmetric) whose relative weight error ‖Ŵ − W‖_F / ‖W‖_F (the gate's `relative-weight`
 * measure) is ≤ `maxError`; `undefined` (stay f32) when none is. Decisions are recorded in
 * `decisions` by weight name.
 */
export function weightQuantChooser(
  maxError: number,
  candidates: readonly WeightQuantCandidate[] = [{ bits: 4, blockSize: 32 }, { bits: 8, blockSize: 32 }],
  decisions?: Map<string, { readonly choice: WeightQuantCandidate | undefined; readonly relative: number }>,
): (name: string, weight: HostTensor) => WeightQuantCandidate | undefined {
  if (!(maxError >= 0) || !Number.isFinite(maxError)) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `max error must be a finite number ≥ 0, got ${String(maxError)}`);
  return (name, weight) => {
    if (name.startsWith('adapter.') || /lora/i.test(name)) return undefined;
    const [out, inF] = dims(weight, name);
    let last = Number.POSITIVE_INFINITY;
    for (const c of candidates) {
      const packed = quantizeWeight(weight.data, out, inF, { bits: c.bits, blockSize: c.blockSize, symmetric: c.symmetric ?? true });
      last = weightQuantizationError(weight, packed).relative;
      if (last <= maxError) {
        decisions?.set(name, { choice: c, relative: last });
        return c;
      }
    }
    decisions?.set(name, { choice: undefined, relative: last });
    return undefined;
  };
}
