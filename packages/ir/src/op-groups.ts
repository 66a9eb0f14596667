import type { Trait } from './op-def.js';
import { OPS, OP_KEYS, type OpKey } from './ops/index.js';

/** Every trait an op can declare, in the order the docs list them. */
export const TRAITS: readonly Trait[] = ['elementwise', 'broadcasting', 'commutative', 'associative', 'reduction', 'shape-only', 'constant-like', 'contraction'];

/**
 * Op groups derived from the registry's traits: `OP_GROUPS.contraction` is every op declaring
 * `contraction` (linear, matmul, groupedMatmul, …), in registry order. Consumers query these instead
 * of listing op names, so a new op joins its groups by declaring its traits.
 */
export const OP_GROUPS: Readonly<Record<Trait, readonly OpKey[]>> = Object.freeze(
  Object.fromEntries(TRAITS.map((t) => [t, Object.freeze(OP_KEYS.filter((k) => OPS[k].traits.includes(t)))])) as Record<Trait, readonly OpKey[]>,
);

const SETS = new Map<Trait, ReadonlySet<OpKey>>(TRAITS.map((t) => [t, new Set(OP_GROUPS[t])]));

/** The ops declaring `trait`, as a set (for membership tests). */
export function opsWithTrait(trait: Trait): ReadonlySet<OpKey> {
  return SETS.get(trait)!;
}

/** Whether op `op` declares `trait`. */
export function hasTrait(op: OpKey, trait: Trait): boolean {
  return opsWithTrait(trait).has(op);
}
