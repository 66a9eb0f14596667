// Writes the engine's decode program (packages/engine: slot linears on every projection, resident
// KV inputs, last-position logits) for a random-weight Llama shape, as `Engine.load` builds it
// with `dtype: 'bf16', adapterDtype: 'same'`, for bench/gpu/worker_bank.py on the GPU machine (no
// Node there). Shapes only: the device script draws the weights and the slot tables.
//   OUT/graph.json     the program (the IR's JSON form, what the torch executor sends), weights as
//                      parameters (the device script passes them at prepare);
//   OUT/base.json      the engine's base program (no slot tables: what a batch of base rows runs),
//                      the peer of the slot program's step;
//   OUT/manifest.json  the config, the form, slots S and rank R, and every parameter and input
//                      with its dtype and (symbolic) shape.
// Run: node --conditions=@stageml/source --import tsx bench/gpu/prepare-engine-graph.ts [OUT, default
//      .gpu/wbank at the repository root (git-ignored)]
//      [--layers N] [--hidden H] [--intermediate I] [--heads Q] [--kv-heads KV] [--head-dim D]
//      [--vocab V] [--slots S] [--rank R] [--form gathered|single|grouped] [--dtype bf16|f32]
// Defaults: 4 layers, hidden 4096, intermediate 14336, GQA 32/8, head 128, vocab 32000, S 65, R 64,
// gathered.
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { graphToJson } from '@stageml/ir';
import { parseLlamaConfig } from '@stageml/models';
import { type SlotForm, castEngineGraph, engineGraph } from '@stageml/engine';

const args = process.argv.slice(2);
const OUT = args[0] !== undefined && !args[0].startsWith('--') ? args.shift()! : join(import.meta.dirname, '../../.gpu/wbank');
const opt = (name: string, dflt: number): number => {
  const i = args.indexOf(`--${name}`);
  if (i < 0) return dflt;
  const v = Number(args[i + 1]);
  if (!Number.isInteger(v) || v <= 0) throw new Error(`--${name} needs a positive integer, got '${String(args[i + 1])}'`);
  return v;
};
const fi = args.indexOf('--form');
const form = (fi < 0 ? 'gathered' : args[fi + 1]) as SlotForm;
if (!['gathered', 'single', 'grouped'].includes(form)) throw new Error(`--form must be gathered, single or grouped, got '${form}'`);

const di = args.indexOf('--dtype');
const dtype = di < 0 ? 'bf16' : args[di + 1];
if (dtype !== 'bf16' && dtype !== 'f32') throw new Error(`--dtype must be bf16 or f32, got '${String(dtype)}'`);

const config = {
  architectures: ['LlamaForCausalLM'],
  model_type: 'llama',
  hidden_size: opt('hidden', 4096),
  intermediate_size: opt('intermediate', 14336),
  num_hidden_layers: opt('layers', 4),
  num_attention_heads: opt('heads', 32),
  num_key_value_heads: opt('kv-heads', 8),
  head_dim: opt('head-dim', 128),
  vocab_size: opt('vocab', 32000),
  rms_norm_eps: 1e-5,
  rope_theta: 500000,
  max_position_embeddings: 4096,
  tie_word_embeddings: false,
};
const slots = opt('slots', 65);
const rank = opt('rank', 64);
const cfg = parseLlamaConfig(JSON.stringify(config), 'config.json');
const g32 = engineGraph(cfg, form, slots, rank, []);
// What Engine.load's castProgram does for dtype bf16 (packages/engine/src/engine-load.ts); f32 programs
// as built (an oracle on the GPU: no bf16 rounding between two settings of one program).
const cast = (graph: typeof g32) => dtype === 'f32' ? graph : castEngineGraph(graph, 'bf16', { adapterDtype: 'same', isFactorInput: (n) => n.startsWith('slots.'), maskInputs: new Set(['attention_mask']), dtypeInputs: (n) => n.startsWith('past_'), dtypeOutputs: (n) => n.startsWith('new_') });
const g = cast(g32);
const json = graphToJson(g);
const leaves = (kind: 'param' | 'input') => json.nodes.filter((n) => n.kind === kind).map((n) => ({ name: n.results[0]!.name, dtype: n.results[0]!.type.dtype, shape: n.results[0]!.type.shape }));
await mkdir(OUT, { recursive: true });
await writeFile(join(OUT, 'graph.json'), JSON.stringify(json));
await writeFile(join(OUT, 'base.json'), JSON.stringify(graphToJson(cast(engineGraph(cfg, 'base', slots, rank, [])))));
await writeFile(join(OUT, 'manifest.json'), JSON.stringify({ config, form, slots, rank, dtype, adapterDtype: 'same', params: leaves('param'), inputs: leaves('input'), outputs: json.outputs.map((o) => o.name) }, null, 1));
console.log(`${OUT}: @${json.name} ${form}, ${String(json.nodes.length)} nodes, ${String(leaves('param').length)} parameters, ${String(leaves('input').length)} inputs`);
