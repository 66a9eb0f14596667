// Prepares the GPU bench: builds one residual bundle per bench case (shapes only: the check
// scripts draw fresh random weights), then runs the generators on each bundle exactly as
// `stageml gen triton|cuda BUNDLE --out DIR` does. Output: bench/gpu/out/{bundles,triton,cuda}/<case>,
// carried to the GPU machine by bench/gpu/device.sh's caller. Run: node --conditions=@stageml/source
// --import tsx bench/gpu/prepare.ts
import { join } from 'node:path';
import type { Graph } from '@stageml/ir';
import { specialize, writeBundle } from '@stageml/runtime';
import { generateCudaFromBundle } from '@stageml/sm90-native';
import { generateTritonFromBundle } from '@stageml/triton-gen';
import { bankGraph, bgmvGraph, loraGraph, moeExpertGraph } from '../../packages/triton-gen/test/graphs.js';

const OUT = join(import.meta.dirname, 'out');
const D = { inDim: 4096, outDim: 4096 };
const ADAPTERS = 64;
const mixed = Array.from({ length: ADAPTERS }, (_, i) => [8, 16, 64][i % 3]!);

/** Bench cases: name → residual graph. */
const CASES: Record<string, Graph> = {
  lora_bf16_r16: loraGraph('bf16', D, 16),
  lora_bf16_r64: loraGraph('bf16', D, 64),
  lora_f16_r16: loraGraph('f16', D, 16),
  lora_f32_r16: loraGraph('f32', D, 16),
  sgmv_bf16_r8: bankGraph('bf16', D, Array.from({ length: ADAPTERS }, () => 8)),
  sgmv_bf16_r16: bankGraph('bf16', D, Array.from({ length: ADAPTERS }, () => 16)),
  sgmv_bf16_r64: bankGraph('bf16', D, Array.from({ length: ADAPTERS }, () => 64)),
  sgmv_bf16_mixed: bankGraph('bf16', D, mixed),
  bgmv_bf16_r16: bgmvGraph('bf16', D, ADAPTERS, 16),
  moe_bf16_r16: moeExpertGraph('bf16', D, 8, 16),
};

for (const [name, g] of Object.entries(CASES)) {
  const bundle = join(OUT, 'bundles', name);
  await writeBundle(bundle, specialize(g, { cutoff: 'static', shapesOnly: true }), { overwrite: true });
  const tri = await generateTritonFromBundle(bundle, join(OUT, 'triton', name));
  // NOTE: the tensor-core kernels take f16/bf16 only (SM90_UNSUPPORTED_DTYPE): f32 cases are Triton-only.
  const cuda = name.includes('_f32_') ? undefined : await generateCudaFromBundle(bundle, join(OUT, 'cuda', name));
  console.log(`${name}: triton ${tri.kernels.map((k) => k.name).join(', ')}; cuda ${cuda?.kernels.map((k) => k.name).join(', ') ?? '-'}`);
}
