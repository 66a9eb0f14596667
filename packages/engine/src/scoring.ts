import { type HostTensor, hostTensor } from '@stageml/ir';
import type { LlamaConfig } from '@stageml/models';
import type { PreparedGraph } from '@stageml/runtime';
import type { EngineAdapterDType, EngineDType } from './dtype.js';
import { castProgram } from './engine-load.js';
import { EngineCode, EngineError } from './errors.js';
import { engineGraph, paramsToInputs } from './graph.js';
import { MASKED } from './kv.js';
import { windowedQueries } from './masks.js';
import { type Lane, type ProgramRunner, runProgram } from './runner.js';
import type { Sequence } from './sequence.js';
import { ROW_SLOT_INPUT } from './slot-linear.js';
import type { SlotTables } from './slots.js';
import { type ProgramReport, foldProgram, isWeightParam, stageProgram } from './stage-program.js';

/** One scored chunk of a prompt: the logits f32[count × vocab] of positions [start, start + count). */
export interface ScoredChunk {
  readonly start: number;
  readonly logits: Float32Array;
}

/**
 * Prompt scoring (`Engine.promptLogitChunks`): the scoring program — the slot program with logits
 * at every position, staged and prepared on first use from the host values of the weights
 * `specialize` folds — and the chunked runs over a prompt, each chunk attending to the keys and
 * values the earlier chunks produced.
 */
export class PromptScorer {
  #scoring: Promise<PreparedGraph> | undefined;

  constructor(
    readonly config: LlamaConfig,
    readonly runner: ProgramRunner,
    readonly tables: SlotTables,
    /** Host values of the weights partial evaluation folds. */
    readonly foldSources: ReadonlyMap<string, HostTensor>,
    /** Per prepared program, where it came from; the scoring program's report joins it when prepared. */
    readonly reports: Map<string, ProgramReport>,
    readonly dtype: EngineDType,
    readonly adapterDtype: EngineAdapterDType,
    /** Whether every base weight is a run input (else scoring is `ENGINE_BAD_OPTIONS`). */
    readonly allWeightInputs: boolean,
  ) {}

  /** `ENGINE_BAD_OPTIONS` where the weights are held by the programs. */
  check(): void {
    if (!this.allWeightInputs) throw new EngineError(EngineCode.BAD_OPTIONS, "prompt logits need the engine's weights as inputs (weights: 'inputs')");
  }

  /**
   * Scores `seq`'s prompt (attached at `slot`, in `lane` if it has one) in chunks of at most
   * `chunk` tokens, yielding to the event loop between chunks. An executor that keeps the new keys
   * and values to itself scores the rest of the prompt in one run.
   */
  async *score(seq: Sequence, slot: number, lane: Lane | undefined, chunk: number): AsyncGenerator<ScoredChunk> {
    const prompt = seq.prompt;
    const program = await this.#program();
    const count = prompt.length;
    const keyMask = new Float32Array(count);
    seq.promptMask.forEach((v, i) => {
      if (v !== 1) keyMask[i] = MASKED;
    });
    let next = 0;
    const positions = seq.promptMask.map((v) => (v === 1 ? next++ : 1));
    const past: { k: Float32Array[]; v: Float32Array[] } = { k: [], v: [] };
    const V = this.config.vocabSize;
    const width = this.config.numKvHeads * this.config.headDim;
    // `whole`: the executor kept the new keys and values, so the rest is scored in one run from the start.
    let whole = false;
    for (let start = 0; start < count; ) {
      const from = whole ? 0 : start;
      const c = whole ? count : Math.min(chunk, count - start);
      const inputs = this.#inputs(prompt, positions, keyMask, from, c, past, lane, slot);
      await this.tables.settled();
      const out = await runProgram(program, inputs, this.runner.resident);
      this.runner.runs++;
      yield { start, logits: (out['logits']!.data as Float32Array).subarray((start - from) * V, c * V) };
      if (whole || start + c >= count) break;
      if (out['new_key.0']?.data.length !== c * width) whole = true;
      else {
        for (let l = 0; l < this.config.numLayers; l++) {
          past.k[l] = concatF32(past.k[l], out[`new_key.${String(l)}`]!.data as Float32Array);
          past.v[l] = concatF32(past.v[l], out[`new_value.${String(l)}`]!.data as Float32Array);
        }
      }
      start += c;
      // A timer, not setImmediate: the timers and I/O phases both run before the next chunk.
      await new Promise<void>((resolve) => setTimeout(resolve, 0));
    }
  }

  /** The scoring program (logits at every position), prepared on first use. */
  #program(): Promise<PreparedGraph> {
    if (this.#scoring === undefined) {
      const built = engineGraph(this.config, 'gathered', this.tables.slots, this.tables.rank, [], { allLogits: true, separateHead: 'lm_head.weight' in this.runner.weightInputs && this.config.tieWordEmbeddings, int8Factors: this.adapterDtype === 'int8' });
      const st = stageProgram(this.dtype === 'f32' ? built : castProgram(built, this.dtype, this.adapterDtype), 'scoring');
      const folded = foldProgram(st, { get: (n) => this.foldSources.get(n) });
      this.reports.set('scoring', st.report);
      this.#scoring = this.runner.executor.prepare(paramsToInputs(st.residual, (n) => isWeightParam(st, n)), { get: (n) => folded[n] });
      this.#scoring.catch(() => {
        this.#scoring = undefined;
      });
      this.runner.preparations++;
    }
    return this.#scoring;
  }

  /** Inputs of one scoring chunk: positions [start, start + c) over the keys and values of [0, start). */
  #inputs(prompt: readonly number[], positions: readonly number[], keyMask: Float32Array, start: number, c: number, past: { k: Float32Array[]; v: Float32Array[] }, lane: Lane | undefined, slot: number): Record<string, HostTensor> {
    const keys = start + c;
    const window = this.config.slidingWindow;
    const kvShape = [this.config.numKvHeads, this.config.headDim];
    const inputs: Record<string, HostTensor> = {
      input_ids: hostTensor('i64', [1, c], prompt.slice(start, keys)),
      position_ids: hostTensor('i64', [1, c], positions.slice(start, keys)),
      attention_mask: window === undefined ? { dtype: 'f32', shape: [1, keys], data: keyMask.slice(0, keys) } : { dtype: 'f32', shape: [1, c, keys], data: windowedQueries(keyMask.slice(0, keys), start, c, window) },
    };
    for (let l = 0; l < this.config.numLayers; l++) {
      inputs[`past_key.${String(l)}`] = { dtype: this.dtype, shape: [1, start, ...kvShape], data: start === 0 ? new Float32Array(0) : past.k[l]! };
      inputs[`past_value.${String(l)}`] = { dtype: this.dtype, shape: [1, start, ...kvShape], data: start === 0 ? new Float32Array(0) : past.v[l]! };
    }
    Object.assign(inputs, this.tables.inputs, lane?.weights ?? this.runner.weightInputs);
    inputs[ROW_SLOT_INPUT] = hostTensor('i64', [1], [slot]);
    this.runner.tokenSlots(inputs, [slot]);
    return inputs;
  }

  /** Releases the scoring program, once prepared. */
  dispose(): void {
    this.#scoring?.then((p) => { p.dispose(); }, () => undefined);
  }
}

/** `a` followed by `b` (`b` alone when `a` is undefined). */
function concatF32(a: Float32Array | undefined, b: Float32Array): Float32Array {
  if (a === undefined) return b.slice();
  const out = new Float32Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}
