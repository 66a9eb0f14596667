import { type HostTensor, type WeightStore, asWeightStore } from '@stageml/ir';

/** Concrete values by name: a weight store or a plain record of tensors. */
export type ValueSource = WeightStore | Readonly<Record<string, HostTensor>>;

/** Normalizes a value source to a weight store. */
export function toStore(src: ValueSource | undefined): WeightStore {
  return asWeightStore(src);
}

/** A store that looks names up in each store in turn. */
export function chainStores(...stores: readonly WeightStore[]): WeightStore {
  return {
    get: (name) => {
      for (const s of stores) {
        const v = s.get(name);
        if (v !== undefined) return v;
      }
      return undefined;
    },
  };
}
