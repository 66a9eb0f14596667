import { readFile, rename, writeFile } from 'node:fs/promises';
import { arch, cpus, platform, tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Graph, GraphBuilder, type HostTensor, interpret, seededRandom, errorMessage } from '@stageml/ir';

import { RuntimeCode, RuntimeError } from '../errors.js';
import type { Executor } from '../executor.js';
import { interpreterExecutor } from '../interpreter-executor.js';
import { loadOrt } from './binding.js';
import { createOrtExecutor } from './executor.js';

/** Executors that can be asked for by name, fastest kinds first. */
export const EXECUTOR_NAMES = ['onnxruntime', 'cpu-native', 'tfjs-wasm', 'tfjs-cpu', 'interpreter', 'torch'] as const;

/** An executor name (`--executor`, `STAGEML_EXECUTOR`). */
export type ExecutorName = (typeof EXECUTOR_NAMES)[number];

/** Whether `name` is an executor name. */
export function isExecutorName(name: string): name is ExecutorName {
  return (EXECUTOR_NAMES as readonly string[]).includes(name);
}

/**
 * Creates the executor called `name`. Errors: an executor whose runtime does not load here is
 * `RT_BACKEND_UNAVAILABLE` naming the cause (never a silent fallback).
 */
export async function createExecutorByName(name: ExecutorName): Promise<Executor> {
  switch (name) {
    case 'onnxruntime':
      return createOrtExecutor();
    case 'tfjs-wasm':
    case 'tfjs-cpu': {
      // NOTE: imported on demand, so choosing onnxruntime never loads TensorFlow.js.
      const { createTfjsExecutor } = await import('../tfjs/index.js');
      return createTfjsExecutor({ backend: name === 'tfjs-wasm' ? 'wasm' : 'cpu' });
    }
    case 'interpreter':
      return interpreterExecutor;
    case 'cpu-native': {
      // NOTE: imported on demand; builds the kernels once per machine (a C++ compiler is needed).
      const { createCpuNativeExecutor } = await import('../native/index.js');
      return createCpuNativeExecutor();
    }
    case 'torch': {
      // NOTE: imported on demand; spawns the Python worker (CUDA when torch sees a GPU).
      const { createTorchExecutor } = await import('../torch/index.js');
      return createTorchExecutor();
    }
  }
}

/** Options of `selectExecutor`. */
export interface SelectExecutorOptions {
  /** An executor to use without measuring, or `auto` (default: `STAGEML_EXECUTOR`, else `auto`). */
  readonly force?: ExecutorName | 'auto';
  /** Receives one line saying which executor was chosen and why. */
  readonly log?: (line: string) => void;
  /** Executors measured by the probe (default onnxruntime, tfjs-wasm, tfjs-cpu; the interpreter is the last resort). */
  readonly candidates?: readonly ExecutorName[];
  /** JSON file remembering the choice per machine and Node version (default under `os.tmpdir()`; `false`: none). */
  readonly cacheFile?: string | false;
  /** Measure again, ignoring the in-memory and file caches. */
  readonly refresh?: boolean;
}

/** Which executor `selectExecutor` chose, how, and the probe's medians. */
export interface ExecutorSelection {
  readonly executor: Executor;
  readonly name: ExecutorName;
  /** `forced` (option or env), `probe` (measured now), `cache` (an earlier probe's choice), `fallback` (nothing else ran). */
  readonly source: 'forced' | 'probe' | 'cache' | 'fallback';
  /** One line for logs. */
  readonly reason: string;
  /** Median probe time (ms) of each candidate that ran. */
  readonly probeMs: Readonly<Partial<Record<ExecutorName, number>>>;
}

/** Environment variable that forces an executor (`auto` measures). */
export const EXECUTOR_ENV = 'STAGEML_EXECUTOR';

const DEFAULT_CANDIDATES: readonly ExecutorName[] = ['onnxruntime', 'tfjs-wasm', 'tfjs-cpu'];
const memo = new Map<string, Promise<ExecutorSelection>>();

/** The probe: two [64, 256]·[256, 256] GEMMs around a SiLU, the shape of a small MLP block. */
function probeGraph(): { graph: Graph; weights: Record<string, HostTensor>; inputs: Record<string, HostTensor> } {
  const b = new GraphBuilder('executor_probe');
  const x = b.input('x', ['f32', [64, 256]]);
  const w1 = b.param('w1', ['f32', [256, 256]]);
  const w2 = b.param('w2', ['f32', [256, 256]]);
  b.output('y', b.matmul(b.silu(b.matmul(x, w1)), w2));
  const rnd = seededRandom(7);
  const t = (shape: number[], s: number): HostTensor => ({ dtype: 'f32', shape, data: Float32Array.from({ length: shape[0]! * shape[1]! }, () => (rnd() - 0.5) * s) });
  return { graph: b.build(), weights: { w1: t([256, 256], 0.2), w2: t([256, 256], 0.2) }, inputs: { x: t([64, 256], 2) } };
}

async function measure(executor: Executor, probe: ReturnType<typeof probeGraph>, expected: HostTensor): Promise<number> {
  const prepared = await executor.prepare(probe.graph, probe.weights);
  try {
    let y = (await prepared.run(probe.inputs))['y']!;
    let worst = 0;
    for (let i = 0; i < y.data.length; i++) worst = Math.max(worst, Math.abs(y.data[i]! - expected.data[i]!) / (1 + Math.abs(expected.data[i]!)));
    if (!(worst <= 1e-3)) throw new RuntimeError(RuntimeCode.EVAL_FAILED, `probe result differs from the interpreter's by ${String(worst)}`);
    const times: number[] = [];
    for (let i = 0; i < 7; i++) {
      const t0 = performance.now();
      y = (await prepared.run(probe.inputs))['y']!;
      times.push(performance.now() - t0);
    }
    return times.sort((a, b) => a - b)[3]!;
  } finally {
    prepared.dispose();
  }
}

async function machineKey(): Promise<string> {
  const ort = await loadOrt();
  return `${cpus()[0]?.model ?? 'cpu'} ×${String(cpus().length)} | ${platform()}-${arch()} | node ${process.version} | onnxruntime ${ort.ok ? ort.version : 'none'}`;
}

interface CacheEntry {
  readonly name: ExecutorName;
  readonly probeMs: Partial<Record<ExecutorName, number>>;
  readonly date: string;
}

async function readCache(file: string): Promise<Record<string, CacheEntry>> {
  try {
    const doc = JSON.parse(await readFile(file, 'utf8')) as { entries?: Record<string, CacheEntry> };
    return typeof doc.entries === 'object' ? doc.entries : {};
  } catch {
    return {};
  }
}

async function writeCache(file: string, key: string, entry: CacheEntry): Promise<void> {
  const entries = { ...(await readCache(file)), [key]: entry };
  const tmp = `${file}.${String(process.pid)}.tmp`;
  try {
    await writeFile(tmp, `${JSON.stringify({ format: 'stageml-executor-choice', version: 1, entries }, null, 2)}\n`);
    await rename(tmp, file);
  } catch {
    // NOTE: the file only saves a later process the probe; failing to write it changes nothing else.
  }
}

function formatMs(probeMs: Partial<Record<ExecutorName, number>>): string {
  return Object.entries(probeMs).map(([n, ms]) => `${n} ${ms.toFixed(2)} ms`).join(', ');
}

function requested(opts: SelectExecutorOptions): { name: ExecutorName | 'auto'; from: string } {
  if (opts.force !== undefined) return { name: opts.force, from: 'request' };
  const env = process.env[EXECUTOR_ENV];
  if (env === undefined || env === '' || env === 'auto') return { name: 'auto', from: 'auto' };
  if (!isExecutorName(env)) {
    throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `unknown executor '${env}' in ${EXECUTOR_ENV} (known: auto, ${EXECUTOR_NAMES.join(', ')})`);
  }
  return { name: env, from: `${EXECUTOR_ENV}=${env}` };
}

async function choose(candidates: readonly ExecutorName[], cacheFile: string | false, refresh: boolean): Promise<ExecutorSelection> {
  const key = await machineKey();
  if (cacheFile !== false && !refresh) {
    const hit = (await readCache(cacheFile))[key];
    if (hit !== undefined && candidates.includes(hit.name)) {
      try {
        const executor = await createExecutorByName(hit.name);
        return { executor, name: hit.name, source: 'cache', probeMs: hit.probeMs, reason: `'${hit.name}' from the probe cached in ${cacheFile} on ${hit.date} (${formatMs(hit.probeMs)})` };
      } catch {
        // The cached executor no longer loads (e.g. onnxruntime-node was removed): measure again.
      }
    }
  }
  const probe = probeGraph();
  const expected = interpret(probe.graph, { inputs: probe.inputs, weights: probe.weights })['y']!;
  const probeMs: Partial<Record<ExecutorName, number>> = {};
  const failures: string[] = [];
  const executors = new Map<ExecutorName, Executor>();
  for (const name of candidates) {
    try {
      const executor = await createExecutorByName(name);
      probeMs[name] = await measure(executor, probe, expected);
      executors.set(name, executor);
    } catch (e) {
      failures.push(`${name}: ${errorMessage(e)}`);
    }
  }
  const ranked = [...executors.keys()].sort((a, b) => probeMs[a]! - probeMs[b]!);
  const best = ranked[0];
  const skipped = failures.length > 0 ? `; unavailable: ${failures.join('; ')}` : '';
  if (best === undefined) {
    return { executor: interpreterExecutor, name: 'interpreter', source: 'fallback', probeMs, reason: `the interpreter, as no faster executor runs here${skipped}` };
  }
  if (cacheFile !== false) await writeCache(cacheFile, key, { name: best, probeMs, date: new Date().toISOString() });
  const saved = cacheFile === false ? '' : `; remembered in ${cacheFile}`;
  return { executor: executors.get(best)!, name: best, source: 'probe', probeMs, reason: `'${best}' is fastest on a GEMM probe (${formatMs(probeMs)})${skipped}${saved}` };
}

/**
 * Picks the executor to run on. Forced by `force` or `STAGEML_EXECUTOR` (an unknown or unavailable
 * one is `RT_BACKEND_UNAVAILABLE`); otherwise the candidates that load here are each measured once
 * on a small GEMM-heavy probe (results checked against the interpreter) and the fastest wins. The
 * choice is kept for the process and, by default, in a JSON file under `os.tmpdir()` keyed by CPU,
 * platform, Node and onnxruntime versions, so later processes skip the probe. The interpreter is the
 * last resort. `log` receives one line naming the choice and why.
 */
export async function selectExecutor(opts: SelectExecutorOptions = {}): Promise<ExecutorSelection> {
  const want = requested(opts);
  let selection: ExecutorSelection;
  if (want.name !== 'auto') {
    if (!isExecutorName(want.name)) throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `unknown executor '${String(want.name)}' (known: auto, ${EXECUTOR_NAMES.join(', ')})`);
    selection = { executor: await createExecutorByName(want.name), name: want.name, source: 'forced', probeMs: {}, reason: want.from === 'request' ? `'${want.name}' as requested` : `'${want.name}' forced by ${want.from}` };
  } else {
    const candidates = opts.candidates ?? DEFAULT_CANDIDATES;
    const cacheFile = opts.cacheFile ?? join(tmpdir(), 'stageml-executor-choice.json');
    const key = `${candidates.join(',')}|${String(cacheFile)}`;
    let p = opts.refresh === true ? undefined : memo.get(key);
    if (p === undefined) {
      p = choose(candidates, cacheFile, opts.refresh === true);
      memo.set(key, p);
      p.catch(() => memo.delete(key));
    }
    selection = await p;
  }
  opts.log?.(`executor: ${selection.name} (${selection.reason})`);
  return selection;
}
