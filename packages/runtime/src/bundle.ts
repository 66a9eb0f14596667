import { mkdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { type Annotations, StageLattice } from '@stageml/annotations';
import {
  type Graph,
  type HostTensor,
  StageError,
  graphInputs,
  graphParams,
  parseGraph,
  printGraph,
  stripSpans,
  typeToString,
} from '@stageml/ir';
import { SafetensorsFile, writeSafetensors } from '@stageml/safetensors';
import { RuntimeCode, RuntimeError } from './errors.js';
import type { SpecializeReport, SpecializeResult } from './specialize.js';

/** Version of the bundle manifest this build writes and reads. */
export const BUNDLE_VERSION = 1;
/** The manifest's `format` tag. */
export const BUNDLE_FORMAT = 'stageml.bundle';

/** `manifest.json` of a residual bundle (schema in docs/bundle.md). */
export interface BundleManifest {
  readonly format: typeof BUNDLE_FORMAT;
  readonly version: number;
  /** The residual program in IR text, relative to the bundle directory. */
  readonly graph: string;
  /** The constant table, relative to the bundle directory. */
  readonly constants: string;
  /** A plan file (written by the planner), when there is one. */
  readonly plan?: string;
  /** Stage names of the lattice, earliest first. */
  readonly lattice: readonly string[];
  /** The cutoff the residual was specialized at. */
  readonly cutoff: string;
  /** Stage of each residual input and parameter. */
  readonly stages: Readonly<Record<string, string>>;
  /** Residual inputs (supplied per run). */
  readonly inputs: readonly { readonly name: string; readonly type: string }[];
  /** Residual parameters and where their data comes from. */
  readonly params: readonly { readonly name: string; readonly type: string; readonly source: 'constants' | 'external' }[];
  /** Residual outputs. */
  readonly outputs: readonly { readonly name: string; readonly type: string }[];
  /** What specialization did. */
  readonly report?: SpecializeReport;
}

/** A bundle loaded from disk, ready for an executor. */
export interface LoadedBundle {
  readonly dir: string;
  readonly manifest: BundleManifest;
  readonly residual: Graph;
  readonly constants: Readonly<Record<string, HostTensor>>;
  readonly annotations: Annotations;
  /** Parsed plan JSON, when the bundle has one. */
  readonly plan?: unknown;
}

/** Options of `writeBundle`. */
export interface WriteBundleOptions {
  /** Replace an existing bundle directory (default false: an existing directory is an error). */
  readonly overwrite?: boolean;
  /** A plan to store as `plan.json`. */
  readonly plan?: unknown;
}

async function exists(p: string): Promise<boolean> {
  try {
    await stat(p);
    return true;
  } catch {
    return false;
  }
}

/**
 * Writes a residual bundle directory: `manifest.json`, `residual.ir`, `constants.safetensors` and,
 * when given, `plan.json`. The directory appears complete or not at all: files are written to a
 * temporary sibling directory which is then renamed into place.
 */
export async function writeBundle(dir: string, result: SpecializeResult, opts: WriteBundleOptions = {}): Promise<BundleManifest> {
  if ((await exists(dir)) && opts.overwrite !== true) {
    throw new RuntimeError(RuntimeCode.IO, `bundle directory '${dir}' already exists`, { hint: 'pass overwrite: true (the CLI: --force) to replace it' });
  }
  const { residual, constants, annotations } = result;
  const stages: Record<string, string> = {};
  for (const [name, s] of annotations.stages) stages[name] = annotations.lattice.name(s);
  const manifest: BundleManifest = {
    format: BUNDLE_FORMAT,
    version: BUNDLE_VERSION,
    graph: 'residual.ir',
    constants: 'constants.safetensors',
    ...(opts.plan === undefined ? {} : { plan: 'plan.json' }),
    lattice: annotations.lattice.names,
    cutoff: result.report.cutoff,
    stages,
    inputs: graphInputs(residual).map((n) => ({ name: n.name, type: typeToString(residual.values[n.results[0]!]!.type) })),
    params: graphParams(residual).map((n) => ({
      name: n.name,
      type: typeToString(residual.values[n.results[0]!]!.type),
      source: Object.hasOwn(constants, n.name) ? 'constants' : 'external',
    })),
    outputs: residual.outputs.map((o) => ({ name: o.name, type: typeToString(residual.values[o.value]!.type) })),
    report: result.report,
  };
  const tmp = join(dirname(dir), `.${basename(dir)}.tmp-${String(process.pid)}-${String(Date.now())}`);
  try {
    await mkdir(tmp, { recursive: true });
    await writeFile(join(tmp, 'residual.ir'), printGraph(residual));
    await writeSafetensors(join(tmp, 'constants.safetensors'), constants, { format: 'stageml-constants' });
    if (opts.plan !== undefined) await writeFile(join(tmp, 'plan.json'), `${JSON.stringify(opts.plan, null, 2)}\n`);
    await writeFile(join(tmp, 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`);
    if (await exists(dir)) await rm(dir, { recursive: true, force: true });
    await rename(tmp, dir);
  } catch (e) {
    await rm(tmp, { recursive: true, force: true });
    if (e instanceof StageError) throw e;
    throw new RuntimeError(RuntimeCode.IO, `cannot write bundle '${dir}': ${(e as Error).message}`, { cause: e });
  }
  return manifest;
}

function bad(dir: string, msg: string, cause?: unknown): never {
  throw new RuntimeError(RuntimeCode.BAD_BUNDLE, `bundle '${dir}': ${msg}`, { cause });
}

function checkManifest(dir: string, raw: unknown): BundleManifest {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) bad(dir, 'manifest.json is not an object');
  const m = raw as Record<string, unknown>;
  if (m['format'] !== BUNDLE_FORMAT) bad(dir, `manifest format must be "${BUNDLE_FORMAT}"`);
  if (m['version'] !== BUNDLE_VERSION) bad(dir, `manifest version ${JSON.stringify(m['version'])} is not supported (this build reads ${String(BUNDLE_VERSION)})`);
  for (const k of ['graph', 'constants', 'cutoff']) if (typeof m[k] !== 'string') bad(dir, `manifest.${k} must be a string`);
  for (const k of ['lattice', 'inputs', 'params', 'outputs']) if (!Array.isArray(m[k])) bad(dir, `manifest.${k} must be an array`);
  if (typeof m['stages'] !== 'object' || m['stages'] === null) bad(dir, 'manifest.stages must be an object');
  for (const k of ['graph', 'constants', 'plan']) {
    const v = m[k];
    if (typeof v === 'string' && (v.includes('/') || v.includes('\\') || v.startsWith('.'))) bad(dir, `manifest.${k} must name a file inside the bundle`);
  }
  return m as unknown as BundleManifest;
}

/**
 * Loads a residual bundle written by `writeBundle`, checking the manifest, the residual (parsed
 * and verified) and every constant against the residual's declared types. Any problem is
 * `RT_BAD_BUNDLE` naming the file; nothing partial is returned.
 */
export async function loadBundle(dir: string): Promise<LoadedBundle> {
  let manifestText: string;
  try {
    manifestText = await readFile(join(dir, 'manifest.json'), 'utf8');
  } catch (e) {
    return bad(dir, 'manifest.json is missing or unreadable', e);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(manifestText);
  } catch (e) {
    return bad(dir, `manifest.json is not JSON (${(e as Error).message})`, e);
  }
  const manifest = checkManifest(dir, raw);
  let lattice: StageLattice;
  try {
    lattice = new StageLattice(manifest.lattice);
  } catch (e) {
    return bad(dir, `manifest.lattice is invalid: ${(e as Error).message}`, e);
  }
  let residual: Graph;
  try {
    residual = stripSpans(parseGraph(await readFile(join(dir, manifest.graph), 'utf8')));
  } catch (e) {
    return bad(dir, `${manifest.graph}: ${e instanceof StageError ? `${String(e.code)}: ` : ''}${(e as Error).message}`, e);
  }
  const constants: Record<string, HostTensor> = {};
  let file: SafetensorsFile | undefined;
  try {
    file = await SafetensorsFile.open(join(dir, manifest.constants));
    for (const p of graphParams(residual)) {
      if (!file.has(p.name)) continue;
      const t = await file.readTensor(p.name);
      const want = residual.values[p.results[0]!]!.type;
      if (t.dtype !== want.dtype || t.shape.length !== want.shape.length || want.shape.some((d, i) => typeof d === 'number' && d !== t.shape[i])) {
        bad(dir, `constant '${p.name}' is ${t.dtype}[${t.shape.join(', ')}], the residual declares ${typeToString(want)}`);
      }
      constants[p.name] = t;
    }
    const extra = file.names().filter((n) => !Object.hasOwn(constants, n));
    if (extra.length > 0) bad(dir, `${manifest.constants} holds tensors the residual does not use: ${extra.slice(0, 5).join(', ')}`);
  } catch (e) {
    if (e instanceof RuntimeError) throw e;
    return bad(dir, `${manifest.constants}: ${e instanceof StageError ? `${String(e.code)}: ` : ''}${(e as Error).message}`, e);
  } finally {
    await file?.close();
  }
  for (const p of manifest.params) {
    if (p.source === 'constants' && !Object.hasOwn(constants, p.name)) bad(dir, `constant '${p.name}' is missing from ${manifest.constants}`);
  }
  const inputs = graphInputs(residual).map((n) => n.name);
  if (JSON.stringify(inputs) !== JSON.stringify(manifest.inputs.map((i) => i.name))) bad(dir, 'manifest inputs do not match the residual');
  const stages = new Map<string, number>();
  for (const [name, stage] of Object.entries(manifest.stages)) {
    if (!lattice.has(stage)) bad(dir, `manifest.stages['${name}'] names unknown stage '${stage}'`);
    stages.set(name, lattice.index(stage));
  }
  let plan: unknown;
  if (manifest.plan !== undefined) {
    try {
      plan = JSON.parse(await readFile(join(dir, manifest.plan), 'utf8'));
    } catch (e) {
      return bad(dir, `${manifest.plan} is missing or not JSON`, e);
    }
  }
  return { dir, manifest, residual, constants, annotations: { lattice, stages }, ...(plan === undefined ? {} : { plan }) };
}
