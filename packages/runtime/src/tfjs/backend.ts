import * as tf from '@tensorflow/tfjs-core';

import { RuntimeCode, RuntimeError } from '../errors.js';
import { errorMessage } from '@stageml/ir';

/** A TensorFlow.js backend the tfjs executor can run on, in order of preference. */
export type TfjsBackend = 'node-gpu' | 'node' | 'wasm' | 'cpu';

/** Every tfjs backend, fastest first: the order automatic selection tries them in. */
export const TFJS_BACKENDS: readonly TfjsBackend[] = ['node-gpu', 'node', 'wasm', 'cpu'];

/** Whether `name` is a tfjs backend name. */
export function isTfjsBackend(name: string): name is TfjsBackend {
  return (TFJS_BACKENDS as readonly string[]).includes(name);
}

/** The name each backend registers itself under in the tfjs engine. */
const ENGINE_NAME: Readonly<Record<TfjsBackend, string>> = { 'node-gpu': 'tensorflow', node: 'tensorflow', wasm: 'wasm', cpu: 'cpu' };

/** The tfjs engine name of a backend (`tensorflow` for both node backends). */
export function engineName(backend: TfjsBackend): string {
  return ENGINE_NAME[backend];
}

/** Outcome of loading a backend: it runs here, or why it does not. */
export type BackendLoad = { readonly ok: true } | { readonly ok: false; readonly reason: string; readonly cause?: unknown };

// NOTE: the node bindings are optional peers that download libtensorflow when installed, so they are
// imported through a variable: the bundler and the type checker must not require them.
const NODE_MODULE: Readonly<Record<'node-gpu' | 'node', string>> = { 'node-gpu': '@tensorflow/tfjs-node-gpu', node: '@tensorflow/tfjs-node' };

async function importNodeBinding(backend: 'node-gpu' | 'node', threads: number | undefined): Promise<void> {
  // TensorFlow's C library reads its intra-op pool size from the environment when it loads.
  if (threads !== undefined && process.env['TF_NUM_INTRAOP_THREADS'] === undefined) process.env['TF_NUM_INTRAOP_THREADS'] = String(threads);
  const specifier: string = NODE_MODULE[backend];
  await import(specifier);
}

async function importBackend(backend: TfjsBackend, threads: number | undefined): Promise<void> {
  switch (backend) {
    case 'node-gpu':
    case 'node':
      return importNodeBinding(backend, threads);
    case 'wasm': {
      const wasm = await import('@tensorflow/tfjs-backend-wasm');
      // NOTE: only takes effect before the first initialization, and only where the threaded wasm
      // binary is used (tfjs 4.22 runs single-threaded wasm under Node).
      if (threads !== undefined) wasm.setThreadsCount(threads);
      return;
    }
    case 'cpu':
      await import('@tensorflow/tfjs-backend-cpu');
      return;
  }
}

let lock: Promise<unknown> = Promise.resolve();

/**
 * Runs `f` after every earlier call has settled. tfjs keeps one global engine, and a backend whose
 * asynchronous initialization is overtaken by another `setBackend` reports failure, so every load
 * and every switch goes through this queue.
 */
function serialized<T>(f: () => Promise<T>): Promise<T> {
  const next = lock.then(f, f);
  lock = next.catch(() => undefined);
  return next;
}

let prodModeSet = false;

function quietEngine(): void {
  if (prodModeSet) return;
  prodModeSet = true;
  // NOTE: production mode turns off tfjs debug checks and its console banners (the cpu backend
  // advertises tfjs-node on first use); shape assertions stay on. This is a global tfjs flag.
  tf.enableProdMode();
}

const loads = new Map<TfjsBackend, Promise<BackendLoad>>();

/** Which backend provided the engine's `tensorflow` registration, when a node binding loaded. */
let tensorflowProvider: TfjsBackend | undefined;

async function loadOnce(backend: TfjsBackend, threads: number | undefined): Promise<BackendLoad> {
  quietEngine();
  const name = ENGINE_NAME[backend];
  if (name === 'tensorflow' && tensorflowProvider !== undefined && tensorflowProvider !== backend) {
    return { ok: false, reason: `the 'tensorflow' engine backend is already provided by tfjs-${tensorflowProvider}` };
  }
  try {
    await importBackend(backend, threads);
  } catch (e) {
    return { ok: false, reason: `cannot import its package (${errorMessage(e)})`, cause: e };
  }
  const factory: unknown = tf.findBackendFactory(name);
  if (factory === null || factory === undefined) return { ok: false, reason: `its package registered no '${name}' engine backend` };
  const previous = engineBackend();
  let ok: boolean;
  try {
    ok = await tf.setBackend(name);
  } catch (e) {
    return { ok: false, reason: `initialization threw (${errorMessage(e)})`, cause: e };
  } finally {
    if (previous !== undefined && previous !== name && isInitialized(previous)) await tf.setBackend(previous);
  }
  if (!ok) return { ok: false, reason: 'its initialization failed' };
  if (name === 'tensorflow') tensorflowProvider = backend;
  return { ok: true };
}

/**
 * Loads and initializes `backend` once per process (later calls reuse the outcome), leaving the
 * engine's current backend as it was. `threads` applies only to the first load.
 */
export function loadBackend(backend: TfjsBackend, threads?: number): Promise<BackendLoad> {
  let p = loads.get(backend);
  if (p === undefined) {
    p = serialized(() => loadOnce(backend, threads));
    loads.set(backend, p);
  }
  return p;
}

/**
 * The tfjs backends that load in this process, fastest first (for logs and diagnostics). Loads each
 * candidate once; the engine's current backend is left as it was.
 */
export async function availableTfjsBackends(): Promise<TfjsBackend[]> {
  const out: TfjsBackend[] = [];
  for (const b of TFJS_BACKENDS) if ((await loadBackend(b)).ok) out.push(b);
  return out;
}

/**
 * Makes `backend` the engine's current backend (it must have loaded). Resolves at once when it
 * already is; callers must re-check `isCurrent` after awaiting, since a concurrent caller may switch
 * again before they resume.
 */
export function useBackend(backend: TfjsBackend): Promise<void> {
  if (isCurrent(backend)) return Promise.resolve();
  return serialized(async () => {
    const name = ENGINE_NAME[backend];
    if (tf.getBackend() === name) return;
    let ok: boolean;
    try {
      ok = await tf.setBackend(name);
    } catch (e) {
      throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `cannot switch tfjs to the '${backend}' backend`, { cause: e });
    }
    if (!ok) throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `cannot switch tfjs to the '${backend}' backend`);
  });
}

/**
 * The engine's current backend name, undefined before any was set (tfjs types it as a string, but
 * it is null until the first `setBackend` or op).
 */
function engineBackend(): string | undefined {
  const name: unknown = tf.engine().backendName;
  return typeof name === 'string' ? name : undefined;
}

/** Whether engine backend `name` is initialized (tfjs types `findBackend` as never null; it is). */
function isInitialized(name: string): boolean {
  const instance: unknown = tf.findBackend(name);
  return instance !== null && instance !== undefined;
}

/** Whether `backend` is the engine's current backend. */
export function isCurrent(backend: TfjsBackend): boolean {
  return engineBackend() === ENGINE_NAME[backend];
}
