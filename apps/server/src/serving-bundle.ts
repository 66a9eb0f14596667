import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { EngineOptions } from '@stageml/engine';
import { errorMessage } from '@stageml/ir';
import { BundleCode, BundleError } from '@stageml/runtime';

/** What `createServer({ bundle })` serves: the bundle's source model and adapters, and its plan. */
export interface ServingBundle {
  /** The model directory (`manifest.source.model`). */
  readonly modelDir: string;
  /** Adapters to load, name → directory (`manifest.source.adapters`). */
  readonly adapters: Readonly<Record<string, string>>;
  /** The bundle's `plan.json`, when it has one (checked by `Engine.load`). */
  readonly plan: EngineOptions['plan'];
}

function bad(dir: string, msg: string, cause?: unknown): never {
  throw new BundleError(BundleCode.INVALID, `bundle '${dir}': ${msg}`, cause === undefined ? {} : { cause });
}

async function readJson(dir: string, file: string, what: string): Promise<unknown> {
  let text: string;
  try {
    text = await readFile(join(dir, file), 'utf8');
  } catch (e) {
    return bad(dir, `${what} ${file} is missing or unreadable (${errorMessage(e)})`, e);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    return bad(dir, `${file} is not JSON (${errorMessage(e)})`, e);
  }
}

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * Reads what serving a bundle (written by `stageml stage --model`) needs from its directory:
 * `manifest.json`'s `source` (model directory, adapters by name; relative paths resolve against
 * the bundle) and `plan.json` when the manifest names one. Anything missing or malformed is
 * `BUNDLE_INVALID` naming the file and field.
 */
export async function readServingBundle(dir: string): Promise<ServingBundle> {
  const manifest = await readJson(dir, 'manifest.json', 'the manifest');
  if (!isRecord(manifest) || manifest['format'] !== 'stageml.bundle') bad(dir, 'manifest.json is not a stageml.bundle manifest');
  const source = manifest['source'];
  if (!isRecord(source) || typeof source['model'] !== 'string' || source['model'] === '') bad(dir, 'manifest.source.model must name the model directory (stage it with `stageml stage --model`)');
  const rawAdapters = source['adapters'] ?? {};
  if (!isRecord(rawAdapters)) bad(dir, 'manifest.source.adapters must be an object of name → adapter directory');
  const adapters: Record<string, string> = {};
  for (const [name, d] of Object.entries(rawAdapters)) {
    if (typeof d !== 'string' || d === '') bad(dir, `manifest.source.adapters['${name}'] must be a directory path`);
    adapters[name] = resolve(dir, d);
  }
  const planFile = manifest['plan'];
  if (planFile !== undefined && (typeof planFile !== 'string' || planFile.includes('/') || planFile.includes('\\') || planFile.startsWith('.'))) bad(dir, 'manifest.plan must name a file inside the bundle');
  // Engine.load checks the document (checkPlan, validatePlanDocument) before anything is served.
  const plan = planFile === undefined ? undefined : ((await readJson(dir, planFile, 'the plan')) as EngineOptions['plan']);
  return { modelDir: resolve(dir, source['model']), adapters, plan };
}

/** `BUNDLE_INVALID` unless every adapter the plan names is loaded. */
export function checkPlanAdapters(dir: string, plan: EngineOptions['plan'], loaded: readonly string[]): void {
  if (plan === undefined) return;
  const missing = plan.adapters.map((a) => a.name).filter((n) => !loaded.includes(n));
  if (missing.length > 0) bad(dir, `plan.json names adapter(s) ${missing.map((n) => `'${n}'`).join(', ')} that are not loaded (loaded: ${loaded.join(', ') || 'none'})`);
}
