import type { GraphBuilder, Value } from '@stageml/ir';
import type { ExpertsFactory, LinearFactory } from '@stageml/models';
import { moeBlock } from '@stageml/moe';

/** Input name of the row → slot indices i64[batch] of the gathered form (slot 0: base, all zeros). */
export const ROW_SLOT_INPUT = 'row_slot';
/** Input name of the distinct slots i64[groups] of the grouped form. */
export const GROUP_SLOT_INPUT = 'group_slot';
/** Input name of the row → group one-hot f32[batch, groups] of the grouped form. */
export const ROW_GROUP_INPUT = 'row_group';
/** Input name of the one slot i64[] of the single form. */
export const ONE_SLOT_INPUT = 'one_slot';
/** Input name of the row mask f32[batch, 1, 1] of the single form (1: the slot's adapter, 0: base). */
export const ROW_MASK_INPUT = 'row_mask';

/**
 * How a program applies the slot factors:
 * - `gathered` (BGMV): every row gathers its slot's A and B (R·(in + out) floats per row and
 *   projection) and applies them in one batched matmul — cost grows with rows, not adapters;
 * - `grouped`: the batch's G distinct slots are gathered once, every row is multiplied by all G
 *   of them in two dense matmuls and a one-hot mask keeps its own — cost G·R·(in + out) bytes plus
 *   rows·G·R·(in + out) flops, far cheaper while G is small (a few adapters);
 * - `single`: the batch has one adapter (its other rows base): its slot is gathered once and
 *   applied to every row, a row mask zeroing base rows — the fewest ops per projection, what a
 *   batch-1 step with an adapter runs.
 */
export type SlotForm = 'gathered' | 'grouped' | 'single';

/**
 * Input names of a module's slot tables: A f32[N, R, in] and B f32[N, R, out] (scale folded into
 * B), and the output tables of the projections that have them (not MoE experts): S f32[N, out]
 * (DoRA's column scale minus 1) and C f32[N, out] (the scaled LoRA bias) — see `adapter-kinds.ts`.
 * With int8 factors (`SlotLinearOptions.int8Factors`) A and B hold i8 codes and `AScale`, `BScale`
 * f32[N, R] their per-rank-row scales.
 */
export function slotInputNames(module: string): { readonly A: string; readonly B: string; readonly S: string; readonly C: string; readonly AScale: string; readonly BScale: string } {
  return { A: `slots.${module}.A`, B: `slots.${module}.B`, S: `slots.${module}.S`, C: `slots.${module}.C`, AScale: `slots.${module}.A_scale`, BScale: `slots.${module}.B_scale` };
}

/** Input name of the token → slot indices i64[tokens] of MoE expert factors (both forms). */
export const TOKEN_SLOT_INPUT = 'token_slot';

/** One projection that has slot tables, as a slot linear or slot experts factory declares it. */
export interface SlotModule {
  /** HF module path, e.g. `model.layers.0.self_attn.q_proj` or `model.layers.0.mlp.experts.gate_up_proj`. */
  readonly module: string;
  /** Input width. */
  readonly inDim: number;
  /** Output width. */
  readonly outDim: number;
  /**
   * Experts E of a MoE expert projection: its tables are A f32[N·E, R, in] and B f32[N·E, out, R]
   * (slot-major, PEFT's per-expert layout), indexed by slot·E + expert per routed row.
   */
  readonly experts?: number;
}

/** Options of `slotLinear`. */
export interface SlotLinearOptions {
  /**
   * Whether the projections read the output tables S (DoRA's column scale − 1) and C (the scaled
   * LoRA bias). Default true. Without them a projection is its `loraBankLinear` op alone — five small
   * ops fewer per projection (two gathers, two adds, a mul), which on a GPU decode step are
   * hundreds of kernel launches — and the program serves only adapters whose S and C are zero
   * (plain LoRA); the engine builds programs without them until an adapter that needs them loads.
   */
  readonly outTables?: boolean;
  /**
   * Whether the factor tables are int8 codes with an f32 scale per rank row (`adapterDtype:
   * 'int8'`): each projection is a `quantizedLoraBank` op over A i8[N, R, in], A_scale f32[N, R],
   * B i8[N, R, out], B_scale f32[N, R] (over the base `linear(x, W)`) instead of a
   * `loraBankLinear` over f32 tables. Default false.
   */
  readonly int8Factors?: boolean;
}

/**
 * Linear layers whose LoRA factors are run-time data: each projection reads its base weight
 * `<module>.weight` and two slot tables that are graph *inputs*, so loading, evicting or mixing
 * adapters never re-prepares anything:
 *
 *   u[i] = x[i]·Wᵀ + (x[i]·A[slot_i]ᵀ)·B[slot_i] + C[slot_i]   (one `loraBankLinear` op of form `form`)
 *   y[i] = u[i] + u[i] ⊙ S[slot_i] (+ b)
 *
 * C (LoRA bias) and S (DoRA's column scale − 1) are zero for base rows and plain-LoRA slots, so
 * those rows compute what a plain LoRA computes; the base bias b is added after the scale, as DoRA
 * leaves it unscaled. The per-row C and S are primitive ops (gather, matmul, mul, add), so every
 * executor runs them, whatever it lowers `loraBankLinear` to.
 *
 * A rank-r adapter sits zero-padded inside an R-rank slot (as vLLM's LoRA slots). `SlotTables`
 * writes an adapter's all-zero A rows last, so the gathered form carries `zeroTail` (the rows after
 * a slot's first all-zero A row are zero) and an executor that honours it (cpu-native) reads r rows
 * of a rank-r slot, not R; the others pay for R. `modules` collects every projection the graph
 * declares, for the tables' shapes.
 */
export function slotLinear(form: SlotForm, slots: number, rank: number, modules: SlotModule[], opts: SlotLinearOptions = {}): LinearFactory {
  const outTables = opts.outTables ?? true;
  const int8 = opts.int8Factors === true;
  const shared = new Map<GraphBuilder, { rows?: Value; groups?: Value; onehot?: Value; one?: Value; mask?: Value }>();
  // One bank op per projection: `loraBankLinear` (the base linear inside, so an executor with a
  // kernel for both binds it by name) over f32 tables, `quantizedLoraBank` over `linear(x, W)` with
  // int8 ones. Executors that fuse it read the slot tables in place, the others expand it into the
  // form's primitive graph (its decomposition).
  return (b, module, x, inDim, outDim, bias) => {
    const w = b.param(`${module}.weight`, ['f32', [outDim, inDim]]);
    let s = shared.get(b);
    if (s === undefined) shared.set(b, (s = {}));
    const names = slotInputNames(module);
    const A = b.input(names.A, [int8 ? 'i8' : 'f32', [slots, rank, inDim]]);
    const B = b.input(names.B, [int8 ? 'i8' : 'f32', [slots, rank, outDim]]);
    const scales = int8 ? { a: b.input(names.AScale, ['f32', [slots, rank]]), b: b.input(names.BScale, ['f32', [slots, rank]]) } : undefined;
    // The form's bank op over the f32 tables, or over the int8 codes and their row scales.
    const bank = (form: SlotForm, index: Value, select: Value | undefined, zeroTail: boolean): Value =>
      scales === undefined ? b.loraBankLinear(form, x, w, A, B, index, select, { zeroTail }) : b.quantizedLoraBank(form, x, b.linear(x, w), A, scales.a, B, scales.b, index, select, { zeroTail });
    modules.push({ module, inDim, outDim });
    let u: Value;
    // Each row's row of an output table [N, out], as [batch, 1, out].
    let perRow: (t: Value) => Value;
    if (form === 'single') {
      const one = (s.one ??= b.input(ONE_SLOT_INPUT, ['i64', []]));
      const mask = (s.mask ??= b.input(ROW_MASK_INPUT, ['f32', ['batch', 1, 1]]));
      u = bank('single', one, mask, false);
      perRow = (t) => b.mul(b.reshape(b.gather(t, one, 0), [1, 1, outDim]), mask);
    } else if (form === 'gathered') {
      const rows = (s.rows ??= b.input(ROW_SLOT_INPUT, ['i64', ['batch']]));
      u = bank('gathered', rows, undefined, true);
      perRow = (t) => b.reshape(b.gather(t, rows, 0), [-1, 1, outDim]);
    } else {
      const groups = (s.groups ??= b.input(GROUP_SLOT_INPUT, ['i64', ['groups']]));
      const onehot = (s.onehot ??= b.input(ROW_GROUP_INPUT, ['f32', ['batch', 'groups']]));
      u = bank('grouped', groups, onehot, false);
      perRow = (t) => b.reshape(b.matmul(onehot, b.gather(t, groups, 0)), [-1, 1, outDim]);
    }
    let y = u;
    if (outTables) {
      const S = b.input(names.S, ['f32', [slots, outDim]]);
      const C = b.input(names.C, ['f32', [slots, outDim]]);
      u = b.add(u, perRow(C));
      y = b.add(u, b.mul(u, perRow(S)));
    }
    return bias ? b.add(y, b.param(`${module}.bias`, ['f32', [outDim]])) : y;
  };
}

/**
 * Picks the cheaper form for a step of `rows` rows over `groups` distinct slots: gathered moves
 * about 2·rows slot-loads of factors, grouped G loads plus rows·G·2 flops per factor element
 * (at `flopsPerByte` the executor's compute-to-bandwidth ratio, default 8).
 */
export function chooseSlotForm(rows: number, groups: number, flopsPerByte = 8): SlotForm {
  return groups * (1 + (2 * rows) / flopsPerByte) <= 2 * rows ? 'grouped' : 'gathered';
}


/**
 * MoE layers whose expert LoRA factors are run-time data, like `slotLinear`'s: every expert
 * projection reads slot tables A f32[N·E, R, in] and B f32[N·E, out, R] (scale folded into B)
 * as graph inputs, and each routed (token, expert) row uses the factors of its token's slot
 * (`token_slot` i64[tokens]; slot 0 zeros) — so attention adapters, expert adapters and base rows
 * share one batch and one program, grouped by expert as the base experts are. The router
 * `<layer>.mlp.gate` is a projection of `linear` (the program's slot linear, hidden → experts): its
 * logits get each row's router LoRA (PEFT `target_parameters: ["mlp.gate.weight"]`) from the same
 * slot tables and row slots as the attention projections, before softmax and top-k route the row.
 */
export function slotExperts(slots: number, rank: number, modules: SlotModule[], linear: LinearFactory): ExpertsFactory {
  const tokenSlots = new Map<GraphBuilder, Value>();
  return (b, module, x, s) => {
    let ts = tokenSlots.get(b);
    if (ts === undefined) tokenSlots.set(b, (ts = b.input(TOKEN_SLOT_INPUT, ['i64', ['tokens']])));
    const E = s.numExperts;
    const table = (projection: 'gate_up_proj' | 'down_proj', inDim: number, outDim: number) => {
      const name = `${module}.experts.${projection}`;
      modules.push({ module: name, inDim, outDim, experts: E });
      const names = slotInputNames(name);
      return { A: b.input(names.A, ['f32', [slots * E, rank, inDim]]), B: b.input(names.B, ['f32', [slots * E, outDim, rank]]), scale: 1, tokenSlots: ts };
    };
    // x is the layer's [batch·seq, H] rows; the slot linear reads [batch, seq, H] (one slot per row).
    const routerLogits = b.reshape(linear(b, `${module}.gate`, b.reshape(x, ['batch', 'seq', s.hidden]), s.hidden, E, false), [-1, E]);
    return moeBlock(
      b,
      x,
      {
        routerLogits,
        gateUp: b.param(`${module}.experts.gate_up_proj`, ['f32', [E, 2 * s.intermediate, s.hidden]]),
        down: b.param(`${module}.experts.down_proj`, ['f32', [E, s.hidden, s.intermediate]]),
        lora: { gate_up_proj: table('gate_up_proj', s.hidden, 2 * s.intermediate), down_proj: table('down_proj', s.intermediate, s.hidden) },
      },
      { topK: s.topK, normalize: s.normalize ?? true },
    );
  };
}
