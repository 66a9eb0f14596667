import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import { ServerCode, ServerError } from './errors.js';

/** Texts longer than this (UTF-16 code units) are tokenized on the worker, not the event loop. */
export const WORKER_TOKENIZE_CHARS = 16 * 1024;

// The worker: the same `Tokenizer` (from @huggingface/tokenizers, as `loadTokenizer` of
// @stageml/models builds it) over the model directory's tokenizer.json and tokenizer_config.json.
const WORKER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const { readFileSync, existsSync } = require('node:fs');
const { join } = require('node:path');
const { Tokenizer } = require(workerData.module);
const configPath = join(workerData.dir, 'tokenizer_config.json');
const config = existsSync(configPath) ? JSON.parse(readFileSync(configPath, 'utf8')) : {};
const tok = new Tokenizer(JSON.parse(readFileSync(join(workerData.dir, 'tokenizer.json'), 'utf8')), config);
parentPort.on('message', (m) => {
  try {
    parentPort.postMessage({ id: m.id, ids: tok.encode(m.text, { add_special_tokens: m.add }).ids });
  } catch (e) {
    parentPort.postMessage({ id: m.id, error: String((e && e.message) || e) });
  }
});
`;

/** Where @huggingface/tokenizers (CommonJS) lives: resolved from @stageml/models, which depends on it. */
function tokenizersModule(): string | undefined {
  try {
    const req = createRequire(import.meta.url);
    const models = req.resolve('@stageml/models/package.json');
    return createRequire(models).resolve('@huggingface/tokenizers');
  } catch {
    return undefined;
  }
}

/**
 * Tokenizes long texts on a worker thread, so that a large prompt never holds the event loop
 * (issue 39): `/tokenize` and string prompts longer than {@link WORKER_TOKENIZE_CHARS} go there,
 * shorter ones stay on the loop (a round trip costs more than they do). The worker starts on the
 * first long text and does not keep the process alive. A model directory without tokenizer.json
 * (a GGUF model's tokenizer) has no worker: `encode` then answers on the loop.
 */
export class TokenizerWorker {
  readonly #dir: string;
  readonly #fallback: (text: string, addSpecialTokens: boolean) => number[];
  #worker: Worker | undefined;
  #next = 0;
  readonly #pending = new Map<number, { resolve: (ids: number[]) => void; reject: (e: unknown) => void }>();
  readonly #module: string | undefined;

  /** A worker over `dir`'s tokenizer; `fallback` is the loop's own tokenizer. */
  constructor(dir: string, fallback: (text: string, addSpecialTokens: boolean) => number[]) {
    this.#dir = dir;
    this.#fallback = fallback;
    this.#module = existsSync(join(dir, 'tokenizer.json')) ? tokenizersModule() : undefined;
  }

  /** The ids of `text`: from the worker when it is long, else from the loop's tokenizer. */
  encode(text: string, addSpecialTokens: boolean): Promise<number[]> {
    if (text.length <= WORKER_TOKENIZE_CHARS || this.#module === undefined) return Promise.resolve(this.#fallback(text, addSpecialTokens));
    const worker = this.#start(this.#module);
    const id = this.#next++;
    return new Promise<number[]>((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      worker.ref();
      worker.postMessage({ id, text, add: addSpecialTokens });
    });
  }

  #start(module: string): Worker {
    if (this.#worker !== undefined) return this.#worker;
    const w = new Worker(WORKER_SOURCE, { eval: true, workerData: { dir: this.#dir, module } });
    w.unref();
    w.on('message', (m: { id: number; ids?: number[]; error?: string }) => {
      const p = this.#pending.get(m.id);
      if (p === undefined) return;
      this.#pending.delete(m.id);
      if (this.#pending.size === 0) w.unref();
      if (m.ids !== undefined) p.resolve(m.ids);
      else p.reject(new ServerError(ServerCode.BAD_REQUEST, `tokenizing failed: ${m.error ?? 'unknown error'}`));
    });
    const fail = (e: unknown): void => {
      this.#worker = undefined;
      for (const p of this.#pending.values()) p.reject(e);
      this.#pending.clear();
    };
    w.on('error', fail);
    w.on('exit', (code) => {
      fail(new Error(`the tokenizer worker exited (${String(code)})`));
    });
    this.#worker = w;
    return w;
  }

  /** Stops the worker (pending texts fail). */
  async close(): Promise<void> {
    const w = this.#worker;
    this.#worker = undefined;
    if (w !== undefined) await w.terminate();
  }
}
