import { type HostTensor, StageError } from '@stageml/ir';
import { type LlamaConfig, ModelCode, ModelError } from '@stageml/models';
import { AdapterCache, type LoraAdapter, PeftCode, checkAdapterAgainstBase, loadLoraAdapter } from '@stageml/peft';
import { type SlotOut, laneTokenWeights, loadSlotOuts, mergedModule } from './adapter-kinds.js';
import { type EngineDType, castTensor, tensorBytes } from './dtype.js';
import { EngineCode, EngineError } from './errors.js';
import { expertSlotFactors, routerAsModules } from './experts.js';
import { mergedWeight, withoutModules } from './plan.js';
import type { PlanState } from './plan-state.js';
import type { Lane } from './runner.js';
import type { Sequence, SlotEntry } from './sequence.js';
import type { ExpertSlotFactors, SlotSource, SlotTables } from './slots.js';

/** The adapter name reserved for the base model. */
export const BASE = '__base__';

/** An adapter with its factors' shapes only (what planning needs), so planning keeps no factor data. */
function shapeOnly(a: LoraAdapter): LoraAdapter {
  const empty = new Float32Array(0);
  return { ...a, modules: new Map([...a.modules].map(([k, m]) => [k, { ...m, A: { ...m.A, data: empty }, B: { ...m.B, data: empty } }])), overrides: new Map(), parameterFactors: [], tokenRows: [] };
}

/** What `AdapterSlots` is built from (of `EngineParts`). */
export interface AdapterSlotParts {
  readonly tables: SlotTables;
  readonly shapes: ReadonlyMap<string, readonly number[]>;
  readonly weightInputs: Readonly<Record<string, HostTensor>>;
  readonly dtype: EngineDType;
  readonly hostWeights: boolean;
  readonly allWeightInputs: boolean;
  readonly maxCpuLoras: number;
}

/**
 * The engine's adapters: which are loaded (by name, from which directory), their validation
 * against the model and the slot shape, the host cache of parsed adapters (`maxCpuLoras`) and the
 * slot cache over the slot tables (LRU among idle, unpinned adapters; single-flight loads), the
 * per-slot output rows (LoRA bias, DoRA scale), the lanes of adapters that cannot vary by row,
 * and applying a plan's merges to slots and lanes.
 */
export class AdapterSlots {
  readonly #tables: SlotTables;
  readonly #shapes: ReadonlyMap<string, readonly number[]>;
  readonly #weightInputs: Readonly<Record<string, HostTensor>>;
  readonly #dtype: EngineDType;
  /** Whether the host holds the weights' values (false with `deviceWeights`: lanes cannot be built). */
  readonly #hostWeights: boolean;
  /** Whether every base weight is an input of the slot programs: lanes and merges need it. */
  readonly #allWeightInputs: boolean;
  readonly #registered = new Map<string, string>();
  readonly #fresh = new Map<string, LoraAdapter>();
  readonly #host: AdapterCache<LoraAdapter>;
  /** Bytes of each parsed adapter the host cache holds (`hostBytes`). */
  readonly #hostBytes = new Map<string, number>();
  readonly #slotCache: AdapterCache<SlotEntry>;
  readonly #entries = new Map<string, SlotEntry>();
  readonly #shapesOf = new Map<string, LoraAdapter>();
  readonly #expertCache = new WeakMap<LoraAdapter, ExpertSlotFactors[]>();
  /** Per loaded adapter, its modules' output-table rows (LoRA bias, DoRA scale), computed once at load. */
  readonly #outs = new Map<string, ReadonlyMap<string, SlotOut>>();
  /** The lanes of loaded adapters that have one, by name. */
  readonly lanes = new Map<string, Lane>();

  constructor(
    /** The model directory (DoRA's column norms read base weights from it). */
    readonly dir: string,
    readonly config: LlamaConfig,
    p: AdapterSlotParts,
    readonly plans: PlanState,
    /**
     * Readies the programs that read the output tables (`ProgramRunner.outTables`): awaited before
     * an adapter with DoRA scales or LoRA biases registers, so no step waits for it and a failed
     * preparation leaves the engine as it was.
     */
    readonly needOutTables: () => Promise<unknown> = () => Promise.resolve(),
  ) {
    this.#tables = p.tables;
    this.#shapes = p.shapes;
    this.#weightInputs = p.weightInputs;
    this.#dtype = p.dtype;
    this.#hostWeights = p.hostWeights;
    this.#allWeightInputs = p.allWeightInputs;
    this.#host = new AdapterCache<LoraAdapter>({
      budgetBytes: p.maxCpuLoras,
      load: async (name) => {
        const fresh = this.#fresh.get(name);
        if (fresh !== undefined) {
          this.#hostBytes.set(name, fresh.bytes);
          return { value: fresh, bytes: 1 };
        }
        const dir = this.#registered.get(name);
        if (dir === undefined) throw new EngineError(EngineCode.UNKNOWN_ADAPTER, `adapter '${name}' is not loaded`);
        const read = this.#validate(await loadLoraAdapter(dir, { name }));
        this.#hostBytes.set(name, read.bytes);
        return { value: read, bytes: 1 };
      },
      dispose: (name) => {
        this.#hostBytes.delete(name);
      },
    });
    const slotBytes = this.#tables.bytes / this.#tables.slots;
    this.#slotCache = new AdapterCache<SlotEntry>({
      budgetBytes: slotBytes * (this.#tables.slots - 1),
      load: async (name) => {
        const lease = await this.#host.acquire(name);
        lease.release();
        return { value: { adapter: lease.value, slot: undefined }, bytes: slotBytes };
      },
      dispose: (name, entry) => {
        if (entry.slot !== undefined) this.#tables.free(entry.slot);
        entry.slot = undefined;
        if (this.#entries.get(name) === entry) this.#entries.delete(name);
      },
    });
  }

  /** Names of loaded adapters (resident in a slot or not). */
  get names(): string[] {
    return [...this.#registered.keys()];
  }

  /** Whether adapter `name` is loaded. */
  has(name: string): boolean {
    return this.#registered.has(name);
  }

  /** Adapters resident in a slot now. */
  get resident(): number {
    return this.#slotCache.stats().entries;
  }

  /** The lane `seq`'s rows run in, or undefined for a plain slot or base row. */
  laneOf(seq: Sequence): Lane | undefined {
    return seq.adapter === undefined ? undefined : this.lanes.get(seq.adapter);
  }

  /** Whether `seq` runs in a lane of its own (its adapter cannot vary by row). */
  isLaned(seq: Sequence): boolean {
    return seq.adapter !== undefined && this.lanes.has(seq.adapter);
  }

  /** Bytes of the parsed adapters the host cache holds (`EngineMemory.hostAdapters`). */
  get hostBytes(): number {
    let n = 0;
    for (const b of this.#hostBytes.values()) n += b;
    return n;
  }

  /** Bytes of every lane's substituted tensors. */
  get laneBytes(): number {
    let lanes = 0;
    for (const l of this.lanes.values()) lanes += l.bytes;
    return lanes;
  }

  /** A base parameter's shape (`lm_head.weight` of a tied model: the embeddings'). */
  #baseShapeOf(p: string): readonly number[] | undefined {
    return this.#shapes.get(p) ?? (p === 'lm_head.weight' && this.config.tieWordEmbeddings ? this.#shapes.get('model.embed_tokens.weight') : undefined);
  }

  /** Elements of the model's largest parameter: no adapter tensor may hold more. */
  #largestParam(): number {
    let most = 0;
    for (const s of this.#shapes.values()) most = Math.max(most, s.reduce((a, d) => a * d, 1));
    return most;
  }

  #validate(loaded: LoraAdapter): LoraAdapter {
    // Router factors (target_parameters on `mlp.gate.weight`) are a linear's LoRA: served as a module.
    const adapter = routerAsModules(loaded, this.config);
    const refuse = (why: string): never => {
      throw new EngineError(EngineCode.BAD_ADAPTER, `adapter '${adapter.name}' ${why}`);
    };
    const lanes = this.#allWeightInputs;
    if (adapter.tokenRows.length > 0) {
      const what = `replaces embedding rows (trainable_token_indices)`;
      if (!this.#hostWeights) refuse(`${what}, which needs the base weights on the host; this engine keeps them on the executor's device (deviceWeights)`);
      if (!lanes) refuse(`${what}, which an engine with weights: 'program' cannot give a lane of its own`);
      const [V, H] = this.#shapes.get('model.embed_tokens.weight')!;
      for (const t of adapter.tokenRows) {
        if (t.module !== 'model.embed_tokens') refuse(`replaces rows of '${t.module}'; only the input embedding 'model.embed_tokens' takes trainable tokens here`);
        const bad = t.indices.find((i) => i >= V!);
        if (bad !== undefined) refuse(`replaces the row of token ${String(bad)}, beyond the vocabulary (${String(V)})`);
        if (t.rows.shape[1] !== H) refuse(`replaces embedding rows of width ${String(t.rows.shape[1])}; the model's is ${String(H)}`);
      }
    }
    if (adapter.overrides.size > 0) {
      if (!this.#hostWeights) refuse(`replaces whole tensors (${[...adapter.overrides.keys()].slice(0, 3).join(', ')}), which needs the base weights on the host; this engine keeps them on the executor's device (deviceWeights)`);
      if (!lanes) refuse(`replaces whole tensors (${[...adapter.overrides.keys()].slice(0, 3).join(', ')}), which cannot vary by row; an engine with weights: 'program' cannot give it a lane of its own`);
      for (const [k, t] of adapter.overrides) {
        const want = this.#shapes.get(k);
        if (want === undefined) refuse(`replaces '${k}', which is not a tensor of this model${k === 'lm_head.weight' && this.config.tieWordEmbeddings ? ' (lm_head is tied to the embeddings here)' : ''}`);
        if (want!.join(',') !== t.shape.join(',')) refuse(`replaces '${k}' with shape [${t.shape.join(', ')}]; the model's is [${want!.join(', ')}]`);
      }
    }
    this.#expertFactors(adapter);
    checkAdapterAgainstBase(adapter, (p) => this.#baseShapeOf(p));
    for (const m of adapter.modules.values()) {
      if (!this.#tables.has(m.module)) refuse(`adapts '${m.module}', which is not a projection the engine serves`);
      if (m.rank > this.#tables.rank) refuse(`has rank ${String(m.rank)} on '${m.module}', above the slot rank ${String(this.#tables.rank)} (raise --max-lora-rank)`);
      if ((m.biasB !== undefined || m.magnitude !== undefined) && this.#tables.expertsOf(m.module) !== undefined) refuse(`has a LoRA bias or DoRA magnitude on the expert projection '${m.module}'`);
    }
    return adapter;
  }

  /** `Engine.loadAdapter`: reads, validates, registers and warms a slot for the adapter in `dir`; `registered` is called as it is registered (before any await after). */
  async load(dir: string, name?: string, registered?: (adapter: LoraAdapter) => void): Promise<LoraAdapter> {
    // Every tensor's header is checked against the model before its data is read or allocated.
    const adapter = this.#validate(await loadLoraAdapter(dir, { ...(name === undefined ? {} : { name }), shapeOf: (p) => this.#baseShapeOf(p), maxElements: this.#largestParam(), kinds: { dora: true, trainableTokens: true } }));
    // DoRA's column norms and the scaled LoRA biases: computed once here, written with the slot.
    const outs = await loadSlotOuts(this.dir, adapter, (p) => this.#shapes.get(p));
    if (adapter.name === BASE) throw new ModelError(ModelCode.BAD_ADAPTER, `'${BASE}' is reserved for the base model`);
    // A fixed plan must fit the adapter (every merged unit one of its modules) before anything changes.
    this.plans.checkFits(shapeOnly(adapter));
    if (outs.size > 0) await this.needOutTables();
    if (this.#registered.has(adapter.name)) this.unload(adapter.name);
    const lane = this.#laneFor(adapter, undefined);
    if (lane !== undefined) this.lanes.set(adapter.name, lane);
    this.#outs.set(adapter.name, outs);
    this.#registered.set(adapter.name, dir);
    registered?.(adapter);
    this.#shapesOf.set(adapter.name, shapeOnly(adapter));
    this.plans.adaptersChanged();
    this.#fresh.set(adapter.name, adapter);
    try {
      (await this.#host.acquire(adapter.name)).release();
    } finally {
      this.#fresh.delete(adapter.name);
    }
    try {
      const lease = await this.#slotCache.acquire(adapter.name);
      // Device tables: the rows of the last slot write leave the host (they landed) before this
      // slot's are built. A burst of loads holds one adapter's rows in flight while the next
      // adapter is read, not one adapter's rows per slot queued on the worker's pipe.
      try {
        await this.#tables.landed();
        this.#assign(lease.value);
      } finally {
        lease.release();
      }
    } catch (e) {
      // Every slot is in use by running sequences: the adapter stays loaded and takes a slot later.
      if (!(e instanceof StageError && e.code === PeftCode.CACHE_FULL)) throw e;
    }
    return adapter;
  }

  /** `Engine.unloadAdapter`: frees (zeroes) the adapter's slot, its host copy and its lane. */
  unload(name: string): boolean {
    if (!this.#registered.has(name)) return false;
    this.#slotCache.evict(name);
    this.#host.evict(name);
    this.#registered.delete(name);
    this.#shapesOf.delete(name);
    this.plans.adaptersChanged();
    this.lanes.delete(name);
    this.#outs.delete(name);
    return true;
  }

  /**
   * Gives `seq` its adapter's slot (`Engine.attach`): false when every slot is held by other
   * running adapters, or when `seq` was released while it waited.
   */
  async attach(seq: Sequence, signal?: AbortSignal): Promise<boolean> {
    if (seq.slot !== undefined) return true;
    if (seq.adapter === undefined) {
      seq.slot = 0;
      return true;
    }
    try {
      const lease = await this.#slotCache.acquire(seq.adapter, signal === undefined ? {} : { signal });
      await this.#tables.landed();
      if (seq.released) {
        lease.release();
        return false;
      }
      seq.lease = lease;
      seq.slot = this.#assign(lease.value);
      return true;
    } catch (e) {
      if (e instanceof StageError && e.code === PeftCode.CACHE_FULL) return false;
      throw e;
    }
  }

  /**
   * The lane of an adapter that cannot vary by row, or undefined for a plain slot adapter: the
   * slot programs with its overrides (and the plan's merged copies) substituted among the weight
   * inputs — no preparation.
   */
  #laneFor(adapter: LoraAdapter, merged: ReadonlySet<string> | undefined): Lane | undefined {
    if (adapter.overrides.size === 0 && adapter.tokenRows.length === 0 && (merged === undefined || merged.size === 0)) return undefined;
    const weights: Record<string, HostTensor> = { ...this.#weightInputs };
    let bytes = 0;
    // Trainable tokens: the embedding with the adapter's rows (a tied head reads the same rows).
    for (const [k, t] of laneTokenWeights(adapter, weights)) {
      const held = castTensor(t, this.#dtype);
      weights[k] = held;
      bytes += tensorBytes(held);
    }
    for (const [k, t] of adapter.overrides) {
      const held = castTensor(t, this.#dtype);
      weights[k] = held;
      bytes += tensorBytes(held);
    }
    for (const module of merged ?? []) {
      const m = adapter.modules.get(module);
      const w = weights[`${module}.weight`];
      if (m === undefined || w === undefined) continue;
      // DoRA merges its column scale into the weight; a LoRA bias stays in the slot (`#outsOf`).
      const held = castTensor(m.magnitude === undefined ? mergedWeight(w, m) : mergedModule(w, m), this.#dtype);
      weights[`${module}.weight`] = held;
      bytes += tensorBytes(held);
    }
    return { weights, bytes };
  }

  /** An adapter's MoE expert factors per expert-projection table (`ENGINE_BAD_ADAPTER` when they do not fit). */
  #expertFactors(adapter: LoraAdapter): ExpertSlotFactors[] {
    // Unpacked once per parsed adapter: validation at load and the slot write share it.
    let f = this.#expertCache.get(adapter);
    if (f === undefined) this.#expertCache.set(adapter, (f = expertSlotFactors(adapter, this.config, this.#tables.rank)));
    return f;
  }

  /** Where a slot's factors come from again (device tables on a new worker): the adapter reloaded through the host cache (its directory). */
  #slotSource(name: string): SlotSource {
    return async () => {
      const lease = await this.#host.acquire(name);
      lease.release();
      const adapter = withoutModules(lease.value, this.plans.merged(name));
      return { adapter, experts: this.#expertFactors(lease.value), outs: this.#outsOf(adapter) };
    };
  }

  /**
   * The output-table rows `adapter`'s slot holds: every row of its modules in the slot; of a plan's
   * merged modules (not in `adapter`), only the LoRA bias — their weights merged the rest.
   */
  #outsOf(adapter: LoraAdapter): ReadonlyMap<string, SlotOut> | undefined {
    const all = this.#outs.get(adapter.name);
    if (all === undefined || all.size === 0) return undefined;
    const out = new Map<string, SlotOut>();
    for (const [k, o] of all) {
      if (adapter.modules.has(k)) out.set(k, o);
      else if (o.bias !== undefined) out.set(k, { bias: o.bias });
    }
    return out;
  }

  /**
   * Host tables: drops the host cache's parsed copy of an adapter just written into its slot. The
   * slot holds its factors on the host already; a second copy per slot would double the factors'
   * memory (every adapter twice at the default `maxCpuLoras`). A re-plan or a return to a slot
   * after eviction reads the adapter's directory again. Device tables keep the cache as it is
   * (one adapter by default: the host's only copy, for a new worker's restore).
   */
  #dropHostCopy(name: string): void {
    if (this.#tables.onDevice) return;
    try {
      this.#host.evict(name);
    } catch (e) {
      // Leased right now (a concurrent read of the same adapter): the cache's LRU drops it later.
      if (!(e instanceof StageError && e.code === PeftCode.IN_USE)) throw e;
    }
  }

  #assign(entry: SlotEntry): number {
    if (entry.slot === undefined) {
      const adapter = withoutModules(entry.adapter, this.plans.merged(entry.adapter.name));
      entry.slot = this.#tables.write(adapter, this.#expertFactors(entry.adapter), this.#tables.onDevice ? this.#slotSource(entry.adapter.name) : undefined, this.#outsOf(adapter));
      entry.adapter = shapeOnly(entry.adapter);
      this.#dropHostCopy(entry.adapter.name);
    }
    this.#entries.set(entry.adapter.name, entry);
    return entry.slot;
  }

  /**
   * Re-plans (when due after `runs` runs) and applies the result between steps: adapters whose
   * merged set changed get a new lane (merged copies) and their slot rewritten without the merged
   * modules. Runs never see a half-applied plan: the scheduler does not start a run until this
   * resolves.
   */
  async applyPlan(runs: number, executorName: string): Promise<void> {
    const next = this.plans.due(runs, [...this.#shapesOf.values()], this.config, executorName);
    if (next === undefined) return;
    const same = (a: ReadonlySet<string> | undefined, b: ReadonlySet<string> | undefined): boolean => (a?.size ?? 0) === (b?.size ?? 0) && [...(a ?? [])].every((x) => b?.has(x) === true);
    const changed = [...this.#registered.keys()].filter((n) => !same(this.plans.merged(n), next.merged.get(n)));
    const adapters = new Map<string, LoraAdapter>();
    for (const name of changed) {
      // Resident entries keep shapes only: the factors come from the host cache (or the disk).
      const lease = await this.#host.acquire(name);
      adapters.set(name, lease.value);
      lease.release();
    }
    const lanes = new Map<string, Lane | undefined>();
    for (const name of changed) lanes.set(name, this.#laneFor(adapters.get(name)!, next.merged.get(name)));
    // Everything is computed: apply synchronously, between two runs.
    this.plans.commit(next);
    for (const name of changed) {
      const lane = lanes.get(name);
      if (lane === undefined) this.lanes.delete(name);
      else this.lanes.set(name, lane);
      const entry = this.#entries.get(name);
      if (entry?.slot !== undefined) {
        const adapter = withoutModules(adapters.get(name)!, next.merged.get(name));
        this.#tables.rewrite(entry.slot, adapter, this.#expertFactors(adapters.get(name)!), undefined, this.#outsOf(adapter));
        this.#dropHostCopy(name);
      }
    }
  }
}
