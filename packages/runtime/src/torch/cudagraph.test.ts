// The worker's CUDA graphs of decode steps (native/stageml_torch/cudagraph.py) on CPU torch, with
// STAGEML_TORCH_GRAPHS=emulate (the same bookkeeping, replays run eagerly on the captured feed):
// captured on the second step of a key, replayed after; index inputs range-checked on the host
// before a replay (a bad one is a coded error and the next step works); a failing capture leaves
// the program eager; a disposed program drops its graphs; at most LIMIT graphs are kept.
import { GraphBuilder, graphToJson } from '@stageml/ir';
import { expect, it } from 'vitest';

import { describeWithTorch, runNativePython } from './test-support.js';

/** new = table[ids] [b, 1, 2], y = concat(past, new) [b, p + 1, 2]; past is a cache stream fed from new; the table a parameter or an input. */
function program(table_: 'param' | 'input' = 'param'): string {
  const b = new GraphBuilder('step');
  const ids = b.input('ids', ['i64', ['b', 1]]);
  const past = b.input('past', ['f32', ['b', 'p', 2]]);
  const table = table_ === 'param' ? b.param('table', ['f32', [10, 2]]) : b.input('table', ['f32', [10, 2]]);
  const fresh = b.gather(table, ids, 0);
  b.output('new', fresh);
  b.output('y', b.concat([past, fresh], 1));
  return JSON.stringify(graphToJson(b.build()));
}

/** Keys [b, p, 2, 3] (heads × dim) as a cache stream: new = k[ids] [b, 1, 2, 3], y = transpose(concat(past, new)) heads-first. */
function keysProgram(): string {
  const b = new GraphBuilder('keys');
  const ids = b.input('ids', ['i64', ['b', 1]]);
  const past = b.input('past', ['f32', ['b', 'p', 2, 3]]);
  const table = b.param('table', ['f32', [10, 2, 3]]);
  const fresh = b.gather(table, ids, 0);
  b.output('new', fresh);
  b.output('y', b.transpose(b.concat([past, fresh], 1), [0, 2, 1, 3]));
  return JSON.stringify(graphToJson(b.build()));
}

describeWithTorch('CUDA graphs of decode steps (stageml_torch.cudagraph, emulated on the CPU)', () => {
  it('stages [rows, positions, heads, dim] streams heads-first: at the capacity the heads-first view is the storage itself, less its tail position', () => {
    const out = runNativePython(
      `
import json, torch
from stageml_torch.worker import Worker
doc = json.loads(${JSON.stringify(keysProgram())})
w = Worker("cpu")
table = torch.arange(60, dtype=torch.float32).reshape(10, 2, 3)
h = w.handle({"op": "prepare", "graph": doc}, {"table": table})[0]["handle"]
streams = [{"input": "past", "from": "new", "pad": 0}]
ys = []
for ids in ([1, 2], [3, 4], [5, 6]):
    hdr = {"op": "run", "handle": h, "caches": {"streams": streams, "rows": [{"id": 1, "append": [0, 1]}, {"id": 2, "append": [0, 1]}]}}
    ys.append(w.handle(hdr, {"ids": torch.tensor(ids).reshape(2, 1)})[1]["y"])
buf = w.staged.buffers["past"]
phys = w.staged.tails["past"].phys
print(json.dumps({"logical": list(buf.shape), "phys": list(phys.shape), "heads_first": buf.permute(0, 2, 1, 3).data_ptr() == phys.data_ptr() and phys.is_contiguous(),
                  "row0_head1": ys[-1][0, 1, :3].tolist(), "row0_head1_new": ys[-1][0, 1, 64].tolist(), "row1_cache": w.caches[2].view("past")[:, 0, 0].tolist(), "y": list(ys[-1].shape)}))
`,
      { STAGEML_TORCH_GRAPHS: 'emulate' },
    ) as { logical: number[]; phys: number[]; heads_first: boolean; row0_head1: number[][]; row0_head1_new: number[]; row1_cache: number[]; y: number[] };
    expect(out.logical).toEqual([2, 64, 2, 3]);
    // Stored heads-first, one position past the capacity (where a step at the capacity appends its
    // keys in place; kv-append.test.ts).
    expect(out.phys).toEqual([2, 2, 65, 3]);
    expect(out.heads_first).toBe(true);
    // Row 0 took ids 1, 3, 5 (table[i][1] = [6i + 3, 6i + 4, 6i + 5]): the cache holds 1 and 3 at
    // positions 0-1 of head 1, the pad after them up to the capacity, the step's own key last.
    expect(out.row0_head1).toEqual([[9, 10, 11], [21, 22, 23], [0, 0, 0]]);
    expect(out.row0_head1_new).toEqual([33, 34, 35]);
    expect(out.row1_cache).toEqual([12, 24, 36]);
    expect(out.y).toEqual([2, 2, 65, 3]);
  }, 60_000);

  it('captures on the second step, replays with fresh inputs, checks indices on the host, falls back when capture fails', () => {
    const out = runNativePython(
      `
import json, torch
from stageml_torch import cudagraph, errors
from stageml_torch.worker import Worker
doc = json.loads(${JSON.stringify(program())})
w = Worker("cpu")
table = torch.arange(20, dtype=torch.float32).reshape(10, 2)
h = w.handle({"op": "prepare", "graph": doc}, {"table": table})[0]["handle"]
streams = [{"input": "past", "from": "new", "pad": -1}]
def step(ids, rows=(1, 2)):
    hdr = {"op": "run", "handle": h, "caches": {"streams": streams, "rows": [{"id": r, "append": [0, 1]} for r in rows]}}
    return w.handle(hdr, {"ids": torch.tensor(ids, dtype=torch.int64).reshape(len(rows), 1)})[1]
res = {"shapes": [], "y": [], "stats": []}
for ids in ([1, 2], [3, 4], [5, 6], [7, 8]):
    o = step(ids)
    res["shapes"].append(list(o["y"].shape))
    res["y"].append(o["y"][:, :, 0].tolist())
    res["stats"].append(dict(w.graphs.stats))
try:
    step([9, 10])
    res["bad"] = None
except errors.WorkerError as e:
    res["bad"] = [e.code, e.message]
res["after_bad"] = step([0, 1])["y"][:, :, 0].tolist()
res["lengths"] = [w.caches[1].length, w.caches[2].length]
# one row: a new batch (re-staged), so a new key
step([2], rows=(1,)); step([3], rows=(1,))
res["graphs"] = len(w.graphs.graphs)
w.handle({"op": "dispose", "handle": h}, {})
res["after_dispose"] = len(w.graphs.graphs)
# a capture that fails: eager from then on, and said once on stderr
h2 = w.handle({"op": "prepare", "graph": doc}, {"table": table})[0]["handle"]
h = h2
class Broken(cudagraph._Emulated):
    def capture(self):
        raise RuntimeError("operation not permitted when stream is capturing")
cudagraph._Emulated, keep = Broken, cudagraph._Emulated
before = dict(w.graphs.stats)
ys = [step([i, i + 1], rows=(5, 6))["y"][:, -1, 0].tolist() for i in range(4)]
after = dict(w.graphs.stats)
res["broken"] = {"ys": ys, "failures": after["failures"] - before["failures"], "eager": after["eager"] - before["eager"], "replays": after["replays"] - before["replays"]}
cudagraph._Emulated = keep
# LRU: more keys than LIMIT (each batch size is its own key, each seen twice)
g = cudagraph.StepGraphs(limit=2)
prog = w.programs[h2]
for n in (1, 2, 3):
    for _ in range(2):
        g.run(prog, {"ids": torch.zeros((n, 1), dtype=torch.int64), "past": torch.zeros((n, 4, 2))}, set())
res["lru"] = [len(g.graphs), sorted(k[2][1][0] for k in g.graphs)]
print(json.dumps(res))
`,
      { STAGEML_TORCH_GRAPHS: 'emulate' },
    ) as {
      shapes: number[][];
      y: number[][][];
      stats: { eager: number; captures: number; replays: number }[];
      bad: [string, string] | null;
      after_bad: number[][];
      lengths: number[];
      graphs: number;
      after_dispose: number;
      broken: { ys: number[][]; failures: number; eager: number; replays: number };
      lru: [number, number[]];
    };
    // The staged capacity (64 positions) every step, so every step has the same shape.
    expect(out.shapes).toEqual([[2, 65, 2], [2, 65, 2], [2, 65, 2], [2, 65, 2]]);
    // Step 1 eager, step 2 captured and replayed, steps 3-4 replayed.
    expect(out.stats.map((s) => [s.eager, s.captures, s.replays])).toEqual([[1, 0, 0], [1, 1, 1], [1, 1, 2], [1, 1, 3]]);
    // Each step's own ids (table[i][0] = 2i) at the end, the earlier steps' in the cache before the pad.
    expect(out.y.map((r) => r.map((row) => row[64]))).toEqual([[2, 4], [6, 8], [10, 12], [14, 16]]);
    expect(out.y[3]!.map((row) => row.slice(0, 4))).toEqual([[2, 6, 10, -1], [4, 8, 12, -1]]);
    // id 10 is past the table: refused before the replay, nothing appended, the next step fine.
    expect(out.bad?.[0]).toBe('RT_EVAL_FAILED');
    expect(out.bad?.[1]).toContain("input 'ids'");
    expect(out.after_bad.map((row) => row[64])).toEqual([0, 2]);
    expect(out.lengths).toEqual([5, 5]);
    expect(out.graphs).toBe(2);
    expect(out.after_dispose).toBe(0);
    // A failing capture: the same results, one failure; steps 1-2 eager through the graphs, then
    // the program leaves them (plain runs).
    expect(out.broken.ys).toEqual([[0, 2], [2, 4], [4, 6], [6, 8]]);
    expect(out.broken).toMatchObject({ failures: 1, eager: 2, replays: 0 });
    expect(out.lru).toEqual([2, [2, 3]]); // the batch of 1 row (least recently used) dropped
  }, 60_000);

  it('captures a warm program\'s new key at first sight, checks its indices from the capture, and falls back to the second sight when that capture fails', () => {
    const out = runNativePython(
      `
import json, torch
from stageml_torch import cudagraph, errors
from stageml_torch.worker import Worker
doc = json.loads(${JSON.stringify(program())})
table = torch.arange(20, dtype=torch.float32).reshape(10, 2)
streams = [{"input": "past", "from": "new", "pad": -1}]
def setup():
    w = Worker("cpu")
    h = w.handle({"op": "prepare", "graph": doc}, {"table": table})[0]["handle"]
    return w, h
def step(w, h, ids, rows):
    hdr = {"op": "run", "handle": h, "caches": {"streams": streams, "rows": [{"id": r, "append": [0, 1]} for r in rows]}}
    return w.handle(hdr, {"ids": torch.tensor(ids, dtype=torch.int64).reshape(len(rows), 1)})[1]
def counts(w):
    g = w.graphs.stats
    return [g["eager"], g["captures"], g["replays"], g["firstSight"], g["failures"]]
res = {}
w, h = setup()
step(w, h, [1, 2], (1, 2)); step(w, h, [3, 4], (1, 2))
res["cold"] = counts(w)
# three caches: the batch is re-staged to 4 rows, a new key of a warm program
y = step(w, h, [5, 6, 7], (1, 2, 3))["y"]
res["first"] = counts(w)
res["first_y"] = [y[0, 1, 0].item(), y[0, -1, 0].item(), y[2, 0, 0].item(), y[2, -1, 0].item()]
step(w, h, [1, 1, 1], (1, 2, 3))
res["next"] = counts(w)
try:
    step(w, h, [9, 10, 1], (1, 2, 3))
    res["bad"] = None
except errors.WorkerError as e:
    res["bad"] = [e.code, e.message]
res["lengths"] = [w.caches[i].length for i in (1, 2, 3)]
# a warm program whose capture fails: eager at the new key's first sight, then the second sight's
# capture fails too, and the program runs eagerly from then on (same values throughout)
w, h = setup()
step(w, h, [1, 2], (1, 2)); step(w, h, [3, 4], (1, 2))
class Broken(cudagraph._Emulated):
    def capture(self):
        raise RuntimeError("operation not permitted when stream is capturing")
cudagraph._Emulated, keep = Broken, cudagraph._Emulated
before = counts(w)
ys = [step(w, h, [i, i, i], (1, 2, 3))["y"][:, -1, 0].tolist() for i in range(4)]
cudagraph._Emulated = keep
res["broken"] = {"ys": ys, "delta": [a - b for a, b in zip(counts(w), before)]}
print(json.dumps(res))
`,
      { STAGEML_TORCH_GRAPHS: 'emulate' },
    ) as { cold: number[]; first: number[]; first_y: number[]; next: number[]; bad: [string, string] | null; lengths: number[]; broken: { ys: number[][]; delta: number[] } };
    // [eager, captures, replays, firstSight, failures]: a cold program eager first, captured at the second step.
    expect(out.cold).toEqual([1, 1, 1, 0, 0]);
    // The re-staged batch's first step is captured at once and replayed, with no eager step.
    expect(out.first).toEqual([1, 2, 2, 1, 0]);
    // Row 0 holds ids 1, 3 (table[i][0] = 2i) and takes 5 at the capacity; row 2 (new) holds only
    // the pad and takes 7.
    expect(out.first_y).toEqual([6, 10, -1, 14]);
    expect(out.next).toEqual([1, 2, 3, 1, 0]);
    // The bound the capture recorded refuses id 10 before the replay; nothing appended.
    expect(out.bad?.[0]).toBe('RT_EVAL_FAILED');
    expect(out.bad?.[1]).toContain("input 'ids'");
    expect(out.lengths).toEqual([4, 4, 2]);
    expect(out.broken.ys).toEqual([0, 1, 2, 3].map((i) => [2 * i, 2 * i, 2 * i]));
    // First sight: capture fails, eager; second sight: capture fails (a failure), eager; then plain runs.
    expect(out.broken.delta).toEqual([2, 0, 0, 0, 1]);
  }, 60_000);

  it('keys a step graph by its resident inputs under residentSame: a stored replacement is a new key, an unchanged map replays', () => {
    const doc = program('input');
    const out = runNativePython(
      `
import json, torch
from stageml_torch.worker import Worker
w = Worker("cpu")
h = w.handle({"op": "prepare", "graph": json.loads(${JSON.stringify(doc)})}, {})[0]["handle"]
streams = [{"input": "past", "from": "new", "pad": -1}]
def step(i, extra, tensors=None):
    hdr = dict({"op": "run", "handle": h, "caches": {"streams": streams, "rows": [{"id": 1, "append": [0, 1]}]}}, **extra)
    reply, outs = w.handle(hdr, dict({"ids": torch.tensor([[i]])}, **(tensors or {})))
    assert reply["ok"], reply
    return [outs["y"][0, -1, 0].item(), dict(w.graphs.stats)]
t1 = torch.arange(20, dtype=torch.float32).reshape(10, 2)
res = [step(1, {"store": {"table": 7}, "resident": {}}, {"table": t1})]
res += [step(2, {"resident": {"table": 7}}), step(3, {"residentSame": True}), step(4, {"residentSame": True})]
# replaced: the new table under a new id (the old one dropped), then named by id, then the same map
res += [step(1, {"store": {"table": 8}, "resident": {}, "drop": [7]}, {"table": t1 * 100})]
res += [step(2, {"resident": {"table": 8}}), step(3, {"residentSame": True}), step(4, {"residentSame": True})]
print(json.dumps(res))
`,
      { STAGEML_TORCH_GRAPHS: 'emulate' },
    ) as [number, { eager: number; captures: number; replays: number }][];
    // table[i][0] = 2i, then 200i: no replay of a graph bound to the dropped table.
    expect(out.map((r) => r[0])).toEqual([2, 4, 6, 8, 200, 400, 600, 800]);
    // The steps naming the same tensors replay one graph; the replacement is seen as a new key.
    const replays = out.map((r) => r[1].replays);
    expect(replays[3]! - replays[1]!).toBe(2);
    expect(replays[7]! - replays[5]!).toBe(2);
  }, 60_000);
  it('primes the program before a capture: each kernel step with a prime gets its input and parameter operands, None for computed ones', () => {
    const out = runNativePython(
      `
import json, torch
from stageml_torch.worker import Worker
doc = json.loads(${JSON.stringify(program('input'))})
w = Worker("cpu")
h = w.handle({"op": "prepare", "graph": doc}, {})[0]["handle"]
prog = w.programs[h]
calls = []
class Primed:
    def __init__(self, key, fn):
        self.key, self.fn = key, fn
    def __call__(self, args, attrs, ctx):
        return self.fn(args, attrs, ctx)
    def prime(self, args):
        calls.append([self.key, [None if a is None else list(a.shape) for a in args], dict(w.graphs.stats)["captures"]])
prog.steps = [(k, Primed(k, fn), o, a, i) for k, fn, o, a, i in prog.steps]
table = torch.arange(20, dtype=torch.float32).reshape(10, 2)
streams = [{"input": "past", "from": "new", "pad": -1}]
ys = []
for ids in ([1, 2], [3, 4], [5, 6]):
    hdr = {"op": "run", "handle": h, "caches": {"streams": streams, "rows": [{"id": 1, "append": [0, 1]}, {"id": 2, "append": [0, 1]}]}}
    ys.append(w.handle(hdr, {"ids": torch.tensor(ids, dtype=torch.int64).reshape(2, 1), "table": table})[1]["new"][:, 0, 0].tolist())
print(json.dumps({"calls": calls, "ys": ys, "stats": dict(w.graphs.stats)}))
`,
      { STAGEML_TORCH_GRAPHS: 'emulate' },
    ) as { calls: [string, (number[] | null)[], number][]; ys: number[][]; stats: { captures: number; replays: number } };
    // One capture (the second step), primed once before it: every step of the program asked.
    expect(out.stats.captures).toBe(1);
    const gather = out.calls.find(([k]) => k === 'gather');
    // The gather's operands are both inputs (the table, the ids), given as the capture's feed.
    expect(gather).toEqual(['gather', [[10, 2], [2, 1]], 0]);
    // A step that takes the gather's result gets None for it.
    expect(out.calls.some(([k, args]) => k !== 'gather' && args.includes(null))).toBe(true);
    expect(out.calls.every(([, , captures]) => captures === 0)).toBe(true);
    // The replays still compute each step's own rows (table[i][0] = 2i).
    expect(out.ys).toEqual([[2, 4], [6, 8], [10, 12]]);
  }, 60_000);
});
