import { RuntimeCode, RuntimeError } from '../errors.js';
import { loadCpuAddon } from './addon.js';

/** Options of `measureMemoryBandwidth`. */
export interface BandwidthProbeOptions {
  /** Bytes of the array streamed (default 512 MB: far beyond any last-level cache). */
  readonly bytes?: number;
  /** Timed passes, the best one kept (default 5). */
  readonly reps?: number;
  /**
   * Threads of the cpu-native pool to measure with (default: leave the pool as the last
   * `createCpuNativeExecutor` sized it, i.e. the threads the engine uses).
   */
  readonly threads?: number;
}

/** What `measureMemoryBandwidth` measured. */
export interface MemoryBandwidth {
  /** GB/s (10⁹ bytes) reading one array once, summing it: a decode step's access to its weights. */
  readonly readGBs: number;
  /** GB/s copying one array into another, both directions counted (STREAM's `copy`). */
  readonly copyGBs: number;
  /** Threads of the pool that ran the probe. */
  readonly threads: number;
  /** Bytes of the array. */
  readonly bytes: number;
}

/**
 * Measures this machine's memory bandwidth with the cpu-native executor's own thread pool (a
 * STREAM-like probe in the addon: the best of `reps` passes over an array much larger than the
 * caches). The yardstick for a decode step, which must read its weights, its adapters' factors and
 * the KV it attends at least once: that byte count ÷ `readGBs` is the step's roofline time.
 * Errors: `RT_BAD_VALUE` for a size under 1 MB or a thread count outside [1, 256];
 * `RT_BACKEND_UNAVAILABLE` when the addon cannot be loaded or built.
 */
export function measureMemoryBandwidth(opts: BandwidthProbeOptions = {}): MemoryBandwidth {
  const bytes = opts.bytes ?? 512e6;
  const reps = opts.reps ?? 5;
  if (!Number.isFinite(bytes) || bytes < 1e6) throw new RuntimeError(RuntimeCode.BAD_VALUE, `memory bandwidth probe: bytes must be at least 1e6, got ${String(bytes)}`);
  if (!Number.isSafeInteger(reps) || reps < 1 || reps > 1000) throw new RuntimeError(RuntimeCode.BAD_VALUE, `memory bandwidth probe: reps must be an integer in [1, 1000], got ${String(reps)}`);
  const addon = loadCpuAddon();
  let threads: number;
  if (opts.threads === undefined) threads = addon.threads(-1);
  else {
    if (!Number.isSafeInteger(opts.threads) || opts.threads < 1 || opts.threads > 256) throw new RuntimeError(RuntimeCode.BAD_VALUE, `memory bandwidth probe: threads must be an integer in [1, 256], got ${String(opts.threads)}`);
    threads = addon.threads(opts.threads);
  }
  const [readGBs, copyGBs] = addon.bandwidth(bytes, reps);
  return { readGBs, copyGBs, threads, bytes: Math.floor(bytes / 64) * 64 };
}

/** Options of `measureFmaPeak`. */
export interface FmaPeakOptions {
  /** Timed passes of about 10 ms, the best one kept (default 5). */
  readonly reps?: number;
  /** Threads of the cpu-native pool to measure with (default: as the last executor sized it). */
  readonly threads?: number;
}

/** What `measureFmaPeak` measured. */
export interface FmaPeak {
  /** f32 GFLOP/s (a multiply-add counts 2) of the pool's threads together. */
  readonly gflops: number;
  /** Threads of the pool that ran the probe. */
  readonly threads: number;
}

/**
 * Measures the f32 multiply-add rate of the cpu-native executor's thread pool: every thread runs
 * independent FMA chains in registers (no memory traffic), the best of `reps` passes. The
 * yardstick for compute-bound work: a step's FLOPs ÷ `gflops` is its compute floor, as its bytes
 * ÷ `measureMemoryBandwidth`'s `readGBs` are its roofline; a step is bound by the larger. On a
 * shared machine the rate reflects the cores the pool gets now.
 * Errors: `RT_BAD_VALUE` for reps outside [1, 1000] or a thread count outside [1, 256];
 * `RT_BACKEND_UNAVAILABLE` when the addon cannot be loaded or built, or predates the probe.
 */
export function measureFmaPeak(opts: FmaPeakOptions = {}): FmaPeak {
  const reps = opts.reps ?? 5;
  if (!Number.isSafeInteger(reps) || reps < 1 || reps > 1000) throw new RuntimeError(RuntimeCode.BAD_VALUE, `FMA peak probe: reps must be an integer in [1, 1000], got ${String(reps)}`);
  const addon = loadCpuAddon();
  if (addon.fmaPeak === undefined) throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'FMA peak probe: the loaded cpu-native addon has no fmaPeak() (a build older than ABI 6)');
  let threads: number;
  if (opts.threads === undefined) threads = addon.threads(-1);
  else {
    if (!Number.isSafeInteger(opts.threads) || opts.threads < 1 || opts.threads > 256) throw new RuntimeError(RuntimeCode.BAD_VALUE, `FMA peak probe: threads must be an integer in [1, 256], got ${String(opts.threads)}`);
    threads = addon.threads(opts.threads);
  }
  return { gflops: addon.fmaPeak(reps), threads };
}
