// Start-up of the engine on the torch executor (CPU torch here) for a bf16 checkpoint of a
// reduced Llama-3.2-1B shape (widths 2048/8192, vocab 128256, 16/8 heads, tied embeddings, fewer
// layers) with 16 PEFT adapters (r16, all seven projections): the time until the engine has
// loaded the model and every adapter, Node's RSS then, and greedy tokens (a base and an adapter
// row) to compare between builds. Two steps, each its own process so RSS is the run's own:
//
//   node --conditions=@stageml/source --import tsx bench/torch-startup.ts gen DIR [LAYERS]
//   node --expose-gc --conditions=@stageml/source --import tsx bench/torch-startup.ts run DIR [host|device]
//
// `run … host` loads the weights into Node (`deviceWeights: false`); `device` (default) lets the
// worker read them. Prints one JSON line. Only Engine.load / loadAdapter / open / attach /
// prefillMany / decode are used, so the same file also runs against an older tree.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Engine, writeRandomAdapter } from '@stageml/engine';
import { type HostTensor, graphParams, seededRandom } from '@stageml/ir';
import { type LlamaShape, buildLlamaGraph } from '@stageml/models';
import { createTorchExecutor } from '@stageml/runtime';
import { writeSafetensors } from '@stageml/safetensors';

const [mode, dir, arg] = process.argv.slice(2);
if ((mode !== 'gen' && mode !== 'run') || dir === undefined) {
  console.error('usage: torch-startup.ts gen DIR [LAYERS] | run DIR [host|device]');
  process.exit(2);
}
const ADAPTERS = 16;
const RANK = 16;

if (mode === 'gen') {
  const layers = Number(arg ?? '4');
  const shape: LlamaShape = { vocabSize: 128256, hiddenSize: 2048, intermediateSize: 8192, numLayers: layers, numHeads: 32, numKvHeads: 8, headDim: 64, tieWordEmbeddings: true };
  const model = join(dir, 'model');
  mkdirSync(model, { recursive: true });
  const rand = seededRandom(11);
  const tensors: Record<string, HostTensor> = {};
  const graph = buildLlamaGraph(shape);
  for (const p of graphParams(graph)) {
    const s = graph.values[p.results[0]!]!.type.shape as number[];
    const n = s.reduce((a, b) => a * b, 1);
    const data = new Float32Array(n);
    if (s.length === 1) data.fill(1);
    else {
      const scale = 1 / Math.sqrt(s[s.length - 1]!);
      for (let i = 0; i < n; i++) data[i] = (rand() * 2 - 1) * scale;
    }
    // bf16 as stored: the encoder rounds to nearest even.
    tensors[p.name] = { dtype: 'bf16', shape: s, data };
  }
  await writeSafetensors(join(model, 'model.safetensors'), tensors);
  writeFileSync(join(model, 'config.json'), JSON.stringify({ architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: 2048, intermediate_size: 8192, num_hidden_layers: layers, num_attention_heads: 32, num_key_value_heads: 8, head_dim: 64, vocab_size: 128256, rms_norm_eps: 1e-5, rope_theta: 500000, tie_word_embeddings: true, max_position_embeddings: 2048, bos_token_id: 1, eos_token_id: 2, torch_dtype: 'bfloat16' }, null, 2));
  for (let a = 0; a < ADAPTERS; a++) await writeRandomAdapter(join(dir, 'adapters', `a${String(a)}`), shape, { rank: RANK, seed: 100 + a });
  console.log(JSON.stringify({ generated: dir, layers }));
} else {
  const where = arg ?? 'device';
  const gc = (globalThis as { gc?: () => void }).gc;
  const rss0 = process.memoryUsage().rss;
  const t0 = performance.now();
  const executor = await createTorchExecutor({ device: 'cpu' });
  const tExec = performance.now();
  // STAGEML_ADAPTER_DTYPE=same: factor tables in the checkpoint's dtype (bf16), as `stageml serve` has them on a CUDA executor.
  const adapterDtype = process.env['STAGEML_ADAPTER_DTYPE'] === 'same' ? { adapterDtype: 'same' as const } : {};
  const opts = { executor, dtype: 'checkpoint' as const, maxLoras: ADAPTERS, maxLoraRank: RANK, ...adapterDtype, ...(where === 'host' ? { deviceWeights: false } : {}) };
  const e = await Engine.load(join(dir, 'model'), opts);
  const tLoad = performance.now();
  for (let a = 0; a < ADAPTERS; a++) await e.loadAdapter(join(dir, 'adapters', `a${String(a)}`), `a${String(a)}`);
  const tReady = performance.now();
  gc?.();
  const mem = process.memoryUsage();
  const seqs = [e.open(undefined, [1, 400, 5000, 77, 12000, 9, 310, 4242]), e.open('a3', [1, 400, 5000, 77, 12000, 9, 310, 4242])];
  for (const s of seqs) await e.attach(s);
  const argmax = (l: Float32Array): number => l.reduce((best, v, i, arr) => (v > arr[best]! ? i : best), 0);
  let last = (await e.prefillMany(seqs)).map((l) => argmax(l!));
  const tokens = seqs.map((_, i) => [last[i]!]);
  const tFirst = performance.now();
  for (let step = 0; step < 3; step++) {
    last = (await e.decode(seqs, last)).map((l) => argmax(l));
    last.forEach((t, i) => tokens[i]!.push(t));
  }
  const tDone = performance.now();
  const m = e.memory();
  gc?.();
  const after = process.memoryUsage();
  console.log(JSON.stringify({
    where,
    executorStartS: (tExec - t0) / 1000,
    engineLoadS: (tLoad - tExec) / 1000,
    adaptersS: (tReady - tLoad) / 1000,
    readyS: (tReady - t0) / 1000,
    rssStartMB: rss0 / 2 ** 20,
    rssReadyMB: mem.rss / 2 ** 20,
    heapUsedReadyMB: mem.heapUsed / 2 ** 20,
    arrayBuffersReadyMB: mem.arrayBuffers / 2 ** 20,
    rssAfterTokensMB: after.rss / 2 ** 20,
    prefillS: (tFirst - tReady) / 1000,
    decode3S: (tDone - tFirst) / 1000,
    tokens,
    memory: m,
  }));
  e.dispose();
  await executor.close();
}
