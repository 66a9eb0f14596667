import type { GraphBuilder, Value } from '@stageml/ir';
import type { LinearFactory } from '@stageml/models';

/** Input name of the row → slot indices i64[batch] (slot 0 is the base model: all zeros). */
export const ROW_SLOT_INPUT = 'row_slot';

/** Input names of a module's slot tables: A f32[N, R, in] and B f32[N, out, R] (scale folded into B). */
export function slotInputNames(module: string): { readonly A: string; readonly B: string } {
  return { A: `slots.${module}.A`, B: `slots.${module}.B` };
}

/** One projection that has slot tables, as a slot linear factory declares it. */
export interface SlotModule {
  /** HF module path, e.g. `model.layers.0.self_attn.q_proj`. */
  readonly module: string;
  /** Input width. */
  readonly inDim: number;
  /** Output width. */
  readonly outDim: number;
}

/**
 * Linear layers whose LoRA factors are run-time data: each projection reads its base weight
 * `<module>.weight` (a parameter, resident once in the prepared program) and two slot tables that
 * are graph *inputs*, so loading, evicting or mixing adapters never re-prepares anything:
 *
 *   y[i] = x[i]·Wᵀ (+ b) + (x[i]·A[slot_i]ᵀ)·B[slot_i]ᵀ        (BGMV form)
 *
 * with `slot_i` = `row_slot[i]`. Each row gathers its slot's factors and applies them in one batched
 * matmul; a rank-r adapter sits zero-padded inside an R-rank slot (as vLLM's LoRA slots), so every
 * row pays for R. `modules` collects every projection the graph declares, for the tables' shapes.
 */
export function slotLinear(slots: number, rank: number, modules: SlotModule[]): LinearFactory {
  const rowSlot = new Map<GraphBuilder, Value>();
  return (b, module, x, inDim, outDim, bias) => {
    const w = b.param(`${module}.weight`, ['f32', [outDim, inDim]]);
    const base = b.linear(x, w, bias ? b.param(`${module}.bias`, ['f32', [outDim]]) : undefined);
    let rows = rowSlot.get(b);
    if (rows === undefined) rowSlot.set(b, (rows = b.input(ROW_SLOT_INPUT, ['i64', ['batch']])));
    const names = slotInputNames(module);
    const A = b.input(names.A, ['f32', [slots, rank, inDim]]);
    const B = b.input(names.B, ['f32', [slots, outDim, rank]]);
    modules.push({ module, inDim, outDim });
    const shrink = b.matmul(x, b.gather(A, rows, 0), { transposeB: true });
    return b.add(base, b.matmul(shrink, b.gather(B, rows, 0), { transposeB: true }));
  };
}
