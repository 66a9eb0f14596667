// Host side of the TMA-ring fused base + LoRA kernel (native/stageml_torch/tma.py, lora_tma.cu) on
// CPU torch: the kernel cannot run here, but the symbol names it looks up in an nvcc cubin, the
// configuration checks (coded errors), the shape rules, the K split it re-picks per weight, the
// launch geometry, the driver-call failure path and the rule that the bank path is never
// dispatched can, and without a GPU every entry point must decline (return None).
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';

import { describeWithTorch, runNativePython } from './test-support.js';

const py = runNativePython;

describeWithTorch('TMA-ring kernel host side (stageml_torch.tma)', () => {
  it('names instantiations as nvcc 13 mangles them (FA, WR and PRE in the template)', () => {
    const out = py(`
import json
from stageml_torch import tma
pairs = [(("tma", 64, 1, 2, 8, 12, 0, 1), 16, 0), (("tma", 64, 2, 2, 32, 3, 64), 0, 0), (("tma", 256, 1, 8, 16, 4, 0, 2), 16, 0), (("tma", 64, 1, 2, 8, 12, 0, 1), 16, 1)]
print(json.dumps({"m": [tma.mangled(*p) for p in pairs], "i": tma.explicit_instantiations(pairs + [pairs[0][:2]]).strip().split("\\n")}))
`) as { m: string[]; i: string[] };
    // Read off the cubins bench/gpu/build_tma.py built (strings lora_tma_*.cubin).
    expect(out.m).toEqual([
      '_Z8lora_tmaILi64ELi1ELi2ELi8ELi12ELi16ELi1ELi0EEv4TMapS0_S0_PKtS2_S2_S2_PtPfPiPKiS7_PKfiiiiiiiii',
      '_Z8lora_tmaILi64ELi2ELi2ELi32ELi3ELi0ELi1ELi0EEv4TMapS0_S0_PKtS2_S2_S2_PtPfPiPKiS7_PKfiiiiiiiii',
      '_Z8lora_tmaILi256ELi1ELi8ELi16ELi4ELi16ELi2ELi0EEv4TMapS0_S0_PKtS2_S2_S2_PtPfPiPKiS7_PKfiiiiiiiii',
      '_Z8lora_tmaILi64ELi1ELi2ELi8ELi12ELi16ELi1ELi1EEv4TMapS0_S0_PKtS2_S2_S2_PtPfPiPKiS7_PKfiiiiiiiii',
    ]);
    // (cfg, FA) and (cfg, FA, 0) name one instantiation.
    expect(out.i).toHaveLength(4);
    expect(out.i[0]).toMatch(/^template __global__ void lora_tma<256,1,8,16,4,16,2,0>\(const __grid_constant__ TMap, /);
  });

  it('rejects malformed configurations with RT_BAD_VALUE naming the field', () => {
    const out = py(`
import json
from stageml_torch import tma
from stageml_torch.errors import WorkerError
bad = [("tma", 48, 1, 2, 8, 12, 0), ("tma", 64, 1, 3, 8, 12, 0), ("tma", 64, 1, 2, 12, 12, 0), ("tma", 64, 1, 2, 8, 1, 0),
       ("tma", 64, 1, 2, 8, 12, -1), ("tma", 64, 1, 2, 8, 12, 0, 3), ("tma", 256, 2, 8, 8, 4, 0, 1), ("tma", 64, 1, 2, 8), ("tma", 64, 1, 2, 8, 12, "0")]
res = []
for c in bad:
    try:
        tma.check_cfg(c)
        res.append(None)
    except WorkerError as e:
        res.append([e.code, e.message])
print(json.dumps({"bad": res, "ok": list(tma.check_cfg(("tma", 64, 1, 2, 8, 12, 0, 1)))}))
`) as { bad: ([string, string] | null)[]; ok: unknown[] };
    expect(out.bad.every((r) => r !== null && r[0] === 'RT_BAD_VALUE')).toBe(true);
    const msgs = out.bad.map((r) => (r === null ? '' : r[1]));
    expect(msgs[0]).toMatch(/RT in 16\.\.256/);
    expect(msgs[1]).toMatch(/KS in 1\/2\/4\/8|BPS and KS/);
    expect(msgs[2]).toMatch(/MB a multiple of 8/);
    expect(msgs[3]).toMatch(/ST in 2\.\.12/);
    expect(msgs[4]).toMatch(/PB >= 0/);
    expect(msgs[5]).toMatch(/WR in 1\/2\/4/);
    expect(msgs[6]).toMatch(/at most 16 W warps/);
    expect(msgs[7]).toMatch(/must be \('tma'/);
    expect(msgs[8]).toMatch(/with integers/);
    expect(out.ok).toEqual(['tma', 64, 1, 2, 8, 12, 0, 1]);
  });

  it('tiles only shapes it covers exactly and re-picks the K split per weight', () => {
    const out = py(`
import json
from stageml_torch import tma
c = ("tma", 64, 1, 2, 8, 12, 0, 1)
print(json.dumps({
  "suits": [tma.suits(c, 1, 4096, 4096, 16, False), tma.suits(c, 8, 4096, 14336, 16, False), tma.suits(c, 9, 4096, 4096, 16, False),
            tma.suits(c, 1, 4100, 4096, 16, False), tma.suits(c, 1, 4096, 4000, 16, False), tma.suits(c, 1, 4096, 4096, 12, False),
            tma.suits(("tma", 128, 1, 4, 64, 12, 0, 1), 64, 4096, 4096, 16, False)],
  "adapt": [tma.adapt(c, 4096, 4096), tma.adapt(c, 1024, 4096), tma.adapt(c, 14336, 4096), tma.adapt(c, 4096, 14336), tma.adapt(c, 4000, 4096)],
  "fa": [tma.fused_rows(8, False), tma.fused_rows(16, False), tma.fused_rows(40, False), tma.fused_rows(64, False), tma.fused_rows(128, False), tma.fused_rows(16, True)],
  "regs": [tma.fits_registers(("tma", 64, 1, 2, 256, 4, 0, 1), 0), tma.fits_registers(("tma", 128, 1, 4, 256, 4, 0, 1), 0),
           tma.fits_registers(("tma", 256, 1, 8, 128, 3, 0, 1), 0), tma.fits_registers(("tma", 128, 2, 4, 64, 4, 0, 1), 16)],
}))
`) as { suits: boolean[]; adapt: unknown[]; fa: number[]; regs: boolean[] };
    // 9 rows exceed MB 8; N not a multiple of RT, K not of KS·64, a rank not a multiple of 8; 12
    // stages of (128 + 16 + 64) rows · 128 bytes exceed the 227 KB of shared memory.
    expect(out.suits).toEqual([true, true, false, false, false, false, false]);
    // One block per SM on 132 SMs, the smallest KS with the best wave efficiency: 64 row tiles · 2 =
    // 128 blocks at N = 4096, 16 · 8 at N = 1024, 224 · 4 = 896 (97% of 7 waves) at N = 14336; none
    // when N % RT != 0.
    expect(out.adapt).toEqual([
      ['tma', 64, 1, 2, 8, 12, 0, 1],
      ['tma', 64, 1, 8, 8, 12, 0, 1],
      ['tma', 64, 1, 4, 8, 12, 0, 1],
      ['tma', 64, 1, 2, 8, 12, 0, 1],
      null,
    ]);
    expect(out.fa).toEqual([16, 16, 48, 64, 0, 0]);
    expect(out.regs).toEqual([true, false, false, true]);
  });

  it('sizes a launch: no producers for one adapter, producer blocks and K chunks for a bank', () => {
    const out = py(`
import json
from stageml_torch import tma
one = tma.geometry(("tma", 64, 1, 2, 8, 12, 0, 1), 1, 4096, 4096, 16, 8, False)
bank = tma.geometry(("tma", 64, 2, 2, 32, 3, 64, 1), 32, 4096, 4096, 16, 1, True)
auto = tma.geometry(("tma", 64, 1, 2, 8, 8, 0, 1), 1, 4096, 4096, 64, 1, True)
print(json.dumps({"one": one, "bank": bank, "auto": auto, "chunks": [tma.producer_chunks(32, 1, 4096, 512), tma.producer_chunks(1, 1, 4096, 16), tma.producer_chunks(64, 4, 14336, 512)]}))
`) as { one: number[]; bank: number[]; auto: number[]; chunks: number[] };
    // (fa, pieces, kch, n_prod, n_cons, threads, smem): 4 W warps + 1 A warp + the issuing warp;
    // 12 stages of (64 + 16 + 8) rows · 128 bytes plus barriers and alignment slack.
    expect(out.one).toEqual([16, 0, 1, 0, 128, 192, 12 * 88 * 128 + 2048]);
    // The bank ring needs 3 · 2 · (64 + 32) · 128 + 2048 bytes; ONE_PER_SM raises it to 115 KB (one block per SM).
    expect(out.bank).toEqual([0, 32, 32, 64, 128, 288, 115 * 1024]);
    // PB 0: the SMs 128 consumer blocks leave free (4).
    expect(out.auto.slice(0, 5)).toEqual([0, 1, 8, 4, 128]);
    expect(out.chunks).toEqual([32, 32, 4]);
  });

  it('never dispatches the bank path, not even from STAGEML_STREAM_CONFIGS, and declines without a GPU', () => {
    const dir = mkdtempSync(join(tmpdir(), 'tma-cfg-'));
    const file = join(dir, 'cfg.json');
    writeFileSync(file, JSON.stringify({ bank: { '32': ['tma', 64, 2, 2, 32, 3, 64, 1] }, single: { '64': ['tma', 64, 1, 2, 64, 8, 0, 1] } }));
    const out = py(`
import json, torch
from stageml_torch import stream as st, tma
x = torch.randn(2, 4096, dtype=torch.bfloat16)
w = torch.randn(4096, 4096, dtype=torch.bfloat16)
a = torch.randn(16, 4096, dtype=torch.bfloat16)
b = torch.randn(4096, 16, dtype=torch.bfloat16)
print(json.dumps({
  "tables": [st.config_for(32, bank=True), st.config_for(64)],
  "pick": [st._pick(32, 4096, 4096, 16, True, None), st._pick(64, 4096, 4096, 16, False, None)],
  "shippable": [tma.shippable(("tma", 64, 2, 2, 32, 3, 64, 1), True), tma.shippable(("tma", 64, 1, 2, 8, 12, 0, 1), False)],
  "available": tma.available(),
  "declined": [st.lora_linear(x, w, a, b, 2.0) is None, st.lora_linear(x, w, a, b, 2.0, cfg=("tma", 64, 1, 2, 8, 12, 0, 1)) is None],
}))
`, { STAGEML_STREAM_CONFIGS: file }) as { tables: unknown[]; pick: unknown[]; shippable: boolean[]; available: boolean; declined: boolean[] };
    expect(out.tables).toEqual([['tma', 64, 2, 2, 32, 3, 64, 1], ['tma', 64, 1, 2, 64, 8, 0, 1]]);
    // The override's bank entry is dropped; the single one would be taken where the family runs (not here).
    expect(out.pick).toEqual([null, null]);
    expect(out.shippable).toEqual([false, true]);
    expect(out.available).toBe(false);
    expect(out.declined).toEqual([true, true]);
  });

  it('pre-tiles W into the swizzled tiles the copy engine would write, and rejects shapes that do not tile', () => {
    const out = py(`
import json, torch
from stageml_torch import tma
from stageml_torch.errors import WorkerError
torch.manual_seed(0)
w = torch.randn(128, 256).to(torch.bfloat16)
t = tma.pretile(w, 64)
ok = True
for nb in range(2):
    for kb in range(4):
        for r in range(64):
            for p in range(8):
                ok = ok and bool(torch.equal(t[nb, kb, r, p], w[nb * 64 + r, kb * 64 + (p ^ (r % 8)) * 8:kb * 64 + (p ^ (r % 8)) * 8 + 8]))
try:
    tma.pretile(torch.zeros(100, 256, dtype=torch.bfloat16), 64)
    bad = None
except WorkerError as e:
    bad = e.code
print(json.dumps({"shape": list(t.shape), "contiguous": t.is_contiguous(), "ok": ok, "bad": bad}))
`) as { shape: number[]; contiguous: boolean; ok: boolean; bad: string | null };
    expect(out).toEqual({ shape: [2, 4, 64, 8, 8], contiguous: true, ok: true, bad: 'RT_BAD_VALUE' });
  });

  it('names the wgmma ring, shrink and expand kernels as nvcc 13 mangles them, and validates their configurations', () => {
    const out = py(`
import json
from stageml_torch import tma
from stageml_torch.errors import WorkerError
bad = [("wg", 96, 2, 64, 10, 0), ("wg", 64, 3, 64, 10, 0), ("wg", 64, 2, 48, 10, 0), ("wg", 64, 2, 64, 1, 0), ("wg", 64, 2, 64, 10, 9),
       ("wg", 64, 2, 64, 10), ("wg", 64, 2, 64, 10, True), ("wg", 64, 2, 64, 10, 0, 2), ("sx", 16, 256), ("sx", 32, 64), ("sx", 32), ("sx", 32, 128, 2), ("sx", 32, 128, 1, 4), ("sx", 32, 128, 1, 1, 0), ("sx", 32, 128, 0, 3)]
res = []
for c in bad:
    try:
        (tma.check_sx if c[0] == "sx" else tma.check_wg)(c)
        res.append(None)
    except WorkerError as e:
        res.append([e.code, e.message])
print(json.dumps({
  "m": [tma.wg_mangled(("wg", 64, 2, 64, 10, 0), 16), tma.wg_mangled(("wg", 64, 2, 64, 8, 4), 64), tma.wg_mangled(("wg", 64, 2, 8, 12, 0, 1), 16), tma.SHRINK_MANGLED,
        *tma.set_mangled(32, 8)],
  "ev": [tma.sx_ev(("sx", 32, 128)), tma.sx_ev(("sx", 32, 128, 1)), tma.sx_ev(("sx", 32, 128, 1, 1)), list(tma.check_sx(("sx", 8, 128, 0, 1))),
         list(tma.check_sx(("sx", 32, 128, 0, 2))), list(tma.check_sx(("sx", 32, 128, 1, 3)))],
  "inst": tma.wg_explicit_instantiations([(("wg", 64, 2, 8, 12, 0), 16), (("wg", 64, 2, 8, 12, 0), 8), (("wg", 64, 2, 64, 8, 4), 64)]).strip().split("\\n"),
  "fa": [tma.wg_fa(("wg", 64, 2, 8, 12, 0), r) for r in (8, 16, 40, 64)] + [tma.wg_fa(("wg", 64, 2, 8, 12, 4), 64)],
  "bad": res,
}))
`) as { m: string[]; ev: unknown[]; inst: string[]; fa: number[]; bad: ([string, string] | null)[] };
    // Read off nvcc 13.0's -Xptxas -v report for these instantiations (bench/gpu/build_wg.py).
    expect(out.m).toEqual([
      '_Z7lora_wgILi64ELi2ELi64ELi10ELi16ELi0ELi0EEv4TMapS0_S0_PKtS2_PKfPtPKiS7_S4_iiii',
      '_Z7lora_wgILi64ELi2ELi64ELi8ELi0ELi4ELi0EEv4TMapS0_S0_PKtS2_PKfPtPKiS7_S4_iiii',
      '_Z7lora_wgILi64ELi2ELi8ELi12ELi16ELi0ELi1EEv4TMapS0_S0_PKtS2_PKfPtPKiS7_S4_iiii',
      '_Z11lora_shrinkILi32EEvPKtS1_PfPKiS4_iii',
      '_Z15lora_shrink_setILi32EEvPKtPKi7BankSetii',
      '_Z16lora_expand4_setILi8EEvPKi7BankSetii',
      '_Z12lora_add_setPKi7BankSeti',
    ]);
    // EV (5th element): lora_expand (0, the default), lora_expand2 (1), lora_expand3 (2), or
    // lora_expand3 into a buffer on the side stream (3, only with SIDE 1)
    expect(out.ev).toEqual([0, 0, 1, ['sx', 8, 128, 0, 1], ['sx', 32, 128, 0, 2], ['sx', 32, 128, 1, 3]]);
    // Rank 8 and 16 share FA 16 (one instantiation); the shrink and its BankSet form (KW 8, 32) and both
    // expands (NB 128, 256) once each, lora_expand3 in both modes, lora_expand4 for every factor-row count
    // per warp in both modes and its BankSet form.
    expect(out.inst).toHaveLength(2 + 4 + 4 + 2 + 15);
    expect(out.inst[0]).toMatch(/^template __global__ void lora_wg<64,2,64,8,0,4,0>\(const __grid_constant__ TMap, /);
    expect(out.inst[1]).toMatch(/^template __global__ void lora_wg<64,2,8,12,16,0,0>\(/);
    expect(out.inst.slice(2)).toEqual([
      expect.stringMatching(/^template __global__ void lora_shrink<8>\(/),
      expect.stringMatching(/^template __global__ void lora_shrink_set<8>\(const bf16_t\*, const int\*, BankSet, int, int\)/),
      expect.stringMatching(/^template __global__ void lora_shrink<32>\(/),
      expect.stringMatching(/^template __global__ void lora_shrink_set<32>\(/),
      expect.stringMatching(/^template __global__ void lora_expand<128>\(/),
      expect.stringMatching(/^template __global__ void lora_expand2<128>\(/),
      expect.stringMatching(/^template __global__ void lora_expand<256>\(/),
      expect.stringMatching(/^template __global__ void lora_expand2<256>\(/),
      expect.stringMatching(/^template __global__ void lora_expand3<256,8,0>\(const float\*, const bf16_t\*, bf16_t\*, float\*, /),
      expect.stringMatching(/^template __global__ void lora_expand3<256,8,1>\(/),
      ...[1, 2, 4, 8, 16].flatMap((lw) => [
        ...[0, 1].map((mode) => expect.stringMatching(new RegExp(`^template __global__ void lora_expand4<${String(lw)},${String(mode)}>\\(const float\\*, `))),
        expect.stringMatching(new RegExp(`^template __global__ void lora_expand4_set<${String(lw)}>\\(const int\\*, BankSet, int, int\\)`)),
      ]),
    ]);
    expect(out.fa).toEqual([16, 16, 48, 64, 0]);
    expect(out.bad.every((r) => r !== null && r[0] === 'RT_BAD_VALUE')).toBe(true);
    const msgs = out.bad.map((r) => (r === null ? '' : r[1]));
    expect(msgs[0]).toMatch(/RT 64 or 128/);
    expect(msgs[1]).toMatch(/KS in 1\/2\/4\/8/);
    expect(msgs[2]).toMatch(/MB in 8\/16\/32\/64\/128/);
    expect(msgs[3]).toMatch(/ST in 2\.\.16/);
    expect(msgs[4]).toMatch(/EW in 0\.\.8/);
    expect(msgs[5]).toMatch(/must be \('wg'/);
    expect(msgs[6]).toMatch(/with integers/);
    expect(msgs[7]).toMatch(/XL 0 or 1/);
    expect(msgs[8]).toMatch(/KW in \(8, 32\)/);
    expect(msgs[9]).toMatch(/NB in \(128, 256\)/);
    expect(msgs[10]).toMatch(/must be \('sx', KW, NB\[, SIDE\[, EV\]\]\)/);
    expect(msgs[11]).toMatch(/SIDE 0 or 1, EV 0-3 \(3 with SIDE 1\)/);
    expect(msgs[12]).toMatch(/SIDE 0 or 1, EV 0-3/);
    expect(msgs[13]).toMatch(/must be \('sx'/);
    expect(msgs[14]).toMatch(/3 with SIDE 1/);
  });

  it('sizes lora_expand3/4 launches and names the expands and lora_add as nvcc 13 mangles them', () => {
    const out = py(`
import json
from stageml_torch import tma
print(json.dumps({
  "lw": [tma.expand4_lw(r) for r in (8, 16, 24, 64, 128)],
  "grid": [list(tma.expand3_grid(4096, 64, 64)), list(tma.expand3_grid(14336, 3, 16)), list(tma.expand3_grid(100, 1, 8))],
  "m": [tma.expand3_mangled(0), tma.expand3_mangled(1), tma.expand4_mangled(8, 0), tma.expand4_mangled(16, 1), tma.ADD_MANGLED],
}))
`) as { lw: number[]; grid: number[][]; m: string[] };
    // lora_expand4: factor rows per warp for the widest rank (8 warps, ranks to 128).
    expect(out.lw).toEqual([1, 2, 4, 8, 16]);
    // lora_expand3: 8 loads of 256 threads per block, 256 / lanes columns per load.
    expect(out.grid).toEqual([[16, 64, 1], [14, 3, 1], [1, 1, 1]]);
    // Read off nvcc 13.0's -Xptxas -v report (sm_90a).
    expect(out.m).toEqual([
      '_Z12lora_expand3ILi256ELi8ELi0EEvPKfPKtPtPfPKiS7_S1_iiii',
      '_Z12lora_expand3ILi256ELi8ELi1EEvPKfPKtPtPfPKiS7_S1_iiii',
      '_Z12lora_expand4ILi8ELi0EEvPKfPKtPtPfPKiS7_S1_iiii',
      '_Z12lora_expand4ILi16ELi1EEvPKfPKtPtPfPKiS7_S1_iiii',
      '_Z8lora_addPtPKfPKiii',
    ]);
  });

  it('sizes wgmma-ring launches within the shared memory and registers it was built spill-free for', () => {
    const out = py(`
import json
from stageml_torch import tma, stream as st
one = ("wg", 64, 2, 64, 10, 0)
bank = ("wg", 64, 2, 64, 10, 4)
print(json.dumps({
  "smem": [tma.wg_smem(("wg", 64, 2, 8, 12, 0), 1, 16), tma.wg_smem(one, 64, 16), tma.wg_smem(bank, 64, 64)],
  "threads": [tma.wg_threads(one), tma.wg_threads(bank), tma.wg_threads(("wg", 128, 4, 64, 8, 0))],
  "regs": [tma.wg_fits_registers(one), tma.wg_fits_registers(("wg", 128, 4, 128, 5, 4)), tma.wg_fits_registers(("wg", 64, 2, 128, 7, 6))],
  "suits": [tma.wg_suits(one, 64, 4096, 4096, 16, False), tma.wg_suits(one, 65, 4096, 4096, 16, False), tma.wg_suits(one, 64, 4096, 4096, 16, True),
            tma.wg_suits(one, 64, 4096, 4096, 128, False), tma.wg_suits(("wg", 64, 2, 64, 12, 0), 64, 4096, 4096, 16, False),
            tma.wg_suits(bank, 64, 4096, 4096, 64, True), tma.wg_suits(bank, 64, 4096, 4096 + 1024, 64, True), tma.wg_suits(one, 64, 4000, 4096, 16, False)],
  "adapt": [tma.wg_adapt(one, 4096, 4096), tma.wg_adapt(one, 1024, 4096), tma.wg_adapt(one, 14336, 4096), tma.wg_adapt(one, 4000, 4096)],
  "sweep": [len(tma.wg_sweep(m)) for m in (1, 64, 128, 256)],
  "sx": [tma.sx_suits(("sx", 32, 128), 128, 4096, 4096, 16), tma.sx_suits(("sx", 32, 128), 64, 4096, 14336, 64), tma.sx_suits(("sx", 32, 128), 257, 4096, 4096, 16),
         tma.sx_suits(("sx", 32, 128), 64, 4096, 4096 + 1024, 16), tma.sx_suits(("sx", 8, 128), 64, 4096, 4096 + 512, 16), tma.sx_suits(("sx", 32, 128), 8, 4096, 4096, 12)],
  "tables_valid": all((tma.check_wg(c) if tma.is_wg(c) else tma.check_sx(c)) for t in (st.DEFAULT, st.DEFAULT_BANK) for c in t.values() if tma.is_wg(c) or tma.is_sx(c)),
}))
`) as { smem: number[]; threads: number[]; regs: boolean[]; suits: boolean[]; adapt: unknown[]; sweep: number[]; sx: boolean[]; tables_valid: boolean };
    // One adapter at 64 rows: 10 stages of (64 + 16 + 64) rows · 128 bytes + 8 KB over-read slack,
    // 2 KB barriers/alignment, then the B tile (32 rows · 16 bf16) and t (rows · 16 f32).
    expect(out.smem[0]).toBe(2048 + 12 * 88 * 128 + 8192 + 1024 + 1 * 16 * 4);
    expect(out.smem[1]).toBe(2048 + 10 * 144 * 128 + 8192 + 1024 + 64 * 16 * 4);
    // Bank: t (64 · 64 f32), the expand sums (64 · 32 f32) and 65 row offsets after the ring.
    expect(out.smem[2]).toBe(2048 + 10 * 128 * 128 + 64 * 64 * 4 + 64 * 32 * 4 + 65 * 4);
    // One warpgroup per 64 W rows, the expand warps, the issuing warp.
    expect(out.threads).toEqual([160, 288, 288]);
    expect(out.regs).toEqual([true, false, true]);
    // 65 rows exceed MB; the bank flag must match EW; rank 128 exceeds one adapter's FA ≤ 64; 12
    // stages exceed 227 KB; banks need K a multiple of the shrink's 32 warps · 64; N a multiple of RT.
    expect(out.suits).toEqual([true, false, false, false, false, true, false, false]);
    expect(out.adapt).toEqual([['wg', 64, 2, 64, 10, 0], ['wg', 64, 8, 64, 10, 0], ['wg', 64, 4, 64, 10, 0], null]);
    expect(out.sweep).toEqual([6, 6, 3, 0]);
    expect(out.sx).toEqual([true, true, false, false, true, false]);
    expect(out.tables_valid).toBe(true);
  });

  it('dispatches the wgmma ring and the shrink/expand path only where the family runs, and declines here', () => {
    const out = py(`
import json, torch
from stageml_torch import stream as st, tma
x = torch.randn(100, 4096, dtype=torch.bfloat16)
w = torch.randn(4096, 4096, dtype=torch.bfloat16)
a = torch.randn(16, 4096, dtype=torch.bfloat16)
b = torch.randn(4096, 16, dtype=torch.bfloat16)
ab = torch.randn(4, 16, 4096, dtype=torch.bfloat16)
bb = torch.randn(4, 4096, 16, dtype=torch.bfloat16)
slots = torch.zeros(40, dtype=torch.int32)
ranks = torch.full((4,), 16, dtype=torch.int32)
scales = torch.ones(4)
print(json.dumps({
  "pick": [st._pick(1, 4096, 4096, 16, False, None), st._pick(100, 4096, 4096, 16, False, None), st._pick(40, 4096, 4096, 16, True, None)],
  "declined": [st.lora_linear(x[:1], w, a, b, 2.0) is None, st.lora_linear(x, w, a, b, 2.0) is None, st.lora_linear(x, w, a, b, 2.0, cfg=("sx", 32, 128)) is None,
               st.lora_bank_linear(x[:40], w, ab, bb, slots, ranks, scales) is None],
}))
`) as { pick: unknown[]; declined: boolean[] };
    // No sm_90 GPU / cupy here: the wg and sx entries are not picked and every call declines.
    expect(out.pick).toEqual([null, null, null]);
    expect(out.declined).toEqual([true, true, true, true]);
  });

  it('reports a failed driver call as RT_EVAL_FAILED naming it', () => {
    const out = py(`
import json
from stageml_torch import tma
from stageml_torch.errors import WorkerError
tma._LIB[0] = False  # as on a host without libcuda.so.1
try:
    tma.encode_2d(0, 4096, 4096, 8192, 64, 64)
    r = None
except WorkerError as e:
    r = [e.code, e.message]
print(json.dumps(r))
`) as [string, string];
    expect(out[0]).toBe('RT_EVAL_FAILED');
    expect(out[1]).toMatch(/libcuda\.so\.1 not loadable/);
  });
});
