// The bench side of bench/lib/llamacpp-worker.ts: llama.cpp in a child process of its own, so that
// its thread pool and memory are apart from the process that measures (and from our server's), and
// it can be started, idled and stopped around the other engine's measurements.
import { type ChildProcess, spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { childRssMiB, stopChild } from './child.js';
import type { LlamaDecodeRun } from './llamacpp-run.js';

/** A request to the worker (`id` pairs it with its answer). */
export type LlamaRequest =
  | { readonly id: number; readonly op: 'load'; readonly modelPath: string }
  | { readonly id: number; readonly op: 'decode'; readonly prompts: readonly (readonly number[])[]; readonly steps: number; readonly loras?: readonly string[] }
  | { readonly id: number; readonly op: 'unload' };

/** The worker's answer to request `id`. */
export type LlamaResponse = { readonly id: number; readonly ok: true; readonly result: unknown } | { readonly id: number; readonly ok: false; readonly error: string };

/** llama.cpp in its own process. */
export interface LlamaPeer {
  readonly proc: ChildProcess;
  /** Loads a GGUF model (the one before is disposed). */
  load(modelPath: string): Promise<void>;
  /**
   * Decodes `steps` greedy tokens of each prompt concurrently, after an untimed prefill of all but
   * its last token: on one context of 8 sequences, or with `loras` on one context per LoRA file
   * (prompt k on context k mod loras.length).
   */
  decode(prompts: readonly (readonly number[])[], steps: number, loras?: readonly string[]): Promise<LlamaDecodeRun>;
  /** Disposes the model (the process stays, idle). */
  unload(): Promise<void>;
  /** Resident set size of the worker, in MiB (from /proc; 0 elsewhere). */
  rssMiB(): number;
  /** Closes the channel and waits for the process to exit (SIGKILL after 10 s). */
  stop(): Promise<void>;
}

const WORKER = join(dirname(fileURLToPath(import.meta.url)), 'llamacpp-worker.ts');

/** Starts the worker with `threads` llama.cpp threads; resolves once node-llama-cpp is loaded (at most 120 s). */
export function startLlamaPeer(threads: number): Promise<LlamaPeer> {
  const proc = spawn(process.execPath, ['--import', 'tsx', WORKER], { env: { ...process.env, STAGEML_BENCH_LLAMACPP: JSON.stringify({ threads }) }, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  let next = 1;
  let exited: Error | undefined;
  proc.on('message', (msg) => {
    const res = msg as LlamaResponse;
    const w = waiting.get(res.id);
    if (w === undefined) return;
    waiting.delete(res.id);
    if (res.ok) w.resolve(res.result);
    else w.reject(new Error(`llama.cpp worker: ${res.error}`));
  });
  proc.once('exit', (code, signal) => {
    exited = new Error(`the llama.cpp worker exited (${String(code ?? signal)})`);
    for (const w of waiting.values()) w.reject(exited);
    waiting.clear();
  });
  const call = (req: LlamaRequest extends infer R ? (R extends unknown ? Omit<R, 'id'> : never) : never): Promise<unknown> =>
    new Promise((resolve, reject) => {
      if (exited !== undefined) {
        reject(exited);
        return;
      }
      const id = next++;
      waiting.set(id, { resolve, reject });
      proc.send({ ...req, id });
    });
  const peer: LlamaPeer = {
    proc,
    load: async (modelPath) => {
      await call({ op: 'load', modelPath });
    },
    decode: async (prompts, steps, loras) => (await call({ op: 'decode', prompts, steps, ...(loras === undefined ? {} : { loras }) })) as LlamaDecodeRun,
    unload: async () => {
      await call({ op: 'unload' });
    },
    rssMiB: () => childRssMiB(proc),
    stop: () => stopChild(proc, () => {
      proc.disconnect();
    }, 10_000),
  };
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error('the llama.cpp worker did not start within 120 s'));
    }, 120_000);
    waiting.set(0, {
      resolve: () => {
        clearTimeout(timer);
        resolve(peer);
      },
      reject: (e) => {
        clearTimeout(timer);
        reject(e);
      },
    });
  });
}
