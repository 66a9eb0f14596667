// Host side of lora_wgt (native/stageml_torch/tma.py's wgt section, lora_tma.cu) on CPU torch: the
// kernel cannot run here, but the symbol names it looks up in an nvcc cubin, the configuration
// checks (coded errors), the one-wave rule its grid-wide waits need, the K splits it re-picks per
// weight, the launch sizes, the fallback where no split fits one wave, and that without a GPU every
// entry point declines can.
import { expect, it } from 'vitest';

import { describeWithTorch, runNativePython } from './test-support.js';

const py = runNativePython;

describeWithTorch('lora_wgt host side (stageml_torch.tma)', () => {
  it('names instantiations as nvcc 13 mangles them (XB is a launch argument, not a template one)', () => {
    const out = py(`
import json
from stageml_torch import tma
cfgs = [("wgt", 64, 2, 1, 8, 12, 4), ("wgt", 256, 1, 8, 64, 5, 2, 1), ("wgt", 64, 2, 1, 8, 12, 4, 1)]
print(json.dumps({"m": [tma.wgt_mangled(c) for c in cfgs], "i": tma.wgt_explicit_instantiations(cfgs).strip().split("\\n")}))
`) as { m: string[]; i: string[] };
    // Read off the cubin bench/gpu/build_wgt.py built with nvcc 13.0.
    expect(out.m).toEqual([
      '_Z8lora_wgtILi64ELi2ELi1ELi8ELi12ELi4EEv4TMapS0_PKtS2_S2_PtPfS4_PiPKfiiiiii',
      '_Z8lora_wgtILi256ELi1ELi8ELi64ELi5ELi2EEv4TMapS0_PKtS2_S2_PtPfS4_PiPKfiiiiii',
      '_Z8lora_wgtILi64ELi2ELi1ELi8ELi12ELi4EEv4TMapS0_PKtS2_S2_PtPfS4_PiPKfiiiiii',
    ]);
    expect(out.i).toHaveLength(2);
    expect(out.i[0]).toMatch(/^template __global__ void lora_wgt<256,1,8,64,5,2>\(const __grid_constant__ TMap, /);
    expect(out.i[0]).toMatch(/int, int, int, int, int, int\);$/);
  });

  it('rejects malformed configurations with RT_BAD_VALUE naming the field', () => {
    const out = py(`
import json
from stageml_torch import tma
from stageml_torch.errors import WorkerError
bad = [("wgt", 32, 2, 1, 8, 12, 4), ("wgt", 64, 4, 1, 8, 12, 4), ("wgt", 64, 2, 3, 8, 12, 4), ("wgt", 64, 2, 8, 8, 12, 4),
       ("wgt", 64, 2, 1, 12, 12, 4), ("wgt", 64, 2, 1, 8, 1, 4), ("wgt", 64, 2, 1, 8, 12, 0), ("wgt", 64, 2, 1, 8, 12, 4, 2),
       ("wgt", 64, 2, 1, 8, 12), ("wgt", 64, 2, 1, 8, 12, True), ("wg", 64, 2, 8, 12, 0)]
res = []
for c in bad:
    try:
        tma.check_wgt(c)
        res.append(None)
    except WorkerError as e:
        res.append([e.code, e.message])
print(json.dumps({"bad": res, "ok": [list(tma.check_wgt(("wgt", 256, 1, 8, 64, 5, 2, 1))), list(tma.check_wgt(("wgt", 64, 2, 1, 8, 12, 4)))]}))
`) as { bad: ([string, string] | null)[]; ok: unknown[][] };
    expect(out.bad.every((r) => r !== null && r[0] === 'RT_BAD_VALUE')).toBe(true);
    const msgs = out.bad.map((r) => (r === null ? '' : r[1]));
    expect(msgs[0]).toMatch(/RT 64\/128\/256/);
    expect(msgs[1]).toMatch(/KS 1 or 2/);
    expect(msgs[2]).toMatch(/KG 1\/2\/4\/8/);
    expect(msgs[3]).toMatch(/RT \/ \(KS KG\) a multiple of 8/);
    expect(msgs[4]).toMatch(/MB in 8\/16\/32\/64/);
    expect(msgs[5]).toMatch(/ST in 2\.\.16/);
    expect(msgs[6]).toMatch(/TW in 1\.\.8/);
    expect(msgs[7]).toMatch(/XB 0 or 1/);
    expect(msgs[8]).toMatch(/must be \('wgt'/);
    expect(msgs[9]).toMatch(/must be \('wgt'/);
    expect(msgs[10]).toMatch(/must be \('wgt'/);
    expect(out.ok).toEqual([['wgt', 256, 1, 8, 64, 5, 2, 1], ['wgt', 64, 2, 1, 8, 12, 4]]);
  });

  it('launches one wave at most and re-picks KS and KG per weight (None where no split fits)', () => {
    const out = py(`
import json
from stageml_torch import tma
tma.SMS = 132
c = ("wgt", 64, 2, 1, 8, 12, 4, 1)
big = ("wgt", 128, 1, 4, 64, 8, 4, 1)
print(json.dumps({
  "adapt": [tma.wgt_adapt(c, 4096, 4096), tma.wgt_adapt(c, 1024, 4096), tma.wgt_adapt(c, 14336, 4096), tma.wgt_adapt(c, 4096, 14336),
            tma.wgt_adapt(big, 14336, 4096), tma.wgt_adapt(big, 4096, 4096), tma.wgt_adapt(c, 1000, 4096)],
  "blocks": [tma.wgt_blocks(("wgt", 64, 2, 1, 8, 12, 4), 4096), tma.wgt_blocks(("wgt", 64, 2, 4, 8, 12, 4), 1024), tma.wgt_blocks(big, 4096)],
  "max": [tma.wgt_max_blocks(1), tma.wgt_max_blocks(2)],
  "suits": [tma.wgt_suits(c, 1, 4096, 4096, 16), tma.wgt_suits(c, 9, 4096, 4096, 16), tma.wgt_suits(c, 1, 4096, 4096, 72),
            tma.wgt_suits(c, 1, 4096, 4096, 12), tma.wgt_suits(c, 1, 8192, 4096, 16), tma.wgt_suits(("wgt", 64, 1, 2, 8, 12, 4), 1, 4224, 4096, 16),
            tma.wgt_suits(("wgt", 64, 1, 2, 8, 12, 4), 1, 4288, 4096, 16), tma.wgt_suits(c, 1, 4096, 4032, 16)],
  "threads": [tma.wgt_threads(c), tma.wgt_threads(("wgt", 256, 1, 8, 64, 5, 2))],
  "kch": [tma.wgt_kch(1, 16, 4096, 128, 4), tma.wgt_kch(64, 16, 4096, 128, 4), tma.wgt_kch(64, 64, 4096, 128, 4), tma.wgt_kch(37, 32, 14336, 112, 2)],
}))
`) as { adapt: unknown[]; blocks: number[]; max: number[]; suits: boolean[]; threads: number[]; kch: number[] };
    expect(out.adapt).toEqual([
      ['wgt', 64, 2, 1, 8, 12, 4, 1], // 64 tiles x 2: 128 blocks (the cluster limit on 132 SMs)
      ['wgt', 64, 2, 4, 8, 12, 4, 1], // 16 tiles: K split 8 ways (2 in the cluster, 4 across)
      null, // 224 tiles of 64 rows: more than one wave whatever the split
      ['wgt', 64, 2, 1, 8, 12, 4, 1],
      ['wgt', 128, 1, 1, 64, 8, 4, 1], // 112 tiles of 128 rows, no split
      ['wgt', 128, 1, 4, 64, 8, 4, 1],
      null, // N not a multiple of RT
    ]);
    expect(out.blocks).toEqual([128, 128, 128]);
    expect(out.max).toEqual([132, 128]);
    // rows past MB, rank > 64 or not a multiple of 8, two waves, 132 single blocks, 134, K not split evenly
    expect(out.suits).toEqual([true, false, false, false, false, true, false, false]);
    expect(out.threads).toEqual([32 * 9, 32 * 19]);
    // t tasks (A group, x group, K chunk) within one per t warp of the grid
    expect(out.kch).toEqual([64, 64, 16, 16]);
  });

  it('sizes launches within the shared memory they were built for, never under ONE_PER_SM', () => {
    const out = py(`
import json
from stageml_torch import tma
sw = {str(m): [[list(c), tma.wgt_smem(c, tma.bucket(m), r)] for r in (16, 64) for c in tma.wgt_sweep(m, r)] for m in (1, 16, 32, 64)}
print(json.dumps({"sw": sw, "one": tma.ONE_PER_SM, "limit": 227 * 1024,
  "exact": [tma.wgt_smem(("wgt", 64, 2, 1, 8, 12, 4), 8, 16), tma.wgt_smem(("wgt", 256, 1, 8, 64, 5, 2), 64, 16), tma.wgt_smem(("wgt", 256, 1, 8, 64, 5, 2), 64, 64)],
  "fits": [tma.wgt_fits_registers(("wgt", 256, 1, 8, 64, 5, 2)), tma.wgt_fits_registers(("wgt", 256, 1, 8, 64, 5, 8))]}))
`) as { sw: Record<string, [unknown[], number][]>; one: number; limit: number; exact: number[]; fits: boolean[] };
    for (const rows of Object.values(out.sw)) {
      expect(rows.length).toBeGreaterThan(0);
      for (const [, bytes] of rows) {
        expect(bytes).toBeGreaterThanOrEqual(out.one);
        expect(bytes).toBeLessThanOrEqual(out.limit);
      }
    }
    // 12 stages of (64 W + 8 x rows) x 128 B = 108 KB: lifted to ONE_PER_SM
    expect(out.exact[0]).toBe(out.one);
    // 5 x 40 KB ring + 2 KB + B rows 32 x r bf16 + t 64 x r f32 + own part 32 x 65 f32
    expect(out.exact[1]).toBe(2048 + 5 * 320 * 128 + 32 * 16 * 2 + 64 * 16 * 4 + 32 * 65 * 4);
    expect(out.exact[2]).toBeGreaterThan(out.limit);
    expect(out.fits).toEqual([true, false]);
  });

  it('takes lora_wgt for ranks 49-64 at 1-8 and 17-32 rows, falls back where no split fits one wave, never for a bank, and declines without a GPU', () => {
    const out = py(`
import json, torch
from stageml_torch import stream as st, tma
x = torch.randn(3, 4096, dtype=torch.bfloat16)
w = torch.randn(4096, 4096, dtype=torch.bfloat16)
a = torch.randn(64, 4096, dtype=torch.bfloat16)
b = torch.randn(4096, 64, dtype=torch.bfloat16)
here = [st._pick(3, 4096, 4096, 64, False, None), st.lora_linear(x, w, a, b, 2.0) is None,
        st.lora_linear(x, w, a, b, 2.0, cfg=("wgt", 64, 2, 1, 8, 12, 4, 1)) is None, tma.available()]
table = [st.config_for(3, False, 64), st.config_for(3, False, 49), st.config_for(3, False, 48), st.config_for(3), st.config_for(9, False, 64),
         st.config_for(20, False, 64), st.config_for(20, False, 32), st.config_for(40, False, 64), st.config_for(3, True, 64)]
tma.SMS = 132
tma.available = lambda: True  # the pick as on an sm_90 host (nothing is launched)
pick = [st._pick(3, 4096, 4096, 64, False, None), st._pick(3, 1024, 4096, 56, False, None), st._pick(3, 14336, 4096, 64, False, None),
        st._pick(3, 4096, 4096, 16, False, None), st._pick(3, 4096, 4096, 64, True, None), st._pick(30, 4096, 4096, 64, False, None),
        st._pick(30, 14336, 4096, 64, False, None)]
tma._FAILED.add(("wgt", 64, 2, 1, 8, 12, 4, 1))
pick.append(st._pick(3, 4096, 4096, 64, False, None))
print(json.dumps({"here": here, "table": table, "pick": pick, "suits_bank": st._suits(("wgt", 64, 2, 1, 8, 12, 4, 1), 3, 4096, 4096, 16, True)}))
`) as { here: unknown[]; table: unknown[]; pick: unknown[]; suits_bank: boolean };
    // here: no sm_90 GPU, cupy or libcuda: nothing picked, every call declines
    expect(out.here).toEqual([null, true, true, false]);
    expect(out.table).toEqual([
      ['wgt', 64, 2, 1, 8, 12, 4, 1], // rank 64
      ['wgt', 64, 2, 1, 8, 12, 4, 1], // rank 49: A padded to 64 rows as well
      ['wg', 64, 2, 8, 12, 0], // rank 48: DEFAULT
      ['wg', 64, 2, 8, 12, 0], // rank not given
      ['tma', 64, 1, 2, 16, 12, 0, 1], // 9 rows: no high-rank entry
      ['wgt', 64, 2, 1, 32, 12, 4, 1], // 17-32 rows, rank 64
      ['tma', 64, 1, 2, 32, 12, 0, 1], // 17-32 rows, rank 32
      null, // 33-64 rows: the Triton kernel (no entry)
      [1, 1, 8, 1, 2, 0], // banks keep their own table
    ]);
    expect(out.pick).toEqual([
      ['wgt', 64, 2, 1, 8, 12, 4, 1],
      ['wgt', 64, 2, 4, 8, 12, 4, 1], // 16 row tiles: K split 8 ways (2 in the cluster, 4 across)
      ['wg', 64, 4, 8, 12, 0], // 224 row tiles: WGT_FALLBACK[8], its K split re-picked (tma.adapt) for 14336 rows
      ['wg', 64, 2, 8, 12, 0],
      [1, 1, 8, 1, 2, 0],
      ['wgt', 64, 2, 1, 32, 12, 4, 1],
      ['tma', 64, 1, 4, 32, 12, 0, 1], // WGT_FALLBACK[32] (it does not fit rank 64: lora_linear then declines)
      ['wg', 64, 2, 8, 12, 0], // a configuration that failed to build falls back too
    ]);
    expect(out.suits_bank).toBe(false);
  });
});
