import type { HostTensor } from '@stageml/ir';
import type { LoraAdapter } from '@stageml/peft';
import { EngineCode, EngineError } from './errors.js';
import { type SlotModule, slotInputNames } from './slot-linear.js';

interface Tables {
  readonly spec: SlotModule;
  readonly A: Float32Array;
  readonly B: Float32Array;
  readonly inputs: { readonly A: HostTensor; readonly B: HostTensor };
}

/**
 * The slot tables of one program: for every projection, A f32[N, R, in] and B f32[N, R, out],
 * allocated once (N·R·(in + out)·4 bytes per projection, whatever ranks are loaded) and fed to
 * every run as zero-copy inputs. Slot 0 stays zero (base-only rows); slots 1…N−1 hold adapters.
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
  ) {
    const inputs: Record<string, HostTensor> = {};
    let bytes = 0;
    for (const spec of modules) {
      const A = new Float32Array(slots * rank * spec.inDim);
      const B = new Float32Array(slots * spec.outDim * rank);
      const names = slotInputNames(spec.module);
      const t: Tables = {
        spec,
        A,
        B,
        inputs: { A: { dtype: 'f32', shape: [slots, rank, spec.inDim], data: A }, B: { dtype: 'f32', shape: [slots, rank, spec.outDim], data: B } },
      };
      inputs[names.A] = t.inputs.A;
      inputs[names.B] = t.inputs.B;
      bytes += (A.length + B.length) * 4;
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

  /** Slots not holding an adapter. */
  get freeSlots(): number {
    return this.#free.length;
  }

  /** Takes a free slot and writes `adapter`'s factors into it (scale folded into B). */
  write(adapter: LoraAdapter): number {
    const slot = this.#free.pop();
    if (slot === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `no free slot for '${adapter.name}' (all ${String(this.slots - 1)} adapter slots hold adapters)`);
    const R = this.rank;
    let bytes = 0;
    for (const m of adapter.modules.values()) {
      const t = this.#tables.get(m.module)!;
      const { inDim, outDim } = t.spec;
      const a = m.A.data;
      const bsrc = m.B.data;
      t.A.set(a instanceof Float32Array ? a : Float32Array.from(a as ArrayLike<number>), slot * R * inDim);
      const base = slot * R * outDim;
      for (let j = 0; j < m.rank; j++) {
        const row = base + j * outDim;
        for (let o = 0; o < outDim; o++) t.B[row + o] = m.scale * bsrc[o * m.rank + j]!;
      }
      this.#written[slot] = Math.max(this.#written[slot]!, m.rank);
      bytes += m.rank * (inDim + outDim) * 4;
    }
    this.#factorBytes.set(slot, bytes);
    return slot;
  }

  /** Whether the base slot and every free slot hold only zeros (what `free` guarantees). */
  freeSlotsAreZero(): boolean {
    const R = this.rank;
    for (const slot of [0, ...this.#free]) {
      for (const t of this.#tables.values()) {
        const a = t.A.subarray(slot * R * t.spec.inDim, (slot + 1) * R * t.spec.inDim);
        const b = t.B.subarray(slot * t.spec.outDim * R, (slot + 1) * t.spec.outDim * R);
        if (a.some((x) => x !== 0) || b.some((x) => x !== 0)) return false;
      }
    }
    return true;
  }

  /** Replaces the factors in an occupied `slot` with `adapter`'s (after a plan change). */
  rewrite(slot: number, adapter: LoraAdapter): void {
    this.#zero(slot);
    this.#free.push(slot);
    const again = this.write(adapter);
    if (again !== slot) throw new EngineError(EngineCode.BAD_OPTIONS, `slot ${String(slot)} was not rewritten in place`);
  }

  /** Bytes of the factors in occupied slots (unpadded: rank r of an adapter, not the slot rank). */
  get factorBytes(): number {
    let n = 0;
    for (const b of this.#factorBytes.values()) n += b;
    return n;
  }

  #zero(slot: number): void {
    // Only the rows ever written: the padding rows beyond were never touched (their pages are not
    // resident), and writing zeros there would make them so.
    const R = this.rank;
    const r = this.#written[slot]!;
    for (const t of this.#tables.values()) {
      t.A.fill(0, slot * R * t.spec.inDim, (slot * R + r) * t.spec.inDim);
      t.B.fill(0, slot * t.spec.outDim * R, (slot * R + r) * t.spec.outDim);
    }
    this.#factorBytes.delete(slot);
  }

  /** Zeroes `slot` and returns it to the free list. */
  free(slot: number): void {
    this.#zero(slot);
    this.#free.push(slot);
  }
}
