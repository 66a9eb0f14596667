// The worker's KV appends in place (native/stageml_torch: ops.op_cached_attention,
// ops.append_in_place, worker.py Staged.tails): the `cachedAttention` op's handler writes the step's
// keys into the staged cache buffer's next position instead of copying the whole context. Checked
// on CPU torch against the op's decomposition (transpose + concat + attention: a copy), eagerly and
// through the emulated CUDA graphs, with rows of different lengths and a failing run.
import { GraphBuilder, expandComposites, graphToJson } from '@stageml/ir';
import { expect, it } from 'vitest';

import { describeWithTorch, runNativePython } from './test-support.js';

/**
 * Llama's attention over resident caches, shrunk: past keys and values [b, p, 2, 4] (rows,
 * positions, heads, dim) and the step's (gathered from tables by id, made head-major), one
 * `cachedAttention` with the key mask [b, p + 1], plus rows gathered by `qids` after it; the
 * step's keys and values are outputs. `decomposed`: the op replaced by its decomposition (what an executor
 * that does not run it receives).
 */
function attentionProgram(decomposed = false): string {
  const b = new GraphBuilder('attn');
  const ids = b.input('ids', ['i64', ['b', 1]]);
  const pk = b.input('past_key', ['f32', ['b', 'p', 2, 4]]);
  const pv = b.input('past_value', ['f32', ['b', 'p', 2, 4]]);
  const mask = b.reshape(b.input('attention_mask', ['f32', ['b', 'p + 1']]), ['b', 1, 1, -1]);
  const table = (name: string): ReturnType<GraphBuilder['param']> => b.param(name, ['f32', [10, 2, 4]]);
  const nk = b.gather(table('kt'), ids, 0);
  const nv = b.gather(table('vt'), ids, 0);
  const qt = table('qt');
  const q = b.transpose(b.gather(qt, ids, 0), [0, 2, 1, 3]);
  const out = b.cachedAttention(q, pk, pv, b.transpose(nk, [0, 2, 1, 3]), b.transpose(nv, [0, 2, 1, 3]), { causal: true }, mask);
  // After the attention, so that a bad query id fails a run whose keys already went in.
  b.output('out', b.add(out, b.transpose(b.gather(qt, b.input('qids', ['i64', ['b', 1]]), 0), [0, 2, 1, 3])));
  b.output('new_key', nk);
  b.output('new_value', nv);
  const g = b.build();
  return JSON.stringify(graphToJson(decomposed ? expandComposites(g, (op) => op === 'cachedAttention') : g));
}

const DRIVER = (doc: string): string => `
import json, os, torch
from stageml_torch import errors
from stageml_torch.worker import Worker
doc = json.loads(${JSON.stringify(doc)})
w = Worker("cpu")
g = torch.Generator().manual_seed(0)
params = {n: torch.randn((10, 2, 4), generator=g) for n in ("kt", "vt", "qt")}
rep = w.handle({"op": "prepare", "graph": doc}, params)[0]
h = rep["handle"]
MASKED = -3.4028234663852886e38
streams = [{"input": "past_key", "from": "new_key", "pad": 0}, {"input": "past_value", "from": "new_value", "pad": 0},
           {"input": "attention_mask", "from": None, "pad": MASKED}]
def step(ids, rows, seeds=None, qids=None):
    hdr = {"op": "run", "handle": h, "caches": {"streams": streams, "rows": [{"id": r, "append": [0, 1]} for r in rows]}}
    t = {"ids": torch.tensor(ids, dtype=torch.int64).reshape(len(rows), 1), "attention_mask": torch.zeros((len(rows), 1)),
         "qids": torch.tensor(qids or ids, dtype=torch.int64).reshape(len(rows), 1)}
    t.update(seeds or {})
    return w.handle(hdr, t)[1]
def pads_hold():
    # every position at or past a row's length holds the pad, in every staged stream
    st = w.staged
    for name in ("past_key", "past_value"):
        buf = st.buffers[name]
        for i, cid in enumerate(st.ids):
            if bool((buf[i, w.caches[cid].length:] != 0).any()):
                return False
    return True
# row 1 starts with 3 positions of its own, row 2 empty: the rows' lengths differ throughout
seeds = {"cache:1:past_key": torch.randn((3, 2, 4), generator=g), "cache:1:past_value": torch.randn((3, 2, 4), generator=g),
         "cache:1:attention_mask": torch.zeros((3,))}
res = {"cacheConcats": rep["cacheConcats"], "out": [], "pads": []}
for s, ids in enumerate(([1, 2], [3, 4], [5, 6], [7, 8], [9, 0])):
    o = step(ids, (1, 2), seeds if s == 0 else None)
    res["out"].append(o["out"].tolist())
    res["pads"].append(pads_hold())
tails = w.staged.tails
res["appends"] = sum(t.appends for t in tails.values())
res["tail_positions"] = [list(t.phys.shape) for t in tails.values()]
# a run that fails after its keys went in (a query id past the table): a coded error, the pad back
# in place, nothing appended, and the next step as if it had not happened
try:
    step([1, 1], (1, 2), qids=[99, 0])
    res["bad"] = None
except errors.WorkerError as e:
    res["bad"] = e.code
res["pads_after_bad"] = pads_hold()
res["lengths"] = [w.caches[1].length, w.caches[2].length]
res["after_bad"] = step([2, 3], (1, 2))["out"].tolist()
print(json.dumps(res))
`;

interface Result {
  cacheConcats: number;
  out: number[][][][][];
  pads: boolean[];
  appends: number;
  tail_positions: number[][];
  bad: string | null;
  pads_after_bad: boolean;
  lengths: number[];
  after_bad: number[][][][];
}

function maxDiff(a: unknown, b: unknown): number {
  if (Array.isArray(a) && Array.isArray(b)) {
    expect(a.length).toBe(b.length);
    return a.reduce<number>((m, x, i) => Math.max(m, maxDiff(x, b[i])), 0);
  }
  return Math.abs((a as number) - (b as number));
}

// A run that fails after the program (here the greedy reduction of `RunOptions.argmax`, made to
// raise) appends nothing: lengths, pads and key masks as before, and the next step equals that of
// a worker that never failed; eagerly and through the emulated CUDA graphs.
const FAIL_AFTER_RUN = (doc: string): string => `
import json, torch
from stageml_torch import ops
from stageml_torch.worker import Worker
doc = json.loads(${JSON.stringify(doc)})
MASKED = -3.4028234663852886e38
streams = [{"input": "past_key", "from": "new_key", "pad": 0}, {"input": "past_value", "from": "new_value", "pad": 0},
           {"input": "attention_mask", "from": None, "pad": MASKED}]
def make():
    w = Worker("cpu")
    g = torch.Generator().manual_seed(0)
    params = {n: torch.randn((10, 2, 4), generator=g) for n in ("kt", "vt", "qt")}
    h = w.handle({"op": "prepare", "graph": doc}, params)[0]["handle"]
    return w, h
def step(w, h, ids, argmax=False):
    hdr = {"op": "run", "handle": h, "caches": {"streams": streams, "rows": [{"id": r, "append": [0, 1]} for r in (1, 2)]}}
    if argmax:
        hdr["argmax"] = ["out"]
    t = {"ids": torch.tensor(ids, dtype=torch.int64).reshape(2, 1), "attention_mask": torch.zeros((2, 1)),
         "qids": torch.tensor(ids, dtype=torch.int64).reshape(2, 1)}
    return w.handle(hdr, t)[1]
def state(w):
    st = w.staged
    pads = all(not bool((st.buffers[n][i, w.caches[cid].length:] != 0).any()) for n in ("past_key", "past_value") for i, cid in enumerate(st.ids))
    masks = all(bool((st.buffers["attention_mask"][i, w.caches[cid].length:] == MASKED).all()) for i, cid in enumerate(st.ids))
    return {"pads": pads, "masks": masks, "lengths": [w.caches[1].length, w.caches[2].length]}
w, h = make()
ref, href = make()
for ids in ([1, 2], [3, 4], [5, 6], [7, 8]):
    step(w, h, ids)
    step(ref, href, ids)
res = {"graphs": dict(w.graphs.stats)}
orig_argmax = ops.argmax_rows
def boom(t):
    raise RuntimeError("injected after the run")
ops.argmax_rows = boom
try:
    step(w, h, [9, 9], argmax=True)
    res["failed"] = None
except RuntimeError as e:
    res["failed"] = str(e)
ops.argmax_rows = orig_argmax
res["after_failure"] = state(w)
res["next"] = step(w, h, [2, 3])["out"].tolist()
res["ref_next"] = step(ref, href, [2, 3])["out"].tolist()
res["final"] = state(w)
print(json.dumps(res))
`;

describeWithTorch('KV appends in place (stageml_torch.ops.append_in_place)', () => {
  for (const graphs of ['0', 'emulate']) {
    it(`appends nothing for a run that fails after the program (graphs ${graphs})`, () => {
      const out = runNativePython(FAIL_AFTER_RUN(attentionProgram()), { STAGEML_TORCH_GRAPHS: graphs }) as {
        graphs: { eager: number; captures: number; replays: number };
        failed: string | null;
        after_failure: { pads: boolean; masks: boolean; lengths: number[] };
        next: number[][][][];
        ref_next: number[][][][];
        final: { pads: boolean; masks: boolean; lengths: number[] };
      };
      if (graphs === 'emulate') expect(out.graphs).toMatchObject({ eager: 1, captures: 1, replays: 3 });
      expect(out.failed).toBe('injected after the run');
      expect(out.after_failure).toEqual({ pads: true, masks: true, lengths: [4, 4] });
      expect(maxDiff(out.next, out.ref_next)).toBe(0);
      expect(out.final).toEqual({ pads: true, masks: true, lengths: [5, 5] });
    }, 120_000);
  }

  for (const graphs of ['0', 'emulate']) {
    it(`appends the step's keys into the staged buffers, with the concat's results (graphs ${graphs})`, () => {
      const run = (decomposed: boolean): Result => runNativePython(DRIVER(attentionProgram(decomposed)), { STAGEML_TORCH_GRAPHS: graphs }) as Result;
      const fast = run(false);
      const plain = run(true);
      expect(fast.cacheConcats).toBe(2);
      expect(plain.cacheConcats).toBe(0);
      // The same attention over the same keys: equal up to the matmuls' reduction order.
      expect(maxDiff(fast.out, plain.out)).toBeLessThan(1e-6);
      expect(maxDiff(fast.after_bad, plain.after_bad)).toBeLessThan(1e-6);
      // Every step of both streams appended in place (emulated, the capture and every replay run
      // the program: step 2 counts twice), and one position past the capacity was allocated for
      // the steps at the capacity.
      expect(fast.appends).toBe(graphs === '0' ? 10 : 12);
      expect(plain.appends).toBe(0);
      expect(fast.tail_positions).toEqual([[2, 2, 65, 4], [2, 2, 65, 4]]);
      // Past each row's length the pad, after every step and after the failed one.
      expect(fast.pads).toEqual([true, true, true, true, true]);
      expect(fast.bad).toBe('RT_EVAL_FAILED');
      expect(fast.pads_after_bad).toBe(true);
      expect(fast.lengths).toEqual([8, 5]);
    }, 120_000);
  }
});
