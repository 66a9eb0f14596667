// The bundle format lives in @stageml/bundle; this module attaches staging annotations to it, so a
// loaded bundle can be specialized again or handed to an executor.
import { type Annotations, StageLattice } from '@stageml/annotations';
import { type BundleData, type BundleManifest, type WriteBundleOptions, loadBundle as loadBundleData, writeBundle as writeBundleData } from '@stageml/bundle';
import type { SpecializeResult } from './specialize.js';

export { BUNDLE_FORMAT, BUNDLE_VERSION } from '@stageml/bundle';
export type { BundleManifest, WriteBundleOptions } from '@stageml/bundle';

/** A bundle loaded from disk, ready for an executor. */
export interface LoadedBundle extends BundleData {
  /** Stages of the residual's inputs and parameters. */
  readonly annotations: Annotations;
}

/**
 * Writes a specialization result as a residual bundle directory (see `@stageml/bundle`'s
 * `writeBundle`): complete or not at all; an existing directory is `BUNDLE_IO` unless `overwrite`.
 */
export async function writeBundle(dir: string, result: SpecializeResult, opts: WriteBundleOptions = {}): Promise<BundleManifest> {
  const { residual, constants, annotations, report } = result;
  const stages: Record<string, string> = {};
  for (const [name, s] of annotations.stages) stages[name] = annotations.lattice.name(s);
  return writeBundleData(dir, { residual, constants, lattice: annotations.lattice.names, stages, cutoff: report.cutoff, report }, opts);
}

/**
 * Loads a residual bundle (see `@stageml/bundle`'s `loadBundle`; any problem is `BUNDLE_INVALID`)
 * with its stage annotations.
 */
export async function loadBundle(dir: string): Promise<LoadedBundle> {
  const data = await loadBundleData(dir);
  const lattice = new StageLattice(data.lattice);
  const stages = new Map<string, number>();
  for (const [name, stage] of Object.entries(data.stages)) stages.set(name, lattice.index(stage));
  return { ...data, annotations: { lattice, stages } };
}
