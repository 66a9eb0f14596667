// Test-only helpers shared by the executor golden suites (onnxruntime, torch): the peft-tiny
// fixture goldens written by transformers + PEFT, and the per-family check every executor must pass.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { HostTensor } from '@stageml/ir';
import { SafetensorsFile } from '@stageml/safetensors';
import { expect } from 'vitest';
import type { CausalLM } from './causal-lm.js';
import { generate } from './generate.js';

/** The peft-tiny fixture directory (with a trailing slash). */
export const FIXTURE_ROOT = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));

/** `golden.json` of the fixture. */
export interface Golden {
  families: { llama: { adapters: string[] }; mixtral: { adapters: string[] } };
  'llama.mixed': { adapter_names: string[]; input_ids: number[] };
  [k: string]: unknown;
}

/** The parsed `golden.json`. */
export const GOLDEN = JSON.parse(readFileSync(`${FIXTURE_ROOT}golden.json`, 'utf8')) as Golden;

/** Prompt `p` of `family.model`: its ids and the 12 greedy ids transformers generated. */
export function goldenPrompt(family: string, model: string, p: number): { input_ids: number[]; greedy_new_ids: number[] } {
  return (GOLDEN[`${family}.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;
}

/** The Llama and Mixtral golden logits of `golden.safetensors`, by name. */
export async function readGoldenLogits(): Promise<Record<string, HostTensor>> {
  const want: Record<string, HostTensor> = {};
  const f = await SafetensorsFile.open(`${FIXTURE_ROOT}golden.safetensors`);
  for (const k of f.names()) if (k.startsWith('llama.') || k.startsWith('mixtral.')) want[k] = await f.readTensor(k);
  await f.close();
  return want;
}

/** max |a − b| over two tensors of equal size. */
export function maxAbsDiff(a: HostTensor, b: HostTensor): number {
  expect(a.data.length).toBe(b.data.length);
  let m = 0;
  for (let i = 0; i < a.data.length; i++) m = Math.max(m, Math.abs(a.data[i]! - b.data[i]!));
  return m;
}

/** Every prompt of `family.model` (`base` or an adapter): logits within 1e-4 and greedy ids equal. */
export async function checkGoldenFamily(lm: CausalLM, want: Readonly<Record<string, HostTensor>>, family: string, model: string): Promise<void> {
  const adapter = model === 'base' ? undefined : model;
  for (let p = 0; p < 4; p++) {
    const { input_ids, greedy_new_ids } = goldenPrompt(family, model, p);
    const { logits } = await lm.forward([input_ids], { adapters: [adapter] });
    expect(maxAbsDiff(logits, want[`${family}.${model}.prompt${String(p)}.logits`]!), `${model} prompt ${String(p)}`).toBeLessThanOrEqual(1e-4);
    const gen = await generate(lm, input_ids, { adapter, maxNewTokens: 12, padTokenId: 0, stopTokens: [] });
    expect(gen.newIds, `${model} prompt ${String(p)} greedy ids`).toEqual(greedy_new_ids);
  }
}
