import { describe, expect, it } from 'vitest';
import { DecodeStaging, SequenceKv } from './kv.js';

const W = 3;
const L = 2;

/** Appends `n` positions whose values encode (sequence id, layer, position, lane). */
function grow(kv: SequenceKv, id: number, n: number): void {
  const k: Float32Array[] = [];
  const v: Float32Array[] = [];
  for (let l = 0; l < L; l++) {
    k.push(Float32Array.from({ length: n * W }, (_, i) => id * 1e4 + l * 1e3 + (kv.length + Math.floor(i / W)) * 10 + (i % W)));
    v.push(Float32Array.from({ length: n * W }, (_, i) => -(id * 1e4 + l * 1e3 + (kv.length + Math.floor(i / W)) * 10 + (i % W))));
  }
  kv.append(k, v, 0, new Array<number>(n).fill(0));
}

/** Each row's staged prefix equals its own buffers. */
function check(staged: ReturnType<DecodeStaging['stage']>, rows: SequenceKv[]): void {
  rows.forEach((r, i) => {
    for (let l = 0; l < L; l++) {
      const want = r.view(l, [W]);
      expect(Array.from(staged.k[l]!.subarray(i * staged.cap * W, i * staged.cap * W + r.length * W))).toEqual(Array.from(want.k.data));
      expect(Array.from(staged.v[l]!.subarray(i * staged.cap * W, i * staged.cap * W + r.length * W))).toEqual(Array.from(want.v.data));
    }
  });
}

describe('DecodeStaging', () => {
  it('copies only appended positions while the batch is the same, and re-stages on a change or growth', () => {
    const rows = [0, 1, 2].map(() => new SequenceKv(L, W, 4));
    rows.forEach((r, i) => { grow(r, i, 5 + i * 3); });
    const st = new DecodeStaging(L, W, 8);
    let staged = st.stage(rows);
    expect(staged.cap).toBe(16);
    expect(st.restages).toBe(1);
    check(staged, rows);
    for (let step = 0; step < 4; step++) {
      rows.forEach((r, i) => { grow(r, i, 1); });
      staged = st.stage(rows);
      check(staged, rows);
    }
    expect(st.restages).toBe(1);
    // Outgrowing the cap (row 2 reaches 17 positions) re-stages with the cap rounded up.
    grow(rows[2]!, 2, 2);
    staged = st.stage(rows);
    expect(staged.cap).toBe(24);
    expect(st.restages).toBe(2);
    check(staged, rows);
    // A different composition (a row left) re-stages.
    staged = st.stage([rows[0]!, rows[2]!]);
    expect(st.restages).toBe(3);
    check(staged, [rows[0]!, rows[2]!]);
    expect(staged.k[0]!.length).toBe(2 * 24 * W);
    // Forgetting a staged row (its sequence was released) re-stages the next step.
    st.forget(rows[1]!);
    st.stage([rows[0]!, rows[2]!]);
    expect(st.restages).toBe(3);
    st.forget(rows[2]!);
    st.stage([rows[0]!, rows[2]!]);
    expect(st.restages).toBe(4);
  });
});

describe('SequenceKv without host KV (holdsKv false)', () => {
  it('keeps the length and key mask only, grows them, and refuses to hand out keys', () => {
    const kv = new SequenceKv(L, W, 2, 'f32', false);
    kv.append([], [], 0, [0, -1, 0]);
    kv.append([], [], 0, [0]);
    expect(kv.length).toBe(4);
    expect(kv.capacity).toBe(4);
    expect(Array.from(kv.maskView())).toEqual([0, -1, 0, 0]);
    expect(kv.bytes).toBe(4 * 4);
    for (const read of [() => kv.view(0, [W]), () => { kv.copyTo(0, new Float32Array(99), new Float32Array(99), 0); }, () => { kv.copyRange(0, new Float32Array(99), new Float32Array(99), 0, 1); }]) {
      expect(read).toThrow(expect.objectContaining({ code: 'ENGINE_BAD_SEQUENCE' }) as Error);
    }
    const held = new SequenceKv(L, W, 2);
    grow(held, 1, 4);
    expect(held.bytes).toBe((2 * L * 4 * W + 4) * 4);
  });
});

describe('SequenceKv sizing', () => {
  /** Keys of layer 1 as position-major rows, to compare contents across growth. */
  const keys = (kv: SequenceKv): number[] => Array.from(kv.view(1, [W]).k.data);

  it('takes the expected size at once when empty: no doubling, no slack to compact', () => {
    const kv = new SequenceKv(L, W, 32);
    kv.expect(37);
    expect(kv.capacity).toBe(37);
    grow(kv, 1, 30);
    grow(kv, 1, 6);
    expect([kv.length, kv.capacity]).toEqual([36, 37]);
    // One position of slack (the last token is never fed back) is kept, not copied away.
    kv.compact();
    expect(kv.capacity).toBe(37);
    // Past the expectation it doubles as before, contents kept.
    const before = keys(kv);
    grow(kv, 1, 2);
    expect(kv.capacity).toBe(74);
    expect(keys(kv).slice(0, before.length)).toEqual(before);
  });

  it('stops doubling at the expected size when it covers the need; reserves no more than doubling would', () => {
    const kv = new SequenceKv(L, W, 4);
    grow(kv, 2, 3);
    kv.expect(13);
    expect(kv.capacity).toBe(4);
    const before = keys(kv);
    grow(kv, 2, 5);
    expect([kv.length, kv.capacity]).toEqual([8, 8]);
    grow(kv, 2, 3);
    expect([kv.length, kv.capacity]).toEqual([11, 13]);
    expect(keys(kv).slice(0, before.length)).toEqual(before);
    // Past the expectation: doubling again.
    grow(kv, 2, 3);
    expect(kv.capacity).toBe(26);
    // A far expectation is not reserved up front.
    const far = new SequenceKv(L, W, 16);
    far.expect(1000);
    expect(far.capacity).toBe(16);
  });

  it('compacts a slack over an eighth of the capacity, keeps a smaller one; ignores bad hints', () => {
    const wide = new SequenceKv(L, W, 16);
    grow(wide, 3, 13);
    const content = keys(wide);
    wide.compact();
    expect(wide.capacity).toBe(13);
    expect(keys(wide)).toEqual(content);
    const close = new SequenceKv(L, W, 16);
    grow(close, 3, 14);
    close.compact();
    expect(close.capacity).toBe(16);
    for (const bad of [0, -3, 2.5, Number.NaN]) {
      const kv = new SequenceKv(L, W, 16);
      kv.expect(bad);
      expect(kv.capacity).toBe(16);
    }
    // Never written: compacting shrinks the capacity it would allocate.
    const unused = new SequenceKv(L, W, 16);
    unused.compact();
    expect(unused.capacity).toBe(1);
  });
});
