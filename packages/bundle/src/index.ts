/**
 * @packageDocumentation
 * `@stageml/bundle`: the residual bundle format, with no executor attached.
 *
 * A bundle is a directory: `manifest.json` (`BundleManifest`), `residual.ir` (the residual program
 * in IR text), `constants.safetensors` (its constant table) and an optional `plan.json`.
 * `writeBundle` writes one atomically (complete or not at all); `loadBundle` reads one back,
 * checking the manifest, the residual and every constant against the residual's declared types.
 * Depends only on `@stageml/ir` and `@stageml/safetensors`, so code generators read bundles without
 * pulling in an executor. `@stageml/runtime` re-exports it with staging annotations attached.
 */
export { BundleCode, BundleError } from './errors.js';
export type { BundleErrorCode } from './errors.js';
export { BUNDLE_FORMAT, BUNDLE_VERSION } from './manifest.js';
export type { BundleManifest, SpecializeReport } from './manifest.js';
export { loadBundle, writeBundle } from './bundle.js';
export type { BundleContents, BundleData, WriteBundleOptions } from './bundle.js';
export { isOccupied, pathExists, writeDirAtomic, writeFilesAtomic } from './atomic-dir.js';
