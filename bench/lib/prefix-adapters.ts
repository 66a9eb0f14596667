import type { writeRandomAdapter } from '@stageml/engine';

/**
 * The prefix benches' adapters (`bench/prefix.ts`, `bench/prefix-torch.ts`): four on every
 * projection (each reaches every layer's K/V: blocks of their own), two on the last layer's MLP and
 * one on its q/o (they reach no K/V: they share the base's blocks), and with `head` one that also
 * overrides the LM head (it needs the base weights on the host).
 */
export function prefixAdapters(lastLayer: number, head: boolean): [string, Parameters<typeof writeRandomAdapter>[2]][] {
  const mlp = ['gate_proj', 'up_proj', 'down_proj'] as const;
  return [
    ['all-1', { rank: 16, seed: 1 }],
    ['all-2', { rank: 16, seed: 2 }],
    ['all-3', { rank: 16, seed: 3 }],
    ['all-4', { rank: 16, seed: 4 }],
    ['last-mlp-1', { rank: 16, seed: 5, targets: mlp, layers: [lastLayer] }],
    ['last-mlp-2', { rank: 16, seed: 6, targets: mlp, layers: [lastLayer] }],
    ['last-qo', { rank: 16, seed: 7, targets: ['q_proj', 'o_proj'], layers: [lastLayer] }],
    ...(head ? [['head', { rank: 16, seed: 8, targets: ['down_proj'], layers: [lastLayer], overrideLmHead: true }] as [string, Parameters<typeof writeRandomAdapter>[2]]] : []),
  ];
}
