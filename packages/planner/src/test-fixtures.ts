import { readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type LlamaConfig, parseLlamaConfig } from '@stageml/models';
import { type LoraAdapter, loadLoraAdapter } from '@stageml/peft';

/** Root of the tiny PEFT fixtures (`fixtures/peft-tiny`). */
export const FIXTURES = fileURLToPath(new URL('../../../fixtures/peft-tiny', import.meta.url));

/** The fixture model's config and every adapter under its `adapters/` directory, by name order. */
export async function loadFixture(family: 'llama' | 'mixtral'): Promise<{ config: LlamaConfig; adapters: LoraAdapter[] }> {
  const root = join(FIXTURES, family);
  const config = parseLlamaConfig(await readFile(join(root, 'base', 'config.json'), 'utf8'));
  const names = (await readdir(join(root, 'adapters'), { withFileTypes: true }))
    .filter((e) => e.isDirectory())
    .map((e) => e.name)
    .sort();
  const adapters = await Promise.all(names.map((n) => loadLoraAdapter(join(root, 'adapters', n))));
  return { config, adapters };
}
