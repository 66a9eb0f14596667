// The residual graphs whose generated CUDA is golden-tested and compiled with nvcc.
import type { Graph } from '@stageml/ir';
import { bankGraph, bgmvGraph, loraGraph, moeExpertGraph } from '../../triton-gen/test/graphs.js';

const D = { inDim: 4096, outDim: 4096 };

/** Case name → residual graph. */
export const CUDA_CASES: Readonly<Record<string, Graph>> = {
  'lora-bf16': loraGraph('bf16', D, 16),
  'lora-f16-r64': loraGraph('f16', { inDim: 256, outDim: 128 }, 64, 0.5),
  'bank-bf16': bankGraph('bf16', D, [8, 16, 64]),
  'bgmv-f16': bgmvGraph('f16', D, 64, 16),
  'moe-bf16': moeExpertGraph('bf16', D, 8, 16),
};
