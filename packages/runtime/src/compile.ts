import type { AnnotationSpec, StageLattice } from '@stageml/annotations';
import { type BuilderOptions, type Graph, type GraphBuilder, type HostTensor, type Value, traceGraph } from '@stageml/ir';
import type { Executor } from './executor.js';
import { interpreterExecutor } from './interpreter-executor.js';
import { type SpecializeReport, specialize } from './specialize.js';
import { type ValueSource, chainStores, toStore } from './values.js';

/** Annotations for `compileStaged`: the spec plus the lattice its stage names belong to. */
export interface StagedAnnotations extends AnnotationSpec {
  /** Lattice of the stage names (default `static < dynamic`). */
  readonly lattice?: StageLattice;
}

/** Options of `compileStaged`. */
export interface CompileStagedOptions {
  /** Graph name (default `staged`). */
  readonly name?: string;
  /** Last stage computed ahead of time. */
  readonly cutoff: string;
  /** Values of inputs and parameters at or before the cutoff. */
  readonly values?: ValueSource;
  /** Data of parameters later than the cutoff (read when the residual is prepared). */
  readonly weights?: ValueSource;
  /** Executor that runs the residual (default: the reference interpreter). */
  readonly executor?: Executor;
  /** Builder options for tracing. */
  readonly builder?: BuilderOptions;
}

/** A traced, specialized and prepared program: call `run` with the late inputs. */
export interface StagedProgram {
  /** Runs the residual on the inputs later than the cutoff. */
  run(inputs: Readonly<Record<string, HostTensor>>): Promise<Record<string, HostTensor>>;
  /** The traced graph before specialization. */
  readonly graph: Graph;
  /** The residual graph. */
  readonly residual: Graph;
  /** The constant table the residual runs with. */
  readonly constants: Readonly<Record<string, HostTensor>>;
  /** What specialization did. */
  readonly report: SpecializeReport;
  /** The executor running the residual. */
  readonly executor: string;
  /** Releases executor memory. */
  dispose(): void;
}

/**
 * Traces `fn`, analyses binding times under `annotations`, specializes at `options.cutoff` with
 * the early `values`, and prepares the residual on an executor: the one-call path from a
 * TypeScript model function to a callable residual.
 */
export async function compileStaged(
  fn: (b: GraphBuilder) => Value | readonly Value[] | Readonly<Record<string, Value>>,
  annotations: StagedAnnotations,
  options: CompileStagedOptions,
): Promise<StagedProgram> {
  const graph = traceGraph(options.name ?? 'staged', fn, options.builder);
  const { lattice, ...spec } = annotations;
  const result = specialize(graph, { ...(lattice === undefined ? {} : { lattice }), annotations: spec, cutoff: options.cutoff, ...(options.values === undefined ? {} : { values: options.values }) });
  const executor = options.executor ?? interpreterExecutor;
  const prepared = await executor.prepare(result.residual, chainStores(toStore(result.constants), toStore(options.weights)));
  return {
    run: (inputs) => prepared.run(inputs),
    graph,
    residual: result.residual,
    constants: result.constants,
    report: result.report,
    executor: prepared.executor,
    dispose: () => {
      prepared.dispose();
    },
  };
}
