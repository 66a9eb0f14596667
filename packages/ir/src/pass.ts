import { IrCode, IrError, StageError } from './errors.js';
import type { Graph } from './graph.js';
import { verifyGraph } from './verify.js';
import { errorMessage } from './error-classes.js';

/** A named graph transformation. Passes return a new graph and never mutate their input. */
export interface Pass {
  /** Stable name, shown in timings and errors. */
  readonly name: string;
  /** Runs the pass. */
  run(graph: Graph): Graph;
}

/** Options of a pass pipeline run. */
export interface PassManagerOptions {
  /** Verify the graph after every pass (tests set this; like `mlir-opt --verify-each`). */
  readonly verifyEach?: boolean;
}

/** Wall time of one pass. */
export interface PassTiming {
  readonly pass: string;
  readonly ms: number;
}

/** Result of running a pipeline. */
export interface PassRunResult {
  readonly graph: Graph;
  readonly timings: readonly PassTiming[];
}

/**
 * Runs named passes in order, optionally verifying after each and timing every pass. A pass that
 * throws, or whose result does not verify, fails the run with `IR_PASS_FAILED` naming it.
 */
export class PassManager {
  readonly #passes: Pass[] = [];
  readonly #verifyEach: boolean;

  /** A pipeline of `passes`. */
  constructor(passes: readonly Pass[] = [], opts: PassManagerOptions = {}) {
    this.#passes.push(...passes);
    this.#verifyEach = opts.verifyEach ?? false;
  }

  /** Appends a pass; returns this pipeline. */
  add(pass: Pass): this {
    this.#passes.push(pass);
    return this;
  }

  /** Names of the passes, in order. */
  get passNames(): string[] {
    return this.#passes.map((p) => p.name);
  }

  /** Runs the pipeline on `graph`. */
  run(graph: Graph): PassRunResult {
    let g = graph;
    const timings: PassTiming[] = [];
    for (const p of this.#passes) {
      const t0 = performance.now();
      try {
        g = p.run(g);
        if (this.#verifyEach) verifyGraph(g);
      } catch (e) {
        const code = e instanceof StageError ? `${String(e.code)}: ` : '';
        throw new IrError(IrCode.PASS_FAILED, `pass '${p.name}' failed: ${code}${errorMessage(e)}`, {
          cause: e,
          at: e instanceof StageError ? e.at : undefined,
        });
      }
      timings.push({ pass: p.name, ms: performance.now() - t0 });
    }
    return { graph: g, timings };
  }
}
