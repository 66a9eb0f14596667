import { SERVING_STAGES } from '@stageml/annotations';
import { type Graph, type HostTensor, StageError, graphInputs, graphParams, hostTensor, zeros, errorMessage } from '@stageml/ir';
import { type ExpertLora, expertLoraFor } from '@stageml/moe';
import { type LoraAdapter, type LoraForm, checkAdapterAgainstBase, loadLoraAdapter, scalingFor } from '@stageml/peft';
import { type Executor, type PreparedGraph, type QuantizeLinearsOptions, type WeightQuantSpec, interpreterExecutor, quantizeLinears, specialize } from '@stageml/runtime';
import { openCheckpoint } from '@stageml/safetensors';
import { ModelCode, ModelError } from './errors.js';
import { readParam } from './checkpoint-map.js';
import { type LlamaConfig, familyGraphOptions, readLlamaConfig } from './hf-config.js';
import { adapterParamName, bankLinear, expertParamName, loraExperts, rowsInputName, singleAdapterLinear } from './linear-factories.js';
import { type LinearFactory, buildLlamaGraph } from './llama-graph.js';
import { type TextTokenizer, loadTokenizer } from './tokenizer.js';

/** Options of `CausalLM.load`. */
export interface CausalLMOptions {
  /** Executor that runs residual programs (default: the reference interpreter). */
  readonly executor?: Executor;
  /** How single-adapter programs apply LoRA (default `residual`, as PEFT computes). */
  readonly form?: LoraForm;
  /**
   * Weight-only quantization of every program's linear layers after staging (`quantizeLinears`):
   * a spec (`parseWeightQuantSpec('int8')`) for every base projection and the LM head, or full
   * options (a per-weight `choose`, e.g. the planner's `weightQuantChooser` for `--quantize auto`).
   * LoRA factors stay f32. Default: none (f32).
   */
  readonly quantize?: WeightQuantSpec | QuantizeLinearsOptions;
}

/** Key/value cache of a batch after some positions: per-layer tensors [batch, kv_heads, past, head_dim]. */
export interface KvCache {
  /** Positions already in the cache. */
  readonly past: number;
  /** `present_key.<l>` / `present_value.<l>` of the last step. */
  readonly tensors: Readonly<Record<string, HostTensor>>;
  /** Per row, 1 for each cached position other tokens attend to, 0 for masked (padding) ones. */
  readonly mask: readonly (readonly number[])[];
  /** Per row, the rotary position of the next attended token. */
  readonly nextPosition: readonly number[];
}

/** Additive mask value of an ignored key: float32's lowest, as HF uses. */
const MASKED = -3.4028234663852886e38;

/** Result of one forward step. */
export interface ForwardResult {
  /** Logits f32[rows, tokens, vocab]. */
  readonly logits: HostTensor;
  /** The cache including this step's positions. */
  readonly cache: KvCache;
}

/**
 * The per-query additive mask f32[rows, len, past + len] of sliding-window attention: query i of a
 * row (cache position past + i) attends to attended keys j ≤ past + i whose attended-token index
 * is within `window - 1` of its own (as HF's `sliding_window` mask; padding is not counted).
 */
function slidingWindowMask(fullMask: readonly (readonly number[])[], past: number, len: number, window: number): HostTensor {
  const keys = past + len;
  const data = new Float32Array(fullMask.length * len * keys).fill(MASKED);
  fullMask.forEach((m, r) => {
    const index: number[] = [];
    let n = 0;
    for (const v of m) index.push(v === 1 ? n++ : -1);
    for (let i = 0; i < len; i++) {
      const q = past + i;
      const qi = index[q]! >= 0 ? index[q]! : (index.slice(0, q).filter((x) => x >= 0).at(-1) ?? 0);
      for (let j = 0; j <= q; j++) if (m[j] === 1 && qi - index[j]! < window) data[(r * len + i) * keys + j] = 0;
    }
  });
  return hostTensor('f32', [fullMask.length, len, keys], data);
}

/** The adapter of each row: a loaded adapter's name, or `undefined`/`null`/`'__base__'` for the base model. */
export type RowAdapters = readonly (string | null | undefined)[];

const BASE = '__base__';

interface Program {
  readonly prepared: PreparedGraph;
  readonly residual: Graph;
  readonly inputs: ReadonlySet<string>;
}

/**
 * A Hugging Face Llama-family causal LM (config.json + safetensors checkpoint + tokenizer) with
 * PEFT LoRA adapters. Each adapter configuration compiles once — trace, specialize at the
 * `adapter` stage (weights, merged deltas when planned), prepare on the executor — and then runs
 * prefill and decode steps whose late inputs are the new tokens and the KV cache.
 */
export class CausalLM {
  readonly #weights: Map<string, HostTensor>;
  readonly #adapters = new Map<string, LoraAdapter>();
  readonly #expertLora = new Map<string, Map<string, ExpertLora[]>>();
  readonly #programs = new Map<string, Promise<Program>>();
  readonly #executor: Executor;
  readonly #form: LoraForm;
  readonly #graphOptions: ReturnType<typeof familyGraphOptions>;
  readonly #quantize: QuantizeLinearsOptions | undefined;

  private constructor(
    /** The model directory. */
    readonly dir: string,
    /** The parsed config. */
    readonly config: LlamaConfig,
    /** The tokenizer, when the directory has one. */
    readonly tokenizer: TextTokenizer | undefined,
    weights: Map<string, HostTensor>,
    opts: CausalLMOptions,
  ) {
    this.#weights = weights;
    this.#executor = opts.executor ?? interpreterExecutor;
    this.#form = opts.form ?? 'residual';
    this.#graphOptions = familyGraphOptions(config);
    const q = opts.quantize;
    this.#quantize = q === undefined ? undefined : 'bits' in q ? { spec: q, cache: new WeakMap() } : { ...q, cache: q.cache ?? new WeakMap() };
  }

  /** The weight quantization programs are compiled with, if any. */
  get quantization(): QuantizeLinearsOptions | undefined {
    return this.#quantize;
  }

  /**
   * Loads `config.json`, the checkpoint (`model.safetensors` or a sharded index) and the tokenizer
   * from `dir`, checking every parameter the graph needs against the checkpoint (missing or wrongly
   * shaped tensors are `MODEL_BAD_WEIGHT` naming file and key).
   */
  static async load(dir: string, opts: CausalLMOptions = {}): Promise<CausalLM> {
    const config = await readLlamaConfig(dir);
    const graph = buildLlamaGraph(config, familyGraphOptions(config));
    const ckpt = await openCheckpoint(dir);
    const weights = new Map<string, HostTensor>();
    try {
      for (const p of graphParams(graph)) {
        weights.set(p.name, await readParam(ckpt, dir, p.name, graph.values[p.results[0]!]!.type.shape as number[]));
      }
    } finally {
      await ckpt.close();
    }
    return new CausalLM(dir, config, await loadTokenizer(dir), weights, opts);
  }

  /** Names of loaded adapters. */
  get adapterNames(): string[] {
    return [...this.#adapters.keys()];
  }

  /** The executor running this model's programs. */
  get executorName(): string {
    return this.#executor.name;
  }

  /**
   * Loads a PEFT adapter directory and checks it against this model (an adapter made for another
   * base model fails with the PEFT shape or module error naming the key and both shapes).
   */
  async loadAdapter(dir: string, name?: string): Promise<LoraAdapter> {
    const adapter = await loadLoraAdapter(dir, name === undefined ? {} : { name });
    if (adapter.name === BASE) throw new ModelError(ModelCode.BAD_ADAPTER, `'${BASE}' is reserved for the base model`);
    const experts = new Map<string, ExpertLora[]>();
    if (adapter.parameterFactors.length > 0) {
      const moe = this.config.moe;
      if (moe === undefined) {
        throw new ModelError(ModelCode.BAD_ADAPTER, `adapter '${adapter.name}' targets parameters (${adapter.config.targetParameters.join(', ')}), which ${this.config.modelType} models do not have`);
      }
      const shapes = { numExperts: moe.numExperts, hidden: this.config.hiddenSize, intermediate: moe.intermediateSize ?? this.config.intermediateSize };
      const modules = new Set(adapter.parameterFactors.map((f) => f.module));
      for (let l = 0; l < this.config.numLayers; l++) {
        const path = `model.layers.${String(l)}.mlp.experts`;
        if (!modules.delete(path)) continue;
        experts.set(`model.layers.${String(l)}.mlp`, expertLoraFor(adapter, path, shapes, scalingFor(adapter.config, path)));
      }
      if (modules.size > 0) throw new ModelError(ModelCode.BAD_ADAPTER, `adapter '${adapter.name}' targets '${[...modules][0]!}', which this model does not have`);
    }
    checkAdapterAgainstBase(adapter, (p) => this.#weights.get(p)?.shape ?? (p === 'lm_head.weight' && this.config.tieWordEmbeddings ? this.#weights.get('model.embed_tokens.weight')?.shape : undefined));
    this.unloadAdapter(adapter.name);
    this.#adapters.set(adapter.name, adapter);
    this.#expertLora.set(adapter.name, experts);
    return adapter;
  }

  /** Forgets an adapter and disposes the programs compiled for it (their executor memory is freed). */
  unloadAdapter(name: string): boolean {
    const had = this.#adapters.delete(name);
    this.#expertLora.delete(name);
    for (const [key, program] of [...this.#programs]) {
      if (!key.split('|').includes(name)) continue;
      this.#programs.delete(key);
      program.then(
        (p) => {
          p.prepared.dispose();
        },
        () => undefined,
      );
    }
    return had;
  }

  #adapter(name: string): LoraAdapter {
    const a = this.#adapters.get(name);
    if (a === undefined) throw new ModelError(ModelCode.BAD_ADAPTER, `adapter '${name}' is not loaded (loaded: ${this.adapterNames.join(', ') || 'none'})`);
    return a;
  }

  #program(names: readonly string[], mixed: boolean): Promise<Program> {
    const key = `${mixed ? 'bank' : this.#form}|${names.join('|')}`;
    let p = this.#programs.get(key);
    if (p === undefined) {
      p = this.#compile(names, mixed);
      this.#programs.set(key, p);
      p.catch(() => this.#programs.delete(key));
    }
    return p;
  }

  async #compile(names: readonly string[], mixed: boolean): Promise<Program> {
    const adapters = names.map((n) => this.#adapter(n));
    let linear: LinearFactory;
    const values = new Map(this.#weights);
    if (mixed) {
      const withOverrides = adapters.find((a) => a.overrides.size > 0);
      if (withOverrides !== undefined) {
        throw new ModelError(ModelCode.BAD_ADAPTER, `adapter '${withOverrides.name}' replaces whole tensors (${[...withOverrides.overrides.keys()].slice(0, 3).join(', ')}), which cannot vary by row in a mixed batch`);
      }
      const withExperts = adapters.find((a) => (this.#expertLora.get(a.name)?.size ?? 0) > 0);
      if (withExperts !== undefined) {
        throw new ModelError(ModelCode.BAD_ADAPTER, `adapter '${withExperts.name}' adapts MoE experts, which mixed batches do not support yet; run its rows in their own batch`);
      }
      linear = bankLinear(adapters);
    } else {
      // Residual LoRA layers as `loraLinear` ops, which executors lower from their tables; with
      // quantized weights the chain stays primitive, so that its base linear is quantized.
      linear = singleAdapterLinear(adapters[0], this.#form, { residualAsOp: this.#quantize === undefined });
      for (const [k, t] of adapters[0]?.overrides ?? []) values.set(k, t);
    }
    for (const a of adapters) {
      for (const m of a.modules.values()) {
        values.set(adapterParamName(a.name, m.module, 'lora_A'), m.A);
        values.set(adapterParamName(a.name, m.module, 'lora_B'), m.B);
        if (m.biasB !== undefined) values.set(adapterParamName(a.name, m.module, 'lora_B_bias'), m.biasB);
      }
    }
    const single = mixed ? undefined : adapters[0];
    const expertLora = single === undefined ? undefined : this.#expertLora.get(single.name);
    for (const [layer, list] of expertLora ?? []) {
      for (const x of list) {
        values.set(expertParamName(single!.name, layer, x.projection, 'lora_A'), x.A);
        values.set(expertParamName(single!.name, layer, x.projection, 'lora_B'), x.B);
      }
    }
    const graph = buildLlamaGraph(this.config, {
      name: this.config.modelType,
      kvCache: true,
      attentionMask: true,
      ...(this.config.slidingWindow === undefined ? {} : { perQueryMask: true }),
      linear,
      ...(expertLora === undefined || expertLora.size === 0 ? {} : { experts: loraExperts(single!.name, expertLora) }),
      ...this.#graphOptions,
    });
    const result = specialize(graph, {
      lattice: SERVING_STAGES,
      annotations: { params: names.length === 0 ? {} : { 'adapter.*': 'adapter' } },
      cutoff: 'adapter',
      values: { get: (n) => values.get(n) },
    });
    const staged = this.#quantize === undefined ? { graph: result.residual, constants: result.constants } : quantizeLinears(result.residual, result.constants, this.#quantize);
    const prepared = await this.#executor.prepare(staged.graph, staged.constants);
    return { prepared, residual: staged.graph, inputs: new Set(graphInputs(staged.graph).map((n) => n.name)) };
  }

  /** An empty cache for `rows` sequences. */
  emptyCache(rows: number): KvCache {
    const tensors: Record<string, HostTensor> = {};
    for (let l = 0; l < this.config.numLayers; l++) {
      tensors[`present_key.${String(l)}`] = zeros('f32', [rows, this.config.numKvHeads, 0, this.config.headDim]);
      tensors[`present_value.${String(l)}`] = zeros('f32', [rows, this.config.numKvHeads, 0, this.config.headDim]);
    }
    return { past: 0, tensors, mask: Array.from({ length: rows }, () => []), nextPosition: new Array<number>(rows).fill(0) };
  }

  /**
   * Runs `ids` (rows of equal length) through the model after `cache` (default: empty), each row
   * with its own adapter (or the base model). Returns logits [rows, tokens, vocab] and the grown
   * cache. Unknown token ids are `MODEL_BAD_TOKEN`; unknown adapters `MODEL_BAD_ADAPTER`.
   */
  async forward(
    ids: readonly (readonly number[])[],
    opts: { readonly adapters?: RowAdapters; readonly cache?: KvCache; readonly mask?: readonly (readonly number[])[] } = {},
  ): Promise<ForwardResult> {
    const rows = ids.length;
    const len = ids[0]?.length ?? 0;
    if (rows === 0 || len === 0) throw new ModelError(ModelCode.BAD_OPTIONS, 'forward needs at least one row of at least one token');
    const flat: number[] = [];
    ids.forEach((row, r) => {
      if (row.length !== len) throw new ModelError(ModelCode.BAD_OPTIONS, `row ${String(r)} has ${String(row.length)} tokens, row 0 has ${String(len)}: rows must have equal length`);
      row.forEach((t, i) => {
        if (!Number.isInteger(t) || t < 0 || t >= this.config.vocabSize) {
          throw new ModelError(ModelCode.BAD_TOKEN, `token id ${String(t)} at row ${String(r)}, position ${String(i)} is outside the vocabulary [0, ${String(this.config.vocabSize)})`);
        }
        flat.push(t);
      });
    });
    const perRow = (opts.adapters ?? []).map((a) => (a === null || a === undefined || a === BASE ? undefined : a));
    if (opts.adapters !== undefined && opts.adapters.length !== rows) {
      throw new ModelError(ModelCode.BAD_OPTIONS, `${String(opts.adapters.length)} adapters given for ${String(rows)} rows`);
    }
    const used = [...new Set(perRow.filter((a): a is string => a !== undefined))].sort();
    for (const n of used) this.#adapter(n);
    const mixed = used.length > 1 || (used.length === 1 && perRow.some((a) => a === undefined) && opts.adapters !== undefined);
    const program = await this.#program(used, mixed);
    const cache = opts.cache ?? this.emptyCache(rows);
    if (cache.mask.length !== rows) throw new ModelError(ModelCode.BAD_OPTIONS, `the cache holds ${String(cache.mask.length)} rows, the call has ${String(rows)}`);
    const past = cache.past;
    // Rotary positions follow HF: attended tokens count up from the row's next position; masked
    // (padding) tokens sit at position 1 and are ignored as keys.
    const maskRows = ids.map((row, r) => {
      const m = opts.mask?.[r] ?? row.map(() => 1);
      if (m.length !== len || m.some((v) => v !== 0 && v !== 1)) throw new ModelError(ModelCode.BAD_OPTIONS, `mask row ${String(r)} must be ${String(len)} values of 0 or 1`);
      return m;
    });
    const nextPosition = [...cache.nextPosition];
    const positions = maskRows.flatMap((m, r) => m.map((v) => (v === 1 ? nextPosition[r]!++ : 1)));
    const fullMask = maskRows.map((m, r) => [...cache.mask[r]!, ...m]);
    const inputs: Record<string, HostTensor> = {
      input_ids: hostTensor('i64', [rows, len], flat),
      position_ids: hostTensor('i64', [rows, len], positions),
      attention_mask: this.config.slidingWindow === undefined
        ? hostTensor('f32', [rows, past + len], fullMask.flatMap((m) => m.map((v) => (v === 1 ? 0 : MASKED))))
        : slidingWindowMask(fullMask, past, len, this.config.slidingWindow),
    };
    for (let l = 0; l < this.config.numLayers; l++) {
      inputs[`past_key.${String(l)}`] = cache.tensors[`present_key.${String(l)}`]!;
      inputs[`past_value.${String(l)}`] = cache.tensors[`present_value.${String(l)}`]!;
    }
    if (mixed) {
      for (const n of used) {
        if (!program.inputs.has(rowsInputName(n))) continue;
        const rowIdx = perRow.flatMap((a, i) => (a === n ? [i] : []));
        inputs[rowsInputName(n)] = hostTensor('i64', [rowIdx.length], rowIdx);
      }
    }
    let out: Record<string, HostTensor>;
    try {
      out = await program.prepared.run(inputs);
    } catch (e) {
      if (e instanceof StageError) throw e;
      throw new ModelError(ModelCode.BAD_OPTIONS, `running the model failed: ${errorMessage(e)}`, { cause: e });
    }
    const tensors: Record<string, HostTensor> = {};
    for (let l = 0; l < this.config.numLayers; l++) {
      tensors[`present_key.${String(l)}`] = out[`present_key.${String(l)}`]!;
      tensors[`present_value.${String(l)}`] = out[`present_value.${String(l)}`]!;
    }
    return { logits: out['logits']!, cache: { past: past + len, tensors, mask: fullMask, nextPosition } };
  }
}
