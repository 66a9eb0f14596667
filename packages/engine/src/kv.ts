import type { DType, HostTensor } from '@stageml/ir';
import { EngineCode, EngineError } from './errors.js';

/** Additive mask value of an ignored key: float32's lowest, as HF uses. */
export const MASKED = -3.4028234663852886e38;

const EMPTY = new Float32Array(0);

/**
 * One sequence's KV cache, resident on the host the executor reads from: per layer a key and a
 * value buffer laid out position-major [capacity, kv_heads, head_dim], so the filled prefix is
 * contiguous — a step feeds it as a zero-copy view, and a step's new positions are appended in
 * place. The buffers are allocated at the first write; capacity grows by doubling (amortized O(1)
 * copies per position), stopping at the positions the sequence is expected to reach (`expect`)
 * when those cover the need: every growth leaves the old buffers to the garbage collector,
 * resident until it runs, and every position of slack counts against the KV budget. `mask`
 * holds each cached position's additive key mask (0 attended, `MASKED` for padding).
 */
export class SequenceKv {
  #keys: Float32Array[];
  #values: Float32Array[];
  #mask: Float32Array;
  #capacity: number;
  /** Whether the buffers exist (allocated at the first write, at `capacity`). */
  #allocated = false;
  #expected: number | undefined;
  /** Positions filled. */
  length = 0;

  constructor(
    readonly layers: number,
    /** kv_heads × head_dim: floats per position per layer. */
    readonly width: number,
    capacity = 16,
    /** Dtype of the keys and values (the engine's compute dtype; bf16/f16 values in the IR's f32 host storage). */
    readonly dtype: DType = 'f32',
    /**
     * Whether the host holds the keys and values. False where the executor's cache is the only
     * copy (resident KV without `hostKvCopy`): only the length and the key mask are kept, `append`
     * ignores its key and value arrays, and reading them (`view`, `copyTo`, `copyRange`) is
     * `ENGINE_BAD_SEQUENCE`.
     */
    readonly holdsKv = true,
  ) {
    this.#capacity = Math.max(1, capacity);
    this.#keys = Array.from({ length: holdsKv ? layers : 0 }, () => EMPTY);
    this.#values = Array.from({ length: holdsKv ? layers : 0 }, () => EMPTY);
    this.#mask = EMPTY;
  }

  /** Allocates the buffers at `capacity` (on the first write). */
  #ensure(): void {
    if (this.#allocated) return;
    this.#keys = this.#keys.map(() => new Float32Array(this.#capacity * this.width));
    this.#values = this.#values.map(() => new Float32Array(this.#capacity * this.width));
    this.#mask = new Float32Array(this.#capacity);
    this.#allocated = true;
  }

  /**
   * Positions the sequence is expected to reach (its prompt and its request's limit of new tokens:
   * `Sequence.reserve`). A hint, never a limit, and never more than doubling would reserve: an
   * empty cache (nothing allocated yet) takes that capacity when it is at most twice the present
   * one, and a growth that doubles past it stops there when it covers the need. Ignored unless a
   * positive integer.
   */
  expect(positions: number): void {
    if (!Number.isSafeInteger(positions) || positions < 1) return;
    this.#expected = positions;
    if (!this.#allocated && this.length === 0 && positions <= 2 * this.#capacity) this.#capacity = positions;
  }

  #held(): void {
    if (!this.holdsKv) throw new EngineError(EngineCode.BAD_SEQUENCE, "this sequence's keys and values live only in the executor's cache (give hostKvCopy to keep a host copy)");
  }

  /** Positions the buffers hold before they grow. */
  get capacity(): number {
    return this.#capacity;
  }

  /** Bytes the buffers occupy (keys, values and mask). */
  get bytes(): number {
    return ((this.holdsKv ? 2 * this.layers * this.#capacity * this.width : 0) + this.#capacity) * 4;
  }

  #reserve(n: number): void {
    this.#ensure();
    if (n <= this.#capacity) return;
    let cap = this.#capacity;
    while (cap < n) cap *= 2;
    // Doubling stops at the expected size when that covers the need: no slack past it.
    if (this.#expected !== undefined && this.#expected >= n && this.#expected < cap) cap = this.#expected;
    const grow = (old: Float32Array, per: number): Float32Array => {
      const next = new Float32Array(cap * per);
      next.set(old.subarray(0, this.length * per));
      return next;
    };
    this.#keys = this.#keys.map((k) => grow(k, this.width));
    this.#values = this.#values.map((v) => grow(v, this.width));
    this.#mask = grow(this.#mask, 1);
    this.#capacity = cap;
  }

  /** The filled prefix of layer `l` as zero-copy views [1, length, width…]. */
  view(l: number, shape: readonly number[]): { readonly k: HostTensor; readonly v: HostTensor } {
    this.#held();
    const n = this.length * this.width;
    return {
      k: { dtype: this.dtype, shape: [1, this.length, ...shape], data: this.#keys[l]!.subarray(0, n) },
      v: { dtype: this.dtype, shape: [1, this.length, ...shape], data: this.#values[l]!.subarray(0, n) },
    };
  }

  /** The filled prefix of the key mask. */
  maskView(): Float32Array {
    return this.#mask.subarray(0, this.length);
  }

  /** Copies layer `l`'s filled prefix to `k`/`v` at `offset` floats (staging a multi-row batch). */
  copyTo(l: number, k: Float32Array, v: Float32Array, offset: number): void {
    this.#held();
    const n = this.length * this.width;
    k.set(this.#keys[l]!.subarray(0, n), offset);
    v.set(this.#values[l]!.subarray(0, n), offset);
  }

  /** Copies layer `l`'s positions [from, length) to `k`/`v` at `offset` floats + from × width (extending a staged copy). */
  copyRange(l: number, k: Float32Array, v: Float32Array, offset: number, from: number): void {
    this.#held();
    const a = from * this.width;
    const n = this.length * this.width;
    k.set(this.#keys[l]!.subarray(a, n), offset + a);
    v.set(this.#values[l]!.subarray(a, n), offset + a);
  }

  /**
   * Shrinks the buffers to the filled positions (a finished sequence's cache kept for reuse: its
   * doubling slack, up to half the buffers, would count against the KV budget). One copy, which
   * leaves the old buffers to the garbage collector: a slack of at most an eighth of the capacity
   * (a sequence that reached its expected size) is kept instead, counted at capacity.
   */
  compact(): void {
    const cap = Math.max(1, this.length);
    if (!this.#allocated) {
      this.#capacity = Math.min(this.#capacity, cap);
      return;
    }
    if (this.#capacity - cap <= this.#capacity >> 3) return;
    const shrink = (old: Float32Array, per: number): Float32Array => old.slice(0, cap * per);
    this.#keys = this.#keys.map((k) => shrink(k, this.width));
    this.#values = this.#values.map((v) => shrink(v, this.width));
    this.#mask = shrink(this.#mask, 1);
    this.#capacity = cap;
  }

  /**
   * Fills this empty cache with the first `n` positions of `src` (keys and values where the host
   * holds them, and the key mask): a prefix cache hit. `ENGINE_BAD_SEQUENCE` when this cache is not
   * empty, `src` holds fewer positions, or the two differ in shape or dtype.
   */
  copyPrefix(src: SequenceKv, n: number): void {
    if (this.length !== 0 || src.length < n || src.width !== this.width || src.layers !== this.layers || src.dtype !== this.dtype || (this.holdsKv && !src.holdsKv)) {
      throw new EngineError(EngineCode.BAD_SEQUENCE, `cannot copy ${String(n)} cached positions of a ${String(src.length)}-position cache into one of ${String(this.length)}`);
    }
    this.#reserve(n);
    const floats = n * this.width;
    for (let l = 0; l < this.#keys.length; l++) {
      this.#keys[l]!.set(src.#keys[l]!.subarray(0, floats));
      this.#values[l]!.set(src.#values[l]!.subarray(0, floats));
    }
    this.#mask.set(src.#mask.subarray(0, n));
    this.length = n;
  }

  /**
   * Appends `count` positions: per layer, `newK[l]`/`newV[l]` from float `offset` (count × width
   * floats each; not read where the host holds no KV), and their key mask. Layers are written
   * first, then `length` moves, so a failed step leaves the cache as it was.
   */
  append(newK: readonly Float32Array[], newV: readonly Float32Array[], offset: number, mask: ArrayLike<number>): void {
    const count = mask.length;
    this.#reserve(this.length + count);
    const at = this.length * this.width;
    const n = count * this.width;
    for (let l = 0; l < this.#keys.length; l++) {
      this.#keys[l]!.set(newK[l]!.subarray(offset, offset + n), at);
      this.#values[l]!.set(newV[l]!.subarray(offset, offset + n), at);
    }
    for (let i = 0; i < count; i++) this.#mask[this.length + i] = mask[i]!;
    this.length += count;
  }
}

/**
 * Reusable staging buffers of multi-row steps: per layer key/value [rows, past, width] and the
 * attention mask [rows, past + 1], grown by doubling and never shrunk, so a step allocates nothing.
 */
export class Staging {
  #k: Float32Array[];
  #v: Float32Array[];
  #mask: Float32Array = new Float32Array(0);

  constructor(readonly layers: number) {
    this.#k = Array.from({ length: layers }, () => new Float32Array(0));
    this.#v = Array.from({ length: layers }, () => new Float32Array(0));
  }

  /** Bytes held. */
  get bytes(): number {
    return (this.#k.reduce((a, k) => a + 2 * k.length, 0) + this.#mask.length) * 4;
  }

  /** Buffers of at least `floats` per layer and `maskFloats` of mask. */
  reserve(floats: number, maskFloats: number): { k: Float32Array[]; v: Float32Array[]; mask: Float32Array } {
    const grow = (a: Float32Array, n: number): Float32Array => {
      if (a.length >= n) return a;
      let cap = Math.max(1, a.length);
      while (cap < n) cap *= 2;
      return new Float32Array(cap);
    };
    this.#k = this.#k.map((k) => grow(k, floats));
    this.#v = this.#v.map((v) => grow(v, floats));
    this.#mask = grow(this.#mask, maskFloats);
    return { k: this.#k, v: this.#v, mask: this.#mask };
  }
}

/**
 * The staged KV of the decode batch, kept across steps: per layer key/value [rows, cap, width]
 * with each row's cached prefix at the start of its `cap` positions (beyond it: stale, to be
 * masked). While the batch keeps the same sequences in the same order and fits `cap`, a step
 * copies only the positions appended since the last one — O(1) per row and step instead of the
 * whole prefix; a change of composition, or a row outgrowing `cap`, re-stages everything once
 * with `cap` rounded up to a multiple of `step` positions.
 */
export class DecodeStaging {
  #rows: readonly SequenceKv[] = [];
  #staged: number[] = [];
  #cap = 0;
  #k: Float32Array[];
  #v: Float32Array[];
  /** Full re-stagings so far (each copies every row's prefix). */
  restages = 0;

  constructor(
    readonly layers: number,
    readonly width: number,
    readonly step = 64,
  ) {
    this.#k = Array.from({ length: layers }, () => new Float32Array(0));
    this.#v = Array.from({ length: layers }, () => new Float32Array(0));
  }

  /** Bytes held. */
  get bytes(): number {
    return this.#k.reduce((a, k) => a + 2 * k.length, 0) * 4;
  }

  /** Drops the staged batch if it holds `kv` (a released sequence): its buffers are not kept alive here. */
  forget(kv: SequenceKv): void {
    if (this.#rows.includes(kv)) {
      this.#rows = [];
      this.#staged = [];
    }
  }

  /** Stages `rows` (the step's sequences in row order); returns `cap` and the buffers [rows, cap, width] per layer. */
  stage(rows: readonly SequenceKv[]): { readonly cap: number; readonly k: readonly Float32Array[]; readonly v: readonly Float32Array[] } {
    const longest = Math.max(1, ...rows.map((r) => r.length));
    const same = rows.length === this.#rows.length && longest <= this.#cap && rows.every((r, i) => r === this.#rows[i] && r.length >= this.#staged[i]!);
    const w = this.width;
    if (!same) {
      this.#cap = Math.ceil(longest / this.step) * this.step;
      const floats = rows.length * this.#cap * w;
      if (this.#k[0]!.length < floats) {
        this.#k = this.#k.map(() => new Float32Array(floats));
        this.#v = this.#v.map(() => new Float32Array(floats));
      }
      for (let l = 0; l < this.layers; l++) rows.forEach((r, i) => { r.copyTo(l, this.#k[l]!, this.#v[l]!, i * this.#cap * w); });
      this.#rows = [...rows];
      this.#staged = rows.map((r) => r.length);
      this.restages++;
    } else {
      rows.forEach((r, i) => {
        if (r.length === this.#staged[i]) return;
        for (let l = 0; l < this.layers; l++) r.copyRange(l, this.#k[l]!, this.#v[l]!, i * this.#cap * w, this.#staged[i]!);
        this.#staged[i] = r.length;
      });
    }
    const n = rows.length * this.#cap * w;
    return { cap: this.#cap, k: this.#k.map((k) => k.subarray(0, n)), v: this.#v.map((v) => v.subarray(0, n)) };
  }
}
