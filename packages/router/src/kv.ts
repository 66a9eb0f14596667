import type { HostTensor } from '@stageml/ir';
import type { KvCache } from '@stageml/models';

/**
 * Stacks single-row KV caches of different lengths into one batch cache: each row is left-padded
 * with zero keys/values that its attention mask ignores, so rows with different histories decode
 * in one step. Returns the batch cache and the padding added per row.
 */
export function stackCaches(caches: readonly KvCache[]): { cache: KvCache; pads: number[] } {
  const past = Math.max(...caches.map((c) => c.past));
  const pads = caches.map((c) => past - c.past);
  const tensors: Record<string, HostTensor> = {};
  for (const key of Object.keys(caches[0]!.tensors)) {
    const first = caches[0]!.tensors[key]!;
    const [, heads, , dim] = first.shape as [number, number, number, number];
    const data = new Float32Array(caches.length * heads * past * dim);
    caches.forEach((c, r) => {
      const t = c.tensors[key]!;
      const own = c.past;
      for (let h = 0; h < heads; h++) {
        const src = t.data.subarray(h * own * dim, (h + 1) * own * dim);
        data.set(src, ((r * heads + h) * past + pads[r]!) * dim);
      }
    });
    tensors[key] = { dtype: 'f32', shape: [caches.length, heads, past, dim], data };
  }
  return {
    cache: {
      past,
      tensors,
      mask: caches.map((c, r) => [...new Array<number>(pads[r]!).fill(0), ...c.mask[0]!]),
      nextPosition: caches.map((c) => c.nextPosition[0]!),
    },
    pads,
  };
}

/** Splits a batch cache back into single-row caches, dropping the padding `stackCaches` added. */
export function splitCache(cache: KvCache, pads: readonly number[]): KvCache[] {
  return pads.map((pad, r) => {
    const past = cache.past - pad;
    const tensors: Record<string, HostTensor> = {};
    for (const [key, t] of Object.entries(cache.tensors)) {
      const [, heads, total, dim] = t.shape as [number, number, number, number];
      const data = new Float32Array(heads * past * dim);
      for (let h = 0; h < heads; h++) {
        const start = ((r * heads + h) * total + pad) * dim;
        data.set(t.data.subarray(start, start + past * dim), h * past * dim);
      }
      tensors[key] = { dtype: 'f32', shape: [1, heads, past, dim], data };
    }
    return { past, tensors, mask: [cache.mask[r]!.slice(pad)], nextPosition: [cache.nextPosition[r]!] };
  });
}
