import { type DType, type HostTensor, dtypeBytes, isFloatDType, roundFloat32InPlace } from '@stageml/ir';
import type { LoraAdapter } from '@stageml/peft';
import { inputChanged } from '@stageml/runtime';
import { EngineCode, EngineError } from './errors.js';
import { type SlotModule, slotInputNames } from './slot-linear.js';

interface Tables {
  readonly spec: SlotModule;
  /** Matrices per slot: 1, or E for an expert projection. */
  readonly per: number;
  readonly A: Float32Array;
  readonly B: Float32Array;
  readonly inputs: { readonly A: HostTensor; readonly B: HostTensor };
}

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
  /** Bytes the tables occupy. */
  readonly bytes: number;

  constructor(
    /** Slots N, including the base slot 0. */
    readonly slots: number,
    /** Rank R of every slot. */
    readonly rank: number,
    modules: readonly SlotModule[],
    /**
     * Dtype of the factors (default f32; bf16/f16 for an engine with `adapterDtype: 'same'`): the
     * tables are inputs of that dtype, in the IR's host storage (values rounded on write), and
     * count its bytes.
     */
    readonly dtype: DType = 'f32',
  ) {
    const inputs: Record<string, HostTensor> = {};
    let bytes = 0;
    for (const spec of modules) {
      const per = spec.experts ?? 1;
      const A = new Float32Array(slots * per * rank * spec.inDim);
      const B = new Float32Array(slots * per * spec.outDim * rank);
      const names = slotInputNames(spec.module);
      const t: Tables = {
        spec,
        per,
        A,
        B,
        inputs: {
          A: { dtype, shape: [slots * per, rank, spec.inDim], data: A },
          B: { dtype, shape: spec.experts === undefined ? [slots, rank, spec.outDim] : [slots * per, spec.outDim, rank], data: B },
        },
      };
      inputs[names.A] = t.inputs.A;
      inputs[names.B] = t.inputs.B;
      bytes += (A.length + B.length) * dtypeBytes(dtype);
      this.#tables.set(spec.module, t);
    }
    this.inputs = inputs;
    this.bytes = bytes;
    this.#written = new Int32Array(slots);
    for (let s = slots - 1; s >= 1; s--) this.#free.push(s);
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

  /** Takes a free slot and writes `adapter`'s factors (and its expert factors) into it (scale folded into B). */
  write(adapter: LoraAdapter, experts: readonly ExpertSlotFactors[] = []): number {
    const slot = this.#free.pop();
    if (slot === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `no free slot for '${adapter.name}' (all ${String(this.slots - 1)} adapter slots hold adapters)`);
    const R = this.rank;
    let bytes = 0;
    for (const m of adapter.modules.values()) {
      const t = this.#tables.get(m.module)!;
      const { inDim, outDim } = t.spec;
      const bsrc = m.B.data;
      t.A.set(f32(m.A.data), slot * R * inDim);
      const base = slot * R * outDim;
      for (let j = 0; j < m.rank; j++) {
        const row = base + j * outDim;
        for (let o = 0; o < outDim; o++) t.B[row + o] = m.scale * bsrc[o * m.rank + j]!;
      }
      this.#round(t.A, slot * R * inDim, (slot * R + m.rank) * inDim);
      this.#round(t.B, base, base + m.rank * outDim);
      this.#written[slot] = Math.max(this.#written[slot]!, m.rank);
      bytes += m.rank * (inDim + outDim) * dtypeBytes(this.dtype);
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
      this.#round(t.A, slot * E * R * inDim, (slot + 1) * E * R * inDim);
      this.#round(t.B, slot * E * outDim * R, (slot + 1) * E * outDim * R);
      this.#written[slot] = Math.max(this.#written[slot]!, r);
      bytes += E * r * (inDim + outDim) * dtypeBytes(this.dtype);
      this.#changed(t);
    }
    this.#factorBytes.set(slot, bytes);
    return slot;
  }

  /** Whether the base slot and every free slot hold only zeros (what `free` guarantees). */
  freeSlotsAreZero(): boolean {
    const R = this.rank;
    for (const slot of [0, ...this.#free]) {
      for (const t of this.#tables.values()) {
        const a = t.A.subarray(slot * t.per * R * t.spec.inDim, (slot + 1) * t.per * R * t.spec.inDim);
        const b = t.B.subarray(slot * t.per * t.spec.outDim * R, (slot + 1) * t.per * t.spec.outDim * R);
        if (a.some((x) => x !== 0) || b.some((x) => x !== 0)) return false;
      }
    }
    return true;
  }

  /** Replaces the factors in an occupied `slot` with `adapter`'s (after a plan change). */
  rewrite(slot: number, adapter: LoraAdapter, experts: readonly ExpertSlotFactors[] = []): void {
    this.#zero(slot);
    this.#free.push(slot);
    const again = this.write(adapter, experts);
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
  }

  #zero(slot: number): void {
    // Only the rows ever written: the padding rows beyond were never touched (their pages are not
    // resident), and writing zeros there would make them so.
    const R = this.rank;
    const r = this.#written[slot]!;
    for (const t of this.#tables.values()) {
      const { inDim, outDim } = t.spec;
      if (r > 0) this.#changed(t);
      if (t.spec.experts === undefined) {
        t.A.fill(0, slot * R * inDim, (slot * R + r) * inDim);
        t.B.fill(0, slot * R * outDim, (slot * R + r) * outDim);
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
