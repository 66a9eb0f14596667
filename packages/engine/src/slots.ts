import { type DType, type HostTensor, dtypeBytes, isFloatDType, roundFloat32InPlace } from '@stageml/ir';
import type { LoraAdapter } from '@stageml/peft';
import { type DeviceWrite, type TorchDeviceTensors, inputChanged } from '@stageml/runtime';
import { EngineCode, EngineError } from './errors.js';
import type { SlotOut } from './adapter-kinds.js';
import { type SlotModule, slotInputNames } from './slot-linear.js';
import { hasZeroRow, zeroRowsLast } from './zero-tail.js';
import { quantizeFactorRows } from './factor-quant.js';

interface Tables {
  readonly spec: SlotModule;
  /** Matrices per slot: 1, or E for an expert projection. */
  readonly per: number;
  /** The host tables (empty on a device: the data lives on the executor's device only); i8 codes with int8 factors. */
  readonly A: Float32Array | Int8Array;
  readonly B: Float32Array | Int8Array;
  /** With int8 factors, the per-rank-row scales of A and B [N, R] (empty otherwise). */
  readonly AS: Float32Array;
  readonly BS: Float32Array;
  /** Output tables [N, out] (projections, not expert tables): DoRA scale − 1 and the scaled LoRA bias (host; empty on a device). */
  readonly S: Float32Array;
  readonly C: Float32Array;
  readonly inputs: { readonly A: HostTensor; readonly B: HostTensor; readonly S?: HostTensor; readonly C?: HostTensor; readonly AScale?: HostTensor; readonly BScale?: HostTensor };
}

/** Whether a module's tables include the output tables S and C (every projection but MoE experts). */
const hasOut = (spec: SlotModule): boolean => spec.experts === undefined;

/** Where an occupied slot's factors come from again (a new worker's tables are rewritten from it). */
export type SlotSource = () => Promise<{ readonly adapter: LoraAdapter; readonly experts: readonly ExpertSlotFactors[]; readonly outs?: ReadonlyMap<string, SlotOut> | undefined }>;

/** One adapter's factors of a MoE expert projection, every expert: A [E, r, in], B [E, out, r]. */
export interface ExpertSlotFactors {
  /** The table's module, `<layer>.mlp.experts.gate_up_proj` or `….down_proj`. */
  readonly module: string;
  readonly A: HostTensor;
  readonly B: HostTensor;
  readonly rank: number;
  readonly scale: number;
}

const f32 = (d: HostTensor['data']): Float32Array => (d instanceof Float32Array ? d : Float32Array.from(d as ArrayLike<number>));

/**
 * The slot tables of one program: for every projection, A f32[N, R, in] and B f32[N, R, out]
 * (MoE expert projections: A f32[N·E, R, in] and B f32[N·E, out, R]), allocated once
 * (N·R·(in + out)·4 bytes per projection and expert of address space, whatever ranks are loaded;
 * only written rows become resident) and fed to every run as zero-copy inputs. Slot 0 stays zero
 * (base-only rows); slots 1…N−1 hold adapters.
 */
export class SlotTables {
  readonly #tables = new Map<string, Tables>();
  readonly #free: number[] = [];
  /** Per slot, the most rank rows ever written (what `#zero` must clear; the rest were never touched). */
  readonly #written: Int32Array;
  /** Per occupied slot, the bytes of the factors written (unpadded). */
  readonly #factorBytes = new Map<number, number>();
  /** The inputs of every run (the same objects each time: no copies). */
  readonly inputs: Readonly<Record<string, HostTensor>>;
  /**
   * The same without the output tables S and C: the inputs of a program built without them
   * (`slotLinear`'s `outTables: false`), which serves the slots `hasOuts` says hold none.
   */
  readonly factorInputs: Readonly<Record<string, HostTensor>>;
  /** Occupied slots whose output tables hold rows (DoRA column scales, LoRA biases). */
  readonly #outSlots = new Set<number>();
  /** Bytes the tables occupy. */
  readonly bytes: number;
  /** The executor's device tensors holding the tables (`onDevice`), or undefined for host tables. */
  readonly #device: TorchDeviceTensors | undefined;
  /** Per occupied slot (device tables), where its factors come from again. */
  readonly #sources = new Map<number, SlotSource>();
  /** Device writes sent and not yet known to have landed (`settled`). */
  #pending: Promise<void>[] = [];

  constructor(
    /** Slots N, including the base slot 0. */
    readonly slots: number,
    /** Rank R of every slot. */
    readonly rank: number,
    modules: readonly SlotModule[],
    /**
     * Dtype of the factors (default f32; bf16/f16 for an engine with `adapterDtype: 'same'`): the
     * tables are inputs of that dtype, in the IR's host storage (values rounded on write), and
     * count its bytes. `i8` (`adapterDtype: 'int8'`): A and B hold int8 codes with an f32 scale per
     * rank row (`factor-quant.ts`), 1 byte per element plus 8 per rank row; the output tables S and
     * C stay f32. Host tables of plain projections only (no device tables, no MoE expert tables).
     */
    readonly dtype: DType = 'f32',
    /** Device tables (`SlotTables.onDevice`): per module its A and B handles, in `modules`' order. */
    onDevice?: { readonly store: TorchDeviceTensors; readonly handles: readonly HostTensor[] },
  ) {
    const int8 = dtype === 'i8';
    if (int8 && onDevice !== undefined) throw new EngineError(EngineCode.BAD_OPTIONS, "int8 factors (adapterDtype 'int8', --adapter-dtype int8) live in host slot tables: the executor's device tables hold f32/bf16/f16 factors only");
    const expertModule = modules.find((m) => m.experts !== undefined);
    if (int8 && expertModule !== undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `int8 factors (adapterDtype 'int8', --adapter-dtype int8) cover plain projections; '${expertModule.module}' is a MoE expert table`);
    // The output tables (DoRA scales, LoRA biases) keep a float dtype: f32 beside int8 factors.
    const outDtype: DType = int8 ? 'f32' : dtype;
    const inputs: Record<string, HostTensor> = {};
    const factorInputs: Record<string, HostTensor> = {};
    let bytes = 0;
    this.#device = onDevice?.store;
    const none = new Float32Array(0);
    let h = 0;
    for (const spec of modules) {
      const per = spec.experts ?? 1;
      const out = hasOut(spec);
      const shapeA = [slots * per, rank, spec.inDim];
      const shapeB = spec.experts === undefined ? [slots, rank, spec.outDim] : [slots * per, spec.outDim, rank];
      const host = onDevice === undefined;
      const A = !host ? none : int8 ? new Int8Array(slots * per * rank * spec.inDim) : new Float32Array(slots * per * rank * spec.inDim);
      const B = !host ? none : int8 ? new Int8Array(slots * per * spec.outDim * rank) : new Float32Array(slots * per * spec.outDim * rank);
      const AS = int8 ? new Float32Array(slots * rank) : none;
      const BS = int8 ? new Float32Array(slots * rank) : none;
      const S = host && out ? new Float32Array(slots * spec.outDim) : none;
      const C = host && out ? new Float32Array(slots * spec.outDim) : none;
      const names = slotInputNames(spec.module);
      let tin: Tables['inputs'];
      if (host) {
        tin = {
          A: { dtype, shape: shapeA, data: A },
          B: { dtype, shape: shapeB, data: B },
          ...(out ? { S: { dtype: outDtype, shape: [slots, spec.outDim], data: S }, C: { dtype: outDtype, shape: [slots, spec.outDim], data: C } } : {}),
          ...(int8 ? { AScale: { dtype: 'f32', shape: [slots, rank], data: AS }, BScale: { dtype: 'f32', shape: [slots, rank], data: BS } } : {}),
        };
      } else {
        const hs = onDevice.handles;
        tin = out ? { A: hs[h]!, B: hs[h + 1]!, S: hs[h + 2]!, C: hs[h + 3]! } : { A: hs[h]!, B: hs[h + 1]! };
        h += out ? 4 : 2;
      }
      const t: Tables = { spec, per, A, B, AS, BS, S, C, inputs: tin };
      inputs[names.A] = factorInputs[names.A] = t.inputs.A;
      inputs[names.B] = factorInputs[names.B] = t.inputs.B;
      if (t.inputs.AScale !== undefined && t.inputs.BScale !== undefined) {
        inputs[names.AScale] = factorInputs[names.AScale] = t.inputs.AScale;
        inputs[names.BScale] = factorInputs[names.BScale] = t.inputs.BScale;
      }
      if (t.inputs.S !== undefined) inputs[names.S] = t.inputs.S;
      if (t.inputs.C !== undefined) inputs[names.C] = t.inputs.C;
      bytes += slots * per * rank * (spec.inDim + spec.outDim) * dtypeBytes(dtype) + (int8 ? 2 * slots * rank * 4 : 0) + (out ? 2 * slots * spec.outDim * dtypeBytes(outDtype) : 0);
      this.#tables.set(spec.module, t);
    }
    this.inputs = inputs;
    this.factorInputs = factorInputs;
    this.bytes = bytes;
    this.#written = new Int32Array(slots);
    for (let s = slots - 1; s >= 1; s--) this.#free.push(s);
    // A new worker (the last one died) gets every occupied slot's factors again, from their
    // sources, one slot a part: each slot's rows are built once the last one's landed, so the host
    // holds one adapter's rows at a time, not every slot's.
    const sources = this.#sources;
    const slotWrites = this.#slotWrites.bind(this);
    onDevice?.store.onRestore(async function* restore(): AsyncGenerator<DeviceWrite[]> {
      for (const [slot, source] of [...sources]) {
        const { adapter, experts, outs } = await source();
        yield slotWrites(slot, adapter, experts, outs);
      }
    });
  }

  /**
   * Slot tables that live on the executor's device only (the torch worker): made there as zeros,
   * written by one slot's element ranges (`TorchDeviceTensors.write`), never held on the host —
   * each write's rows are built, rounded, sent and dropped. Slot sources (`write`'s `source`)
   * rewrite them on a new worker.
   */
  static async onDevice(store: TorchDeviceTensors, slots: number, rank: number, modules: readonly SlotModule[], dtype: DType = 'f32'): Promise<SlotTables> {
    const entries = modules.flatMap((spec) => {
      const per = spec.experts ?? 1;
      return [
        { dtype, shape: [slots * per, rank, spec.inDim] },
        { dtype, shape: spec.experts === undefined ? [slots, rank, spec.outDim] : [slots * per, spec.outDim, rank] },
        ...(hasOut(spec) ? [{ dtype, shape: [slots, spec.outDim] }, { dtype, shape: [slots, spec.outDim] }] : []),
      ];
    });
    const handles = entries.length === 0 ? [] : await store.zeros(entries);
    return new SlotTables(slots, rank, modules, dtype, { store, handles });
  }

  /** Whether the tables live on the executor's device (`onDevice`). */
  get onDevice(): boolean {
    return this.#device !== undefined;
  }

  /**
   * Waits for the device writes sent so far; a failed one is `ENGINE_RUN_FAILED` (the tables may
   * be partly written). Host tables: nothing to wait for.
   */
  async settled(): Promise<void> {
    if (this.#pending.length === 0) return;
    const pending = this.#pending;
    this.#pending = [];
    const results = await Promise.allSettled(pending);
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed !== undefined) throw new EngineError(EngineCode.RUN_FAILED, `writing the slot tables on the executor's device failed: ${failed.reason instanceof Error ? failed.reason.message : String(failed.reason)}`, { cause: failed.reason });
  }

  /**
   * Waits until the device writes sent so far have landed or failed, without reporting a failure
   * (`settled` does): what a slot write awaits first, so the host's rows of the last one are dropped
   * before the next are built — a burst of loads holds one adapter's rows in flight, not one per
   * slot queued on the worker's pipe. Host tables: nothing to wait for.
   */
  async landed(): Promise<void> {
    if (this.#pending.length === 0) return;
    await Promise.allSettled(this.#pending);
  }

  /** One slot's factors as element ranges of the device tables (rounded to the tables' dtype, here or by the worker). */
  #slotWrites(slot: number, adapter: LoraAdapter, experts: readonly ExpertSlotFactors[], outs: ReadonlyMap<string, SlotOut> | undefined): DeviceWrite[] {
    const R = this.rank;
    const writes: DeviceWrite[] = [];
    for (const m of adapter.modules.values()) {
      const t = this.#tables.get(m.module)!;
      const { inDim, outDim } = t.spec;
      if (isFloatDType(this.dtype) && m.A.data instanceof Float32Array && m.B.data instanceof Float32Array && !hasZeroRow(m.A.data, m.rank, inDim, this.dtype)) {
        // The worker rounds A, and scales, transposes and rounds B, on its device, to the same
        // values as the host path below: the host makes no pass over them (with 64 adapters of a
        // 1B model, ~721 M values, those passes took most of the start-up's adapter loading).
        writes.push(
          { target: t.inputs.A, start: slot * R * inDim, data: m.A.data.subarray(0, m.rank * inDim), exact: false },
          { target: t.inputs.B, start: slot * R * outDim, data: m.B.data.subarray(0, outDim * m.rank), scale: m.scale, transpose: [outDim, m.rank] },
        );
        continue;
      }
      const a = f32(m.A.data).slice(0, m.rank * inDim);
      const b = new Float32Array(m.rank * outDim);
      const bsrc = m.B.data;
      for (let j = 0; j < m.rank; j++) {
        for (let o = 0; o < outDim; o++) b[j * outDim + o] = m.scale * bsrc[o * m.rank + j]!;
      }
      this.#round(a, 0, a.length);
      this.#round(b, 0, b.length);
      zeroRowsLast(a, 0, b, 0, m.rank, inDim, outDim);
      writes.push({ target: t.inputs.A, start: slot * R * inDim, data: a }, { target: t.inputs.B, start: slot * R * outDim, data: b });
    }
    for (const [module, o] of outs ?? []) {
      const t = this.#tables.get(module)!;
      for (const [which, v] of [['S', o.scale], ['C', o.bias]] as const) {
        if (v === undefined) continue;
        const d = Float32Array.from(v);
        this.#round(d, 0, d.length);
        writes.push({ target: t.inputs[which]!, start: slot * t.spec.outDim, data: d });
      }
    }
    for (const x of experts) {
      const t = this.#tables.get(x.module)!;
      const { inDim, outDim } = t.spec;
      const E = t.per;
      const r = x.rank;
      const src = f32(x.A.data);
      const bsrc = x.B.data;
      const a = new Float32Array(E * R * inDim);
      const b = new Float32Array(E * outDim * R);
      for (let e = 0; e < E; e++) {
        a.set(src.subarray(e * r * inDim, (e + 1) * r * inDim), e * R * inDim);
        for (let o = 0; o < outDim; o++) {
          for (let j = 0; j < r; j++) b[(e * outDim + o) * R + j] = x.scale * bsrc[(e * outDim + o) * r + j]!;
        }
      }
      this.#round(a, 0, a.length);
      this.#round(b, 0, b.length);
      writes.push({ target: t.inputs.A, start: slot * E * R * inDim, data: a }, { target: t.inputs.B, start: slot * E * outDim * R, data: b });
    }
    return writes;
  }

  #send(writes: readonly DeviceWrite[]): void {
    if (writes.length === 0) return;
    const p = this.#device!.write(writes);
    // Observed here so an unawaited failure is not unhandled; `settled` reports it.
    p.catch(() => undefined);
    this.#pending.push(p);
  }

  /** Whether any of `slots` holds output-table rows (an adapter with DoRA or a LoRA bias). */
  hasOuts(slots: Iterable<number>): boolean {
    if (this.#outSlots.size === 0) return false;
    for (const s of slots) if (this.#outSlots.has(s)) return true;
    return false;
  }

  /** Whether `module` has slot tables. */
  has(module: string): boolean {
    return this.#tables.has(module);
  }

  /** Experts E of an expert projection's tables (undefined: a plain projection or none). */
  expertsOf(module: string): number | undefined {
    return this.#tables.get(module)?.spec.experts;
  }

  /** Slots not holding an adapter. */
  get freeSlots(): number {
    return this.#free.length;
  }

  /**
   * Takes a free slot and writes `adapter`'s factors (and its expert factors) into it (scale folded
   * into B). Device tables need `source`, what gives the same factors again (for a new worker).
   */
  write(adapter: LoraAdapter, experts: readonly ExpertSlotFactors[] = [], source?: SlotSource, outs?: ReadonlyMap<string, SlotOut>): number {
    if (this.#device !== undefined && source === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `device slot tables need a source to rewrite '${adapter.name}' from`);
    const slot = this.#free.pop();
    if (slot === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `no free slot for '${adapter.name}' (all ${String(this.slots - 1)} adapter slots hold adapters)`);
    const R = this.rank;
    let bytes = 0;
    if (this.#device !== undefined) {
      this.#send(this.#slotWrites(slot, adapter, experts, outs));
      this.#sources.set(slot, source!);
      for (const m of adapter.modules.values()) {
        const { inDim, outDim } = this.#tables.get(m.module)!.spec;
        this.#written[slot] = Math.max(this.#written[slot]!, m.rank);
        bytes += m.rank * (inDim + outDim) * dtypeBytes(this.dtype);
      }
      for (const [module, o] of outs ?? []) {
        const n = this.#tables.get(module)!.spec.outDim;
        this.#written[slot] = Math.max(this.#written[slot]!, 1);
        this.#outSlots.add(slot);
        bytes += ((o.scale === undefined ? 0 : n) + (o.bias === undefined ? 0 : n)) * dtypeBytes(this.dtype);
      }
      for (const x of experts) {
        const t = this.#tables.get(x.module)!;
        this.#written[slot] = Math.max(this.#written[slot]!, x.rank);
        bytes += t.per * x.rank * (t.spec.inDim + t.spec.outDim) * dtypeBytes(this.dtype);
      }
      this.#factorBytes.set(slot, bytes);
      return slot;
    }
    for (const m of adapter.modules.values()) {
      const t = this.#tables.get(m.module)!;
      const { inDim, outDim } = t.spec;
      const bsrc = m.B.data;
      if (t.A instanceof Int8Array && t.B instanceof Int8Array) {
        // int8: the scaled rows built in f32, zero rows moved last, then quantized row by row.
        const a = f32(m.A.data).slice(0, m.rank * inDim);
        const b = new Float32Array(m.rank * outDim);
        for (let j = 0; j < m.rank; j++) for (let o = 0; o < outDim; o++) b[j * outDim + o] = m.scale * bsrc[o * m.rank + j]!;
        zeroRowsLast(a, 0, b, 0, m.rank, inDim, outDim);
        quantizeFactorRows(a, m.rank, inDim, t.A, slot * R * inDim, t.AS, slot * R);
        quantizeFactorRows(b, m.rank, outDim, t.B, slot * R * outDim, t.BS, slot * R);
        this.#written[slot] = Math.max(this.#written[slot]!, m.rank);
        bytes += m.rank * (inDim + outDim) + 2 * m.rank * 4;
        this.#changed(t);
        continue;
      }
      t.A.set(f32(m.A.data), slot * R * inDim);
      const base = slot * R * outDim;
      for (let j = 0; j < m.rank; j++) {
        const row = base + j * outDim;
        for (let o = 0; o < outDim; o++) t.B[row + o] = m.scale * bsrc[o * m.rank + j]!;
      }
      const fa = t.A as Float32Array;
      const fb = t.B as Float32Array;
      this.#round(fa, slot * R * inDim, (slot * R + m.rank) * inDim);
      this.#round(fb, base, base + m.rank * outDim);
      // The gathered form's `zeroTail` promise: all-zero A rows last.
      zeroRowsLast(fa, slot * R * inDim, fb, base, m.rank, inDim, outDim);
      this.#written[slot] = Math.max(this.#written[slot]!, m.rank);
      bytes += m.rank * (inDim + outDim) * dtypeBytes(this.dtype);
      this.#changed(t);
    }
    for (const [module, o] of outs ?? []) {
      const t = this.#tables.get(module)!;
      const n = t.spec.outDim;
      if (o.scale !== undefined) {
        t.S.set(o.scale, slot * n);
        this.#round(t.S, slot * n, (slot + 1) * n);
      }
      if (o.bias !== undefined) {
        t.C.set(o.bias, slot * n);
        this.#round(t.C, slot * n, (slot + 1) * n);
      }
      bytes += ((o.scale === undefined ? 0 : n) + (o.bias === undefined ? 0 : n)) * dtypeBytes(t.inputs.S!.dtype);
      // A slot with output rows counts as written, so that zeroing it clears them.
      this.#written[slot] = Math.max(this.#written[slot]!, 1);
      this.#outSlots.add(slot);
      this.#changed(t);
    }
    for (const x of experts) {
      const t = this.#tables.get(x.module)!;
      const { inDim, outDim } = t.spec;
      const E = t.per;
      const r = x.rank;
      const a = f32(x.A.data);
      const bsrc = x.B.data;
      for (let e = 0; e < E; e++) {
        const g = slot * E + e;
        t.A.set(a.subarray(e * r * inDim, (e + 1) * r * inDim), g * R * inDim);
        for (let o = 0; o < outDim; o++) {
          const dst = (g * outDim + o) * R;
          const src = (e * outDim + o) * r;
          for (let j = 0; j < r; j++) t.B[dst + j] = x.scale * bsrc[src + j]!;
        }
      }
      // NOTE: expert tables are never int8 (the constructor refuses them).
      this.#round(t.A as Float32Array, slot * E * R * inDim, (slot + 1) * E * R * inDim);
      this.#round(t.B as Float32Array, slot * E * outDim * R, (slot + 1) * E * outDim * R);
      this.#written[slot] = Math.max(this.#written[slot]!, r);
      bytes += E * r * (inDim + outDim) * dtypeBytes(this.dtype);
      this.#changed(t);
    }
    this.#factorBytes.set(slot, bytes);
    return slot;
  }

  /**
   * Whether the base slot and every free slot hold only zeros (what `free` guarantees). Device
   * tables: whether every such slot's written rows were zeroed (the device is not read back).
   */
  freeSlotsAreZero(): boolean {
    if (this.#device !== undefined) return [0, ...this.#free].every((slot) => this.#written[slot] === 0 && !this.#sources.has(slot));
    const R = this.rank;
    for (const slot of [0, ...this.#free]) {
      for (const t of this.#tables.values()) {
        const a = t.A.subarray(slot * t.per * R * t.spec.inDim, (slot + 1) * t.per * R * t.spec.inDim);
        const b = t.B.subarray(slot * t.per * t.spec.outDim * R, (slot + 1) * t.per * t.spec.outDim * R);
        if (a.some((x: number) => x !== 0) || b.some((x: number) => x !== 0)) return false;
        if (t.AS.length > 0 && (t.AS.subarray(slot * R, (slot + 1) * R).some((x) => x !== 0) || t.BS.subarray(slot * R, (slot + 1) * R).some((x) => x !== 0))) return false;
        const n = t.spec.outDim;
        if (hasOut(t.spec) && (t.S.subarray(slot * n, (slot + 1) * n).some((x) => x !== 0) || t.C.subarray(slot * n, (slot + 1) * n).some((x) => x !== 0))) return false;
      }
    }
    return true;
  }

  /** Replaces the factors in an occupied `slot` with `adapter`'s (after a plan change). */
  rewrite(slot: number, adapter: LoraAdapter, experts: readonly ExpertSlotFactors[] = [], source?: SlotSource, outs?: ReadonlyMap<string, SlotOut>): void {
    const was = this.#sources.get(slot);
    this.#zero(slot);
    this.#free.push(slot);
    const again = this.write(adapter, experts, source ?? was, outs);
    if (again !== slot) throw new EngineError(EngineCode.BAD_OPTIONS, `slot ${String(slot)} was not rewritten in place`);
  }

  /** Bytes of the factors in occupied slots (unpadded: rank r of an adapter, not the slot rank). */
  get factorBytes(): number {
    let n = 0;
    for (const b of this.#factorBytes.values()) n += b;
    return n;
  }

  /** Rounds `a[from, to)` to the tables' dtype (nothing to do in f32, where the writes rounded). */
  #round(a: Float32Array, from: number, to: number): void {
    if (this.dtype === 'f32' || !isFloatDType(this.dtype)) return;
    roundFloat32InPlace(a, this.dtype, from, to);
  }

  /** Tells executors holding the tables between runs (`RunOptions.resident`) that `t` changed. */
  #changed(t: Tables): void {
    inputChanged(t.A);
    inputChanged(t.B);
    if (t.AS.length > 0) {
      inputChanged(t.AS);
      inputChanged(t.BS);
    }
    if (hasOut(t.spec)) {
      inputChanged(t.S);
      inputChanged(t.C);
    }
  }

  #zero(slot: number): void {
    this.#outSlots.delete(slot);
    // Only the rows ever written: the padding rows beyond were never touched (their pages are not
    // resident), and writing zeros there would make them so.
    const R = this.rank;
    const r = this.#written[slot]!;
    if (this.#device !== undefined) {
      // The rows ever written, as zeros (expert tables: the slot's whole block).
      const writes: DeviceWrite[] = [];
      if (r > 0) {
        for (const t of this.#tables.values()) {
          const { inDim, outDim } = t.spec;
          if (t.spec.experts === undefined) writes.push({ target: t.inputs.A, start: slot * R * inDim, data: new Float32Array(r * inDim) }, { target: t.inputs.B, start: slot * R * outDim, data: new Float32Array(r * outDim) }, { target: t.inputs.S!, start: slot * outDim, data: new Float32Array(outDim) }, { target: t.inputs.C!, start: slot * outDim, data: new Float32Array(outDim) });
          else writes.push({ target: t.inputs.A, start: slot * t.per * R * inDim, data: new Float32Array(t.per * R * inDim) }, { target: t.inputs.B, start: slot * t.per * outDim * R, data: new Float32Array(t.per * outDim * R) });
        }
      }
      this.#send(writes);
      this.#written[slot] = 0;
      this.#sources.delete(slot);
      this.#factorBytes.delete(slot);
      return;
    }
    for (const t of this.#tables.values()) {
      const { inDim, outDim } = t.spec;
      if (r > 0) this.#changed(t);
      if (t.spec.experts === undefined) {
        t.A.fill(0, slot * R * inDim, (slot * R + r) * inDim);
        t.B.fill(0, slot * R * outDim, (slot * R + r) * outDim);
        if (t.AS.length > 0) {
          t.AS.fill(0, slot * R, slot * R + r);
          t.BS.fill(0, slot * R, slot * R + r);
        }
        if (r > 0) {
          t.S.fill(0, slot * outDim, (slot + 1) * outDim);
          t.C.fill(0, slot * outDim, (slot + 1) * outDim);
        }
        continue;
      }
      for (let e = 0; e < t.per; e++) {
        const g = slot * t.per + e;
        t.A.fill(0, g * R * inDim, (g * R + r) * inDim);
        for (let o = 0; o < outDim; o++) t.B.fill(0, (g * outDim + o) * R, (g * outDim + o) * R + r);
      }
    }
    this.#factorBytes.delete(slot);
  }

  /** Zeroes `slot` and returns it to the free list. */
  free(slot: number): void {
    this.#zero(slot);
    this.#free.push(slot);
  }
}
