/** Version of the bundle manifest this build writes and reads. */
export const BUNDLE_VERSION = 1;
/** The manifest's `format` tag. */
export const BUNDLE_FORMAT = 'stageml.bundle';

/** What specialization did, for logs and the CLI (stored in the manifest as `report`). */
export interface SpecializeReport {
  /** Cutoff stage. */
  readonly cutoff: string;
  /** The lattice, as `a < b < …`. */
  readonly lattice: string;
  /** Op nodes of the original graph. */
  readonly originalOps: number;
  /** Static op nodes evaluated (only those the residual needs). */
  readonly foldedOps: number;
  /** Static op nodes not evaluated because nothing later uses them. */
  readonly skippedStaticOps: number;
  /** Op nodes of the residual. */
  readonly residualOps: number;
  /** Dynamic op nodes dropped because no output uses them. */
  readonly deadOps: number;
  /** Constants in the table. */
  readonly constants: number;
  /** Bytes of the constant table (host storage). */
  readonly constantBytes: number;
  /** Residual inputs. */
  readonly residualInputs: readonly string[];
  /** Symbolic FLOPs of the residual and of the original graph. */
  readonly flops: { readonly original: string; readonly residual: string };
}

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
