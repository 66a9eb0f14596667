import type { ResidualKernel } from './kernel-types.js';

/** One emitter per kernel family: plain LoRA linear, adapter bank (grouped or gathered), MoE LoRA. */
export interface KernelFamilyEmitters<K extends ResidualKernel, R> {
  readonly loraLinear: (k: Extract<K, { readonly kind: 'loraLinear' }>) => R;
  readonly bank: (k: Extract<K, { readonly kind: 'bankGrouped' | 'bankGathered' }>) => R;
  readonly moe: (k: Extract<K, { readonly kind: 'moeLora' }>) => R;
}

/** Calls the emitter of `k`'s family (every backend emits each module per family). */
export function byKernelFamily<K extends ResidualKernel, R>(k: K, emit: KernelFamilyEmitters<K, R>): R {
  const kind: ResidualKernel['kind'] = k.kind;
  switch (kind) {
    case 'loraLinear':
      return emit.loraLinear(k as Extract<K, { readonly kind: 'loraLinear' }>);
    case 'bankGrouped':
    case 'bankGathered':
      return emit.bank(k as Extract<K, { readonly kind: 'bankGrouped' | 'bankGathered' }>);
    case 'moeLora':
      return emit.moe(k as Extract<K, { readonly kind: 'moeLora' }>);
  }
}
