// The torch worker's `loraBankLinear` handlers (native/stageml_torch/bank.py, ops.op_lora_bank_linear)
// on CPU torch: the op's table entry computes exactly its decomposition; with the kernel step
// (STAGEML_TORCH_FUSE=1 on the CPU) a stand-in for the bank kernel `stream.lora_bank_linear`
// (monkeypatched: it records its arguments and returns a torch reference) sees the slots it is
// given (−1 for base rows, each row's slot repeated over seq), the ranks derived from the tables,
// the B layouts, the per-table cache, the bias, the linear and the update's ops when the kernel
// declines, and sibling projections of one input run as one set (`lora_bank_linear_set`, stood in
// for too). The engine's real programs are run in packages/engine/src/torch-bank.test.ts.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type DType, GraphBuilder, expandComposites, graphToJson } from '@stageml/ir';
import { expect, it } from 'vitest';

import { describeWithTorch, runNativePython } from './test-support.js';

const S = 3;
const R = 16;
const IN = 16;
const OUT = 24;

/** One slot linear as the engine's slotLinear builds it (at bf16 with adapterDtype same: one `loraBankLinear` op over x, W[, bias]). */
function slotGraph(form: 'gathered' | 'single' | 'grouped', bias: boolean, opts: { dtype?: DType; decomposed?: boolean } = {}): string {
  const dt = opts.dtype ?? 'bf16';
  const b = new GraphBuilder(`slot_${form}`);
  const x = b.input('x', [dt, ['batch', 'seq', IN]]);
  const w = b.input('W', [dt, [OUT, IN]]);
  const more = bias ? { bias: b.input('bias', [dt, [OUT]]) } : {};
  const A = b.input('A', [dt, [S, R, IN]]);
  const B = b.input('B', [dt, [S, R, OUT]]);
  const cast = (v: ReturnType<typeof b.input>): ReturnType<typeof b.input> => (dt === 'f32' ? v : b.cast(v, dt));
  if (form === 'gathered') {
    b.output('y', b.loraBankLinear('gathered', x, w, A, B, b.input('row_slot', ['i64', ['batch']]), undefined, more));
  } else if (form === 'grouped') {
    const onehot = cast(b.input('row_group', ['f32', ['batch', 'groups']]));
    b.output('y', b.loraBankLinear('grouped', x, w, A, B, b.input('group_slot', ['i64', ['groups']]), onehot, more));
  } else {
    const mask = cast(b.input('row_mask', ['f32', ['batch', 1, 1]]));
    b.output('y', b.loraBankLinear('single', x, w, A, B, b.input('one_slot', ['i64', []]), mask, more));
  }
  const g = b.build();
  const dir = mkdtempSync(join(tmpdir(), 'lora-bank-'));
  const file = join(dir, `${form}${bias ? '-bias' : ''}-${dt}${opts.decomposed === true ? '-decomposed' : ''}.json`);
  // Decomposed: the linear and `loraBank`'s primitive graph, what the engine emitted before the op.
  writeFileSync(file, JSON.stringify(graphToJson(opts.decomposed === true ? expandComposites(g, (op) => op === 'loraBankLinear' || op === 'loraBank') : g)));
  return file;
}

const PRELUDE = `
import gc, json, os
import torch
from stageml_torch import bank, stream
from stageml_torch.graph import Program
calls = []
decline = [False]
def fake(x, w, a_bank, b_bank, slots, ranks, scales, cfg=None, out=None, b_bank_t=None):
    calls.append({"slots": slots.tolist(), "slots_dtype": str(slots.dtype), "ranks": ranks.tolist(), "ranks_dtype": str(ranks.dtype),
                  "scales": scales.tolist(), "b_bank": list(b_bank.shape), "b_bank_t": list(b_bank_t.shape),
                  "b_layout": bool(torch.equal(b_bank, b_bank_t.transpose(1, 2))) and b_bank.is_contiguous(), "x": list(x.shape)})
    if decline[0]:
        return None
    return bank.reference_bank_linear(x, w, a_bank, b_bank, slots, ranks, scales)
stream.lora_bank_linear = fake
stream.available = lambda: True
g = torch.Generator().manual_seed(0)
def rnd(*shape):
    return (torch.rand(shape, generator=g) * 2 - 1).to(torch.bfloat16)
def tables(s, r, i, o):
    A = torch.zeros(s, r, i, dtype=torch.bfloat16)
    B = torch.zeros(s, r, o, dtype=torch.bfloat16)
    A[1, :8], B[1, :8] = rnd(8, i), rnd(8, o)          # a rank-8 adapter in an R-16 slot
    A[2, :16], B[2, :12] = rnd(16, i), rnd(12, o)      # rank 16 (A's rows reach 16)
    return A, B
def prog(path, fuse):
    os.environ["STAGEML_TORCH_FUSE"] = fuse
    with open(path) as f:
        return Program(json.load(f), {})
def close(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())
`;

/** Slot linears (gathered) of one x (q, k, v), one whose weight is computed after the first of them,
 * and one of another input: `group_banks` may set only the first three. */
/** `loraBank` ops, one of them over a `linear(x, W)` of its own x read by it alone: the kernel binds
 * `loraBankLinear` by name, never a `loraBank` by what produced its base. */
function plainBankGraph(): string {
  const b = new GraphBuilder('base_not_linear');
  const x = b.input('x', ['bf16', ['batch', 'seq', IN]]);
  const rows = b.input('row_slot', ['i64', ['batch']]);
  const A = b.input('A', ['bf16', [S, R, IN]]);
  const B = b.input('B', ['bf16', [S, R, OUT]]);
  b.output('y', b.loraBank('gathered', x, b.linear(x, b.input('W', ['bf16', [OUT, IN]])), A, B, rows));
  b.output('z', b.loraBank('gathered', x, b.input('given', ['bf16', ['batch', 'seq', OUT]]), A, B, rows));
  const dir = mkdtempSync(join(tmpdir(), 'lora-bank-'));
  const file = join(dir, 'plain-bank.json');
  writeFileSync(file, JSON.stringify(graphToJson(b.build())));
  return file;
}

function siblingsGraph(): string {
  const b = new GraphBuilder('siblings');
  const x = b.input('x', ['bf16', ['batch', 'seq', IN]]);
  const rows = b.input('row_slot', ['i64', ['batch']]);
  const lin = (xv: ReturnType<typeof b.input>, w: ReturnType<typeof b.input>, i: number) => {
    const A = b.input(`A${String(i)}`, ['bf16', [S, R, IN]]);
    const B = b.input(`B${String(i)}`, ['bf16', [S, R, OUT]]);
    return b.loraBankLinear('gathered', xv, w, A, B, rows);
  };
  const q = lin(x, b.input('W0', ['bf16', [OUT, IN]]), 0);
  // computed after q's step: this projection cannot move up to q's place
  const late = b.add(b.input('W3', ['bf16', [OUT, IN]]), b.input('W3b', ['bf16', [OUT, IN]]));
  const k = lin(x, b.input('W1', ['bf16', [OUT, IN]]), 1);
  const v = lin(x, b.input('W2', ['bf16', [OUT, IN]]), 2);
  const other = b.input('x2', ['bf16', ['batch', 'seq', IN]]);
  b.output('q', q);
  b.output('k', k);
  b.output('v', v);
  b.output('late', lin(x, late, 3));
  b.output('other', lin(other, b.input('W4', ['bf16', [OUT, IN]]), 4));
  const dir = mkdtempSync(join(tmpdir(), 'lora-bank-'));
  const file = join(dir, 'siblings.json');
  writeFileSync(file, JSON.stringify(graphToJson(b.build())));
  return file;
}

describeWithTorch("the torch worker's loraBankLinear handlers (stageml_torch.bank)", () => {
  it('computes exactly the decomposition in every form, f32 and bf16, with and without a bias (the table entry, no kernel step)', () => {
    const cases: [string, string][] = [];
    for (const form of ['gathered', 'single', 'grouped'] as const) {
      for (const dtype of ['f32', 'bf16'] as const) {
        for (const bias of [false, true]) cases.push([slotGraph(form, bias, { dtype }), slotGraph(form, bias, { dtype, decomposed: true })]);
      }
    }
    const out = runNativePython(`${PRELUDE}
res = []
for op_path, dec_path in ${JSON.stringify(cases)}:
    p, d = prog(op_path, "0"), prog(dec_path, "0")
    keys = sorted(st[0] for st in p.steps)
    dt = torch.float32 if "-f32" in op_path else torch.bfloat16
    A, B = tables(${String(S)}, ${String(R)}, ${String(IN)}, ${String(OUT)})
    ins = {"x": rnd(3, 2, ${String(IN)}).to(dt), "W": rnd(${String(OUT)}, ${String(IN)}).to(dt), "bias": rnd(${String(OUT)}).to(dt), "A": A.to(dt), "B": B.to(dt),
           "row_slot": torch.tensor([1, 0, 2]), "one_slot": torch.tensor(2), "row_mask": torch.tensor([1.0, 0.0, 1.0]).reshape(3, 1, 1),
           "group_slot": torch.tensor([2, 1]), "row_group": torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])}
    ins = {k: v for k, v in ins.items() if k in p.input_names()}
    res.append({"keys": keys, "equal": bool(torch.equal(p.run(ins)["y"], d.run(ins)["y"])), "fused": p.fused_slots})
print(json.dumps(res))
`) as { keys: string[]; equal: boolean; fused: number }[];
    expect(out).toHaveLength(12);
    for (const r of out) {
      expect(r.keys.filter((k) => k !== 'cast')).toEqual(['loraBankLinear']);
      expect(r.equal).toBe(true);
      expect(r.fused).toBe(0);
    }
  });

  it('gathered: the kernel gets per-row slots (−1 for base rows, repeated over seq), derived ranks and both B layouts, once per table', () => {
    const out = runNativePython(`${PRELUDE}
p, u = prog(${JSON.stringify(slotGraph('gathered', false))}, "1"), prog(${JSON.stringify(slotGraph('gathered', false))}, "0")
A, B = tables(${String(S)}, ${String(R)}, ${String(IN)}, ${String(OUT)})
ins = {"x": rnd(3, 2, ${String(IN)}), "W": rnd(${String(OUT)}, ${String(IN)}), "A": A, "B": B, "row_slot": torch.tensor([1, 0, 2])}
y = p.run(ins)["y"]
ref = u.run(ins)["y"]
d0 = bank.DERIVATIONS
p.run(ins)
same = bank.DERIVATIONS - d0
A2 = A.clone()
A2[1, 8:10] = rnd(2, ${String(IN)})                     # a new table: rank 16 in slot 1 now
p.run(dict(ins, A=A2, row_slot=torch.tensor([2, 1, 7])))  # 7: outside the table, a base row
new = bank.DERIVATIONS - d0
entries = len(bank._DERIVED)
del A2
gc.collect()
print(json.dumps({"fused": [p.fused_slots, u.fused_slots], "steps": [len(p.steps), len(u.steps)], "calls": calls, "err": close(y, ref),
                  "y_shape": list(y.shape), "same": same, "new": new, "entries": [entries, len(bank._DERIVED)]}))
`) as { fused: number[]; steps: number[]; calls: Record<string, unknown>[]; err: number; y_shape: number[]; same: number; new: number; entries: number[] };
    expect(out.fused).toEqual([1, 0]);
    // One step either way: the kernel step, or the op's table entry (the linear, then the update's ops).
    expect(out.steps).toEqual([1, 1]);
    expect(out.y_shape).toEqual([3, 2, OUT]);
    expect(out.err).toBeLessThan(2e-2);
    expect(out.calls).toHaveLength(3);
    expect(out.calls[0]).toMatchObject({ slots: [1, 1, -1, -1, 2, 2], slots_dtype: 'torch.int32', ranks: [0, 8, 16], ranks_dtype: 'torch.int32', scales: [1, 1, 1], b_bank: [S, OUT, R], b_bank_t: [S, R, OUT], b_layout: true, x: [3, 2, IN] });
    expect(out.calls[2]).toMatchObject({ slots: [2, 2, 1, 1, -1, -1], ranks: [0, 16, 16] });
    // The same tables: no new derivation; a new A: derived again, and its entry freed with it.
    expect(out.same).toBe(0);
    expect(out.new).toBe(1);
    expect(out.entries).toEqual([2, 1]);
  });

  it('single: rows whose mask is 0 and an all-zero slot are base rows; a bias is added after the kernel', () => {
    const out = runNativePython(`${PRELUDE}
path = ${JSON.stringify(slotGraph('single', true))}
p, u = prog(path, "1"), prog(path, "0")
A, B = tables(${String(S)}, ${String(R)}, ${String(IN)}, ${String(OUT)})
ins = {"x": rnd(3, 2, ${String(IN)}), "W": rnd(${String(OUT)}, ${String(IN)}), "bias": rnd(${String(OUT)}), "A": A, "B": B,
       "one_slot": torch.tensor(1), "row_mask": torch.tensor([1.0, 0.0, 1.0]).reshape(3, 1, 1)}
errs = [close(p.run(ins)["y"], u.run(ins)["y"])]
base = u.run(dict(ins, one_slot=torch.tensor(0)))["y"]
y0 = p.run(dict(ins, one_slot=torch.tensor(0)))["y"]
errs.append(close(y0, base))
print(json.dumps({"fused": p.fused_slots, "calls": [c["slots"] for c in calls], "errs": errs}))
`) as { fused: number; calls: number[][]; errs: number[] };
    expect(out.fused).toBe(1);
    expect(out.calls).toEqual([
      [1, 1, -1, -1, 1, 1],
      [-1, -1, -1, -1, -1, -1],
    ]);
    for (const e of out.errs) expect(e).toBeLessThan(2e-2);
  });

  it('grouped: each row takes the slot of its one-hot group (none: a base row)', () => {
    const out = runNativePython(`${PRELUDE}
path = ${JSON.stringify(slotGraph('grouped', false))}
p, u = prog(path, "1"), prog(path, "0")
A, B = tables(${String(S)}, ${String(R)}, ${String(IN)}, ${String(OUT)})
ins = {"x": rnd(3, 2, ${String(IN)}), "W": rnd(${String(OUT)}, ${String(IN)}), "A": A, "B": B,
       "group_slot": torch.tensor([2, 1]), "row_group": torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])}
err = close(p.run(ins)["y"], u.run(ins)["y"])
print(json.dumps({"fused": p.fused_slots, "steps": [len(p.steps), len(u.steps)], "calls": [c["slots"] for c in calls], "err": err}))
`) as { fused: number; steps: number[]; calls: number[][]; err: number };
    expect(out.fused).toBe(1);
    // Kept: the one-hot's cast (shared by every projection of a program).
    expect(out.steps).toEqual([2, 2]);
    expect(out.calls).toEqual([[1, 1, -1, -1, 2, 2]]);
    expect(out.err).toBeLessThan(2e-2);
  });

  it('runs exactly the linear and the op table entry when the kernel declines (and when the rows exceed 64 it is not asked)', () => {
    const out = runNativePython(`${PRELUDE}
decline[0] = True
res = {}
paths = {"gathered": ${JSON.stringify(slotGraph('gathered', true))}, "single": ${JSON.stringify(slotGraph('single', false))}, "grouped": ${JSON.stringify(slotGraph('grouped', true))}}
for form, path in paths.items():
    p, u = prog(path, "1"), prog(path, "0")
    A, B = tables(${String(S)}, ${String(R)}, ${String(IN)}, ${String(OUT)})
    eq = []
    for batch, seq in ((3, 2), (5, 13)):
        ins = {"x": rnd(batch, seq, ${String(IN)}), "W": rnd(${String(OUT)}, ${String(IN)}), "bias": rnd(${String(OUT)}), "A": A, "B": B,
               "row_slot": torch.arange(batch) % 3, "one_slot": torch.tensor(2), "row_mask": (torch.arange(batch) % 2).float().reshape(batch, 1, 1),
               "group_slot": torch.tensor([1, 2]), "row_group": torch.eye(2)[torch.arange(batch) % 2]}
        ins = {k: v for k, v in ins.items() if k in p.input_names()}
        eq.append(bool(torch.equal(p.run(ins)["y"], u.run(ins)["y"])))
    res[form] = {"fused": p.fused_slots, "equal": eq}
print(json.dumps({"res": res, "calls": len(calls)}))
`) as { res: Record<string, { fused: number; equal: boolean[] }>; calls: number };
    expect(out.res).toEqual({ gathered: { fused: 1, equal: [true, true] }, single: { fused: 1, equal: [true, true] }, grouped: { fused: 1, equal: [true, true] } });
    // Asked at 6 rows (declined), not at 65.
    expect(out.calls).toBe(3);
  });

  it('runs the slot linears of one input as one set (lora_bank_linear_set), each alone where the set path declines (exactly the linear and the op table entry where their kernels decline too) or an operand comes later', () => {
    const out = runNativePython(`${PRELUDE}
sets = []
decline_set = [False]
def fake_set(x, items, slots):
    sets.append({"items": len(items), "slots": slots.tolist(), "shapes": [list(w.shape) for w, *_ in items], "b_t": [list(bt.shape) for *_, bt in items]})
    if decline_set[0]:
        return None
    return [bank.reference_bank_linear(x, w, a, b, slots, r, s) for w, a, b, r, s, bt in items]
stream.lora_bank_linear_set = fake_set
path = ${JSON.stringify(siblingsGraph())}
ins = {"x": rnd(3, 2, ${String(IN)}), "x2": rnd(3, 2, ${String(IN)}), "row_slot": torch.tensor([1, 0, 2])}
for i in range(5):
    ins["W%d" % i] = rnd(${String(OUT)}, ${String(IN)})
    ins["A%d" % i], ins["B%d" % i] = tables(${String(S)}, ${String(R)}, ${String(IN)}, ${String(OUT)})
ins["W3b"] = rnd(${String(OUT)}, ${String(IN)})
p, u = prog(path, "1"), prog(path, "0")
os.environ["STAGEML_TORCH_BANK_SETS"] = "0"
apart = prog(path, "1")
del os.environ["STAGEML_TORCH_BANK_SETS"]
members = [len(st[1].members) for st in p.steps if st[0] == bank.SET_KEY]
ref = u.run(ins)
y = p.run(ins)
first = {"sets": list(sets), "singles": len(calls), "errs": {k: close(y[k], ref[k]) for k in ref}}
sets.clear(); calls.clear()
decline_set[0] = True
y = p.run(ins)
second = {"sets": len(sets), "singles": len(calls), "errs": {k: close(y[k], ref[k]) for k in ref}}
decline[0] = True
y = p.run(ins)
unfused = sorted(k for k in ref if torch.equal(y[k], ref[k]))
print(json.dumps({"slot_sets": [p.slot_sets, apart.slot_sets, u.slot_sets], "fused": p.fused_slots, "members": members, "first": first, "second": second, "unfused": unfused}))
`) as {
      slot_sets: number[];
      fused: number;
      members: number[];
      first: { sets: { items: number; slots: number[]; shapes: number[][]; b_t: number[][] }[]; singles: number; errs: Record<string, number> };
      second: { sets: number; singles: number; errs: Record<string, number> };
      unfused: string[];
    };
    expect(out.fused).toBe(5);
    expect(out.slot_sets).toEqual([1, 0, 0]);
    expect(out.members).toEqual([3]);
    // q, k and v in one call (the engine's per-row slots, B as stored [S, R, out]); late and other alone
    expect(out.first.sets).toEqual([{ items: 3, slots: [1, 1, -1, -1, 2, 2], shapes: [[OUT, IN], [OUT, IN], [OUT, IN]], b_t: [[S, R, OUT], [S, R, OUT], [S, R, OUT]] }]);
    expect(out.first.singles).toBe(2);
    // declined: every member through lora_bank_linear, the same results
    expect(out.second.sets).toBe(1);
    expect(out.second.singles).toBe(5);
    // the set and every single kernel declining: exactly the unfused ops
    expect(out.unfused).toEqual(['k', 'late', 'other', 'q', 'v']);
    for (const errs of [out.first.errs, out.second.errs]) {
      expect(Object.keys(errs).sort()).toEqual(['k', 'late', 'other', 'q', 'v']);
      for (const [k, e] of Object.entries(errs)) expect(e, k).toBeLessThan(2e-2);
    }
  });

  it('gives no step to the kernel with STAGEML_TORCH_FUSE=0, nor under auto on a CPU device, nor to a loraBank op (whatever produced its base), nor in f32', () => {
    const out = runNativePython(`${PRELUDE}
path = ${JSON.stringify(slotGraph('gathered', false))}
other = ${JSON.stringify(plainBankGraph())}
f32 = ${JSON.stringify(slotGraph('gathered', false, { dtype: 'f32' }))}
print(json.dumps([prog(path, m).fused_slots for m in ("0", "auto", "1")] + [prog(other, "1").fused_slots, prog(f32, "1").fused_slots]))
`) as number[];
    expect(out).toEqual([0, 0, 1, 0, 0]);
  });
});
