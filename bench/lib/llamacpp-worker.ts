// llama.cpp (node-llama-cpp, from bench/peers) in a process of its own, for bench/server-llamacpp.ts:
// it answers requests of bench/lib/llamacpp-peer.ts over the IPC channel, one at a time — load a
// GGUF model, decode greedy tokens of one or more prompts (timed), unload — and exits when the
// channel closes. Options come as JSON in STAGEML_BENCH_LLAMACPP (`{ threads }`).
import type * as NodeLlamaCpp from 'node-llama-cpp';
import type { LlamaContext, LlamaModel } from 'node-llama-cpp';
import { importPeer } from './peers.js';
import { llamaDecodeRun } from './llamacpp-run.js';
import type { LlamaRequest, LlamaResponse } from './llamacpp-peer.js';

const { threads } = JSON.parse(process.env['STAGEML_BENCH_LLAMACPP'] ?? '{}') as { threads?: number };
const THREADS = threads ?? 2;
const { getLlama, LlamaLogLevel } = await importPeer<typeof NodeLlamaCpp>('node-llama-cpp');
const llama = await getLlama({ gpu: false, build: 'never', maxThreads: THREADS, logLevel: LlamaLogLevel.error });
let model: LlamaModel | undefined;

/**
 * The contexts of one measurement, created for it and disposed after it (their ggml thread pools
 * poll for work while they live): for the base model one context of one sequence for one prompt and
 * of 8 for more, or one context per LoRA file (llama.cpp applies an adapter per context), as
 * bench/llamacpp.ts runs them.
 */
async function withContexts<T>(loras: readonly string[] | undefined, sequences: number, run: (ctxs: LlamaContext[]) => Promise<T>): Promise<T> {
  if (model === undefined) throw new Error('no model loaded');
  const ctxs: LlamaContext[] = [];
  try {
    // One prompt: a context of one sequence (as a LoRA context is), else one of 8.
    if (loras === undefined || loras.length === 0)
      ctxs.push(
        await (sequences === 1
          ? model.createContext({ contextSize: 256, sequences: 1, threads: THREADS })
          : model.createContext({ contextSize: 512, sequences: 8, threads: THREADS, batchSize: 512 })),
      );
    else
      for (const filePath of loras)
        ctxs.push(await model.createContext({ contextSize: 256, sequences: 1, threads: THREADS, lora: { adapters: [{ filePath }] } }));
    return await run(ctxs);
  } finally {
    for (const c of ctxs) await c.dispose();
  }
}

async function handle(req: LlamaRequest): Promise<unknown> {
  switch (req.op) {
    case 'load':
      await model?.dispose();
      model = await llama.loadModel({ modelPath: req.modelPath });
      return { rssMiB: process.memoryUsage.rss() / 2 ** 20 };
    case 'decode':
      return withContexts(req.loras, req.prompts.length, (ctxs) => llamaDecodeRun(ctxs, req.prompts, req.steps));
    case 'unload':
      await model?.dispose();
      model = undefined;
      return {};
  }
}

// One request at a time, in order: the parent awaits each answer before the next request.
let queue: Promise<void> = Promise.resolve();
process.on('message', (msg) => {
  const req = msg as LlamaRequest;
  queue = queue.then(async () => {
    let res: LlamaResponse;
    try {
      res = { id: req.id, ok: true, result: await handle(req) };
    } catch (e) {
      res = { id: req.id, ok: false, error: e instanceof Error ? e.message : String(e) };
    }
    process.send!(res);
  });
});
process.on('disconnect', () => {
  void queue.then(() => model?.dispose()).finally(() => process.exit(0));
});
process.send!({ id: 0, ok: true, result: { ready: true } } satisfies LlamaResponse);
