// Prepares the GPU end-to-end run (bench/gpu/e2e.py, bench/gpu/decode8b.py) on a machine with
// Node; the GPU machine has none. Writes, under OUT (argv[2], default bench/gpu/out-e2e):
//   bundles/fixture-bf16, fixture-bf16-same, fixture-f32: the Llama fixture with adapter all-r16
//     staged at `adapter` exactly as `stageml stage --dtype bf16 [--adapter-dtype same]|f32` does,
//     plus residual.json (the IR's JSON form);
//   bundles/big8-bf16: an 8-layer, 4096-wide Llama (GQA 32/8) with an r16 adapter on all seven
//     projections, shapes only (weights are drawn on the GPU machine, then passed as external
//     parameters), converted to bf16 like --dtype bf16 (big8-bf16: LoRA factors f32, the default
//     --adapter-dtype; big8-bf16-same: bf16);
//   triton/<shape>-<mix>: the generated SGMV bank kernels (`stageml gen triton`) for the four
//     projection shapes of Llama-3-8B and two 64-adapter rank mixes.
// Run: node --conditions=@stageml/source --import tsx bench/gpu/prepare-e2e.ts [OUT]
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SERVING_STAGES } from '@stageml/annotations';
import { type Graph, graphToJson } from '@stageml/ir';
import { buildLlamaGraph, parseLlamaConfig, ropeInvFreqFor, singleAdapterLinear, stagedModelGraph } from '@stageml/models';
import type { LoraAdapter } from '@stageml/peft';
import { type SpecializeResult, specialize, writeBundle } from '@stageml/runtime';
import { generateTritonFromBundle } from '@stageml/triton-gen';
import { castResidual } from '../../apps/cli/src/stage-dtype.js';
import { bankGraph, loraGraph } from '../../packages/triton-gen/test/graphs.js';

const OUT = process.argv[2] ?? join(import.meta.dirname, 'out-e2e');
const FIXTURE = join(import.meta.dirname, '../../fixtures/peft-tiny/llama');

async function bundle(name: string, result: SpecializeResult): Promise<void> {
  const dir = join(OUT, 'bundles', name);
  await writeBundle(dir, result, { overwrite: true });
  await writeFile(join(dir, 'residual.json'), JSON.stringify(graphToJson(result.residual)));
  console.log(`bundle ${name}: ${String(result.residual.nodes.length)} nodes, ${String(Object.keys(result.constants).length)} constants`);
}

// 1. The fixture, staged from its checkpoint as `stageml stage --model … --adapter … --cutoff adapter`.
const m = await stagedModelGraph(`${FIXTURE}/base`, { adapter: `${FIXTURE}/adapters/all-r16` });
const staged = specialize(m.graph, { lattice: m.lattice, annotations: m.annotations, cutoff: 'adapter', values: { get: (n) => m.values.get(n) } });
await bundle('fixture-f32', staged);
await bundle('fixture-bf16', castResidual(staged, 'bf16', m.graph));
await bundle('fixture-bf16-same', castResidual(staged, 'bf16', m.graph, { adapterDtype: 'same' }));

// 2. An 8-layer Llama at 4096 wide, GQA 32/8, with an r16 (alpha 32) adapter on all projections.
const BIG = {
  architectures: ['LlamaForCausalLM'],
  model_type: 'llama',
  hidden_size: 4096,
  intermediate_size: 14336,
  num_hidden_layers: 8,
  num_attention_heads: 32,
  num_key_value_heads: 8,
  head_dim: 128,
  vocab_size: 32000,
  rms_norm_eps: 1e-5,
  rope_theta: 500000,
  rope_parameters: { rope_type: 'default', rope_theta: 500000 },
  max_position_embeddings: 4096,
  tie_word_embeddings: false,
  attention_bias: false,
  mlp_bias: false,
};
await mkdir(join(OUT, 'bundles'), { recursive: true });
await writeFile(join(OUT, 'bundles', 'big8-config.json'), JSON.stringify(BIG, null, 2));
const cfg = parseLlamaConfig(JSON.stringify(BIG), 'big8-config.json');
const PROJ = ['self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj', 'self_attn.o_proj', 'mlp.gate_proj', 'mlp.up_proj', 'mlp.down_proj'];
const modules = new Map<string, { module: string; rank: number; alpha: number; scale: number }>();
for (let l = 0; l < cfg.numLayers; l++) for (const p of PROJ) modules.set(`model.layers.${String(l)}.${p}`, { module: `model.layers.${String(l)}.${p}`, rank: 16, alpha: 32, scale: 2 });
// Only the module table (names, ranks, scales) shapes the graph; the factors are drawn on the GPU.
const adapter = { name: 'big', modules } as unknown as LoraAdapter;
const g: Graph = buildLlamaGraph(cfg, {
  name: 'llama',
  kvCache: true,
  attentionMask: true,
  linear: singleAdapterLinear(adapter, 'residual'),
  invFreq: ropeInvFreqFor(cfg.headDim, cfg.ropeTheta, cfg.rope),
  qkvBias: cfg.qkvBias,
});
// Every parameter at a stage past the cutoff: literals fold as usual, weights stay residual
// parameters (external: drawn on the GPU machine), so no weight data is needed here.
const big = specialize(g, { lattice: SERVING_STAGES, annotations: { params: { '*': 'tenant' } }, cutoff: 'adapter' });
await bundle('big8-bf16', castResidual(big, 'bf16', g));
await bundle('big8-bf16-same', castResidual(big, 'bf16', g, { adapterDtype: 'same' }));

// 3. SGMV bank kernels for Llama-3-8B's projection shapes, 64 adapters.
const SHAPES: Record<string, { inDim: number; outDim: number }> = {
  qo: { inDim: 4096, outDim: 4096 },
  kv: { inDim: 4096, outDim: 1024 },
  gu: { inDim: 4096, outDim: 14336 },
  dn: { inDim: 14336, outDim: 4096 },
};
const MIXES: Record<string, number[]> = {
  mixed: Array.from({ length: 64 }, (_, i) => [8, 16, 64][i % 3]!),
  r8: Array.from({ length: 64 }, () => 8),
};
for (const [s, d] of Object.entries(SHAPES)) {
  for (const [mix, ranks] of Object.entries(MIXES)) {
    const name = `${s}-${mix}`;
    const dir = join(OUT, 'bundles', `bank-${name}`);
    await writeBundle(dir, specialize(bankGraph('bf16', d, ranks), { cutoff: 'static', shapesOnly: true }), { overwrite: true });
    const r = await generateTritonFromBundle(dir, join(OUT, 'triton', name));
    console.log(`triton ${name}: ${r.kernels.map((k) => k.name).join(', ')}`);
  }
}
await writeFile(join(OUT, 'mixes.json'), JSON.stringify(MIXES));

// 4. The generated fused LoRA linear (4096², bf16, r16, s = 2) that bench/gpu/splitk.py compares with.
const loraDir = join(OUT, 'bundles', 'lora-bf16-r16');
await writeBundle(loraDir, specialize(loraGraph('bf16', { inDim: 4096, outDim: 4096 }, 16), { cutoff: 'static', shapesOnly: true }), { overwrite: true });
await generateTritonFromBundle(loraDir, join(OUT, 'triton', 'lora-bf16-r16'));
