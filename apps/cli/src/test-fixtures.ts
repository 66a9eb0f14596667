// Test helpers of the CLI's tests (not exported from the package).
import { fileURLToPath } from 'node:url';
import { type HostTensor, hostTensor } from '@stageml/ir';
import { runCli } from './cli.js';

/** Path of `p` under the repository's fixtures/. */
export const fixture = (p: string): string => fileURLToPath(new URL(`../../../fixtures/${p}`, import.meta.url));

/** Runs the CLI in-process, capturing its exit code and output lines. */
export async function runCaptured(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runCli(args, { out: (l) => out.push(l), err: (l) => err.push(l) });
  return { code, out: out.join('\n'), err: err.join('\n') };
}

/** Inputs of a staged Llama residual for a prefill of `ids` with an empty KV cache (batch 1). */
export function prefillInputs(ids: number[], layers: number, kvHeads: number, headDim: number): Record<string, HostTensor> {
  const t = ids.length;
  const inputs: Record<string, HostTensor> = {
    input_ids: hostTensor('i64', [1, t], ids),
    position_ids: hostTensor('i64', [1, t], ids.map((_, i) => i)),
    attention_mask: hostTensor('f32', [1, t], new Array<number>(t).fill(0)),
  };
  for (let l = 0; l < layers; l++) {
    inputs[`past_key.${String(l)}`] = hostTensor('f32', [1, kvHeads, 0, headDim], []);
    inputs[`past_value.${String(l)}`] = hostTensor('f32', [1, kvHeads, 0, headDim], []);
  }
  return inputs;
}
