import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { type Graph, type HostTensor, StageError, errorMessage, graphInputs, graphParams, parseGraph, printGraph, stripSpans, typeToString } from '@stageml/ir';
import { SafetensorsFile, writeSafetensors } from '@stageml/safetensors';
import { pathExists, writeDirAtomic } from './atomic-dir.js';
import { BundleCode, BundleError } from './errors.js';
import { BUNDLE_FORMAT, BUNDLE_VERSION, type BundleManifest, type SpecializeReport } from './manifest.js';

/** What a bundle holds, as `writeBundle` takes it. */
export interface BundleContents {
  /** The residual graph. */
  readonly residual: Graph;
  /** Constants the residual reads as parameters, by name. */
  readonly constants: Readonly<Record<string, HostTensor>>;
  /** Stage names of the lattice, earliest first. */
  readonly lattice: readonly string[];
  /** Stage name of each residual input and parameter. */
  readonly stages: Readonly<Record<string, string>>;
  /** The cutoff the residual was specialized at. */
  readonly cutoff: string;
  /** What specialization did. */
  readonly report?: SpecializeReport;
}

/** A bundle loaded from disk: everything checked, stages by name. */
export interface BundleData extends BundleContents {
  /** The bundle directory. */
  readonly dir: string;
  /** Its manifest. */
  readonly manifest: BundleManifest;
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

const STAGE_NAME = /^[A-Za-z_][A-Za-z0-9_-]*$/;

/** Why a lattice and stage table are inconsistent, or undefined when they are fine. */
function latticeProblem(lattice: readonly string[], stages: Readonly<Record<string, string>>): string | undefined {
  if (lattice.length === 0) return 'the lattice has no stage';
  const seen = new Set<string>();
  for (const n of lattice) {
    if (typeof n !== 'string' || !STAGE_NAME.test(n)) return `stage name ${JSON.stringify(n)} is not an identifier`;
    if (seen.has(n)) return `stage '${n}' appears twice`;
    seen.add(n);
  }
  for (const [name, stage] of Object.entries(stages)) if (!seen.has(stage)) return `stages['${name}'] names unknown stage '${stage}'`;
  return undefined;
}

/**
 * Writes a residual bundle directory: `manifest.json`, `residual.ir`, `constants.safetensors` and,
 * when given, `plan.json`. The directory appears complete or not at all: files are written to a
 * temporary sibling directory which is then renamed into place.
 */
export async function writeBundle(dir: string, contents: BundleContents, opts: WriteBundleOptions = {}): Promise<BundleManifest> {
  if ((await pathExists(dir)) && opts.overwrite !== true) {
    throw new BundleError(BundleCode.IO, `bundle directory '${dir}' already exists`, { hint: 'pass overwrite: true (the CLI: --force) to replace it' });
  }
  const { residual, constants, lattice, stages, cutoff, report } = contents;
  const problem = latticeProblem(lattice, stages) ?? (lattice.includes(cutoff) ? undefined : `cutoff '${cutoff}' is not a stage of the lattice`);
  if (problem !== undefined) throw new BundleError(BundleCode.BAD_CONTENTS, `bundle '${dir}': ${problem}`);
  const manifest: BundleManifest = {
    format: BUNDLE_FORMAT,
    version: BUNDLE_VERSION,
    graph: 'residual.ir',
    constants: 'constants.safetensors',
    ...(opts.plan === undefined ? {} : { plan: 'plan.json' }),
    lattice: [...lattice],
    cutoff,
    stages: { ...stages },
    inputs: graphInputs(residual).map((n) => ({ name: n.name, type: typeToString(residual.values[n.results[0]!]!.type) })),
    params: graphParams(residual).map((n) => ({
      name: n.name,
      type: typeToString(residual.values[n.results[0]!]!.type),
      source: Object.hasOwn(constants, n.name) ? 'constants' : 'external',
    })),
    outputs: residual.outputs.map((o) => ({ name: o.name, type: typeToString(residual.values[o.value]!.type) })),
    ...(report === undefined ? {} : { report }),
  };
  try {
    await writeDirAtomic(dir, async (tmp) => {
      await writeFile(join(tmp, 'residual.ir'), printGraph(residual));
      await writeSafetensors(join(tmp, 'constants.safetensors'), constants, { format: 'stageml-constants' });
      if (opts.plan !== undefined) await writeFile(join(tmp, 'plan.json'), `${JSON.stringify(opts.plan, null, 2)}\n`);
      await writeFile(join(tmp, 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`);
    });
  } catch (e) {
    if (e instanceof StageError) throw e;
    throw new BundleError(BundleCode.IO, `cannot write bundle '${dir}': ${errorMessage(e)}`, { cause: e });
  }
  return manifest;
}

function bad(dir: string, msg: string, cause?: unknown): never {
  throw new BundleError(BundleCode.INVALID, `bundle '${dir}': ${msg}`, { cause });
}

function codedMessage(e: unknown): string {
  return `${e instanceof StageError ? `${String(e.code)}: ` : ''}${errorMessage(e)}`;
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
 * `BUNDLE_INVALID` naming the file; nothing partial is returned.
 */
export async function loadBundle(dir: string): Promise<BundleData> {
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
    return bad(dir, `manifest.json is not JSON (${errorMessage(e)})`, e);
  }
  const manifest = checkManifest(dir, raw);
  const problem = latticeProblem(manifest.lattice, manifest.stages);
  if (problem !== undefined) bad(dir, `manifest: ${problem}`);
  let residual: Graph;
  try {
    residual = stripSpans(parseGraph(await readFile(join(dir, manifest.graph), 'utf8')));
  } catch (e) {
    return bad(dir, `${manifest.graph}: ${codedMessage(e)}`, e);
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
    if (e instanceof BundleError) throw e;
    return bad(dir, `${manifest.constants}: ${codedMessage(e)}`, e);
  } finally {
    await file?.close();
  }
  for (const p of manifest.params) {
    if (p.source === 'constants' && !Object.hasOwn(constants, p.name)) bad(dir, `constant '${p.name}' is missing from ${manifest.constants}`);
  }
  const inputs = graphInputs(residual).map((n) => n.name);
  if (JSON.stringify(inputs) !== JSON.stringify(manifest.inputs.map((i) => i.name))) bad(dir, 'manifest inputs do not match the residual');
  let plan: unknown;
  if (manifest.plan !== undefined) {
    try {
      plan = JSON.parse(await readFile(join(dir, manifest.plan), 'utf8'));
    } catch (e) {
      return bad(dir, `${manifest.plan} is missing or not JSON`, e);
    }
  }
  return {
    dir,
    manifest,
    residual,
    constants,
    lattice: manifest.lattice,
    stages: manifest.stages,
    cutoff: manifest.cutoff,
    ...(manifest.report === undefined ? {} : { report: manifest.report }),
    ...(plan === undefined ? {} : { plan }),
  };
}
