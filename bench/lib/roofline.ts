// The decode step's physical limit: a STREAM-like probe of this machine's memory bandwidth (run in
// the same process and run as the measurements, on the cpu-native pool with the engine's threads),
// and the bytes a step must read at the least — each base weight once, each distinct adapter's
// factors once at its own rank (no slot padding), the KV each row attends — so that every decode
// case reports roofline ms = bytes ÷ bandwidth and measured ÷ roofline.
import { type FmaPeak, type MemoryBandwidth, measureFmaPeak, measureMemoryBandwidth } from '@stageml/runtime';

/** A Llama-family shape, as much of it as the byte count needs. */
export interface RooflineShape {
  readonly layers: number;
  readonly hidden: number;
  readonly intermediate: number;
  readonly heads: number;
  readonly kvHeads: number;
  /** Per-head width (default hidden ÷ heads). */
  readonly headDim?: number | undefined;
  readonly vocab: number;
}

/** Bytes one decode step must read, by what they are. */
export interface StepBytes {
  /** Base weights the step streams: every projection of every layer and the LM head (not the embedding table: one row a token). */
  readonly weights: number;
  /** Each distinct adapter's A and B once, at its own rank. */
  readonly factors: number;
  /** Keys and values every row attends (its whole context, every layer). */
  readonly kv: number;
}

const headDim = (s: RooflineShape): number => s.headDim ?? s.hidden / s.heads;

/** Parameters of the 7 projections of one layer (q, k, v, o, gate, up, down). */
export function projectionParams(s: RooflineShape): number {
  const q = s.heads * headDim(s);
  const kv = s.kvHeads * headDim(s);
  return s.hidden * (q + 2 * kv) + q * s.hidden + 3 * s.hidden * s.intermediate;
}

/** f32 bytes of A + B per unit of rank for an adapter on all 7 projections of every layer. */
export function factorBytesPerRank(s: RooflineShape): number {
  const q = s.heads * headDim(s);
  const kv = s.kvHeads * headDim(s);
  const perLayer = s.hidden + q + 2 * (s.hidden + kv) + q + s.hidden + 2 * (s.hidden + s.intermediate) + s.intermediate + s.hidden;
  return s.layers * perLayer * 4;
}

/**
 * Bytes per unit of rank of int8 factors' scales (`--adapter-dtype int8`): one f32 scale per rank
 * row of A and of B, for all 7 projections of every layer (the codes are `factorBytesPerRank` / 4).
 */
export function int8FactorScaleBytesPerRank(s: RooflineShape): number {
  return s.layers * 7 * 2 * 4;
}

/** Bytes of keys and values per attended position (every layer; f32 unless `bytesPerElement`). */
export function kvBytesPerPosition(s: RooflineShape, bytesPerElement = 4): number {
  return 2 * s.layers * s.kvHeads * headDim(s) * bytesPerElement;
}

/**
 * The least a decode step reads: the projections and the LM head at `bytesPerWeight` (4 for f32;
 * a block-quantized format's codes plus scales, e.g. 36/32 for int8 blocks of 32 with f32 scales),
 * the factors of the distinct adapters among `adapterRanks` (one entry per distinct adapter, its
 * rank; 4-byte factors unless `factorBytesPerElement`), and the KV of rows attending `contexts`
 * positions each.
 */
export function stepBytes(s: RooflineShape, o: { bytesPerWeight: number; adapterRanks: readonly number[]; contexts: readonly number[]; factorBytesPerElement?: number; kvBytesPerElement?: number }): StepBytes {
  const weights = (s.layers * projectionParams(s) + s.vocab * s.hidden) * o.bytesPerWeight;
  const factors = (o.adapterRanks.reduce((a, r) => a + r, 0) * factorBytesPerRank(s) * (o.factorBytesPerElement ?? 4)) / 4;
  const kv = o.contexts.reduce((a, c) => a + c, 0) * kvBytesPerPosition(s, o.kvBytesPerElement ?? 4);
  return { weights, factors, kv };
}

/** Total bytes of a step. */
export const totalBytes = (b: StepBytes): number => b.weights + b.factors + b.kv;

/** The time `bytes` need at the probe's read bandwidth, in ms. */
export function rooflineMs(bytes: StepBytes | number, bw: MemoryBandwidth): number {
  return ((typeof bytes === 'number' ? bytes : totalBytes(bytes)) / (bw.readGBs * 1e9)) * 1000;
}

/**
 * Probes the memory bandwidth on the cpu-native pool as it is now (create the engine's executor
 * first, so the probe runs with its threads). `BENCH_BW_BYTES` sets the array size (default 512 MB).
 */
export function probeBandwidth(threads?: number): MemoryBandwidth {
  const bytes = Number(process.env['BENCH_BW_BYTES'] ?? 512e6);
  return measureMemoryBandwidth({ bytes, reps: 5, ...(threads === undefined ? {} : { threads }) });
}

/**
 * The higher of two probes of one run (read bandwidth decides): on a shared machine the probe at
 * the start or at the end may meet other load, and the roofline wants the machine's limit.
 */
export function bestBandwidth(a: MemoryBandwidth, b: MemoryBandwidth): MemoryBandwidth {
  return b.readGBs > a.readGBs ? b : a;
}

/** One line for a results page: what the probe measured and how the roofline is counted. */
export function bandwidthNote(bw: MemoryBandwidth): string {
  return `**Roofline:** bandwidth probe of this run (STREAM-like, ${(bw.bytes / 1e6).toFixed(0)} MB array, best of 5 passes at the start and 5 at the end, ${String(bw.threads)} thread(s) of the cpu-native pool): read ${bw.readGBs.toFixed(1)} GB/s, copy ${bw.copyGBs.toFixed(1)} GB/s. A decode step's roofline = the bytes it must read at the least (each projection and the LM head once, each distinct adapter's factors once at its own rank, the KV every row attends) ÷ the read bandwidth; the ratio is measured ÷ roofline (1.00 = at the memory limit).`;
}

/**
 * Floating-point operations of one decode step (a multiply-add counts 2): every row through the
 * projections and the LM head, each row's LoRA shrink and expand at its own adapter's rank
 * (`rowRanks`, one entry per row), and each row's attention over its context (scores and values).
 */
export function stepFlops(s: RooflineShape, o: { rowRanks: readonly number[]; contexts: readonly number[] }): number {
  const dense = 2 * (s.layers * projectionParams(s) + s.vocab * s.hidden) * o.rowRanks.length;
  const lora = 2 * o.rowRanks.reduce((a, r) => a + r, 0) * (factorBytesPerRank(s) / 4);
  const attention = 4 * s.layers * s.heads * headDim(s) * o.contexts.reduce((a, c) => a + c, 0);
  return dense + lora + attention;
}

/** The time `flops` need at the probed FMA rate (`measureFmaPeak`), in ms: the step's compute floor. */
export function computeFloorMs(flops: number, peak: FmaPeak): number {
  return (flops / (peak.gflops * 1e9)) * 1000;
}

/** The higher of two FMA probes of one run (as `bestBandwidth`: the machine's limit is wanted). */
export function bestFmaPeak(a: FmaPeak, b: FmaPeak): FmaPeak {
  return b.gflops > a.gflops ? b : a;
}

/** The FMA probe on the cpu-native pool as it is now (the engine's threads). */
export function probeFmaPeak(): FmaPeak {
  return measureFmaPeak({ reps: 5 });
}
