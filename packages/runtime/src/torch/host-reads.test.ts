// What the torch worker's ops read on the host during an eager run (native/stageml_torch/ops.py):
// an index's bounds (`_index`, before gather / indexSelect / scatterAdd) and whether a mask is all
// zeros (`_all_zero`, before attention). On a GPU each read waits for the device, so they are read
// from the host tensor an input was copied from where there is one (`host_of`, fed by
// graph.Program.run) and once per run for each tensor (the run's memo). CPU torch copies nothing to
// a device, so a "device" tensor and a separate host tensor stand in for the pair Program.run
// records; where the two differ the result shows which one was read.
import { expect, it } from 'vitest';

import { describeWithTorch, runNativePython } from './test-support.js';

const PRELUDE = `
import json, torch
from stageml_torch import errors, graph, ops

def ctx_with(pairs):
    return graph._Ctx(torch.device("cpu"), {}, None, {}, {dev.data_ptr(): (dev, src) for dev, src in pairs})

def rejects(fn):
    try:
        fn()
    except errors.WorkerError as e:
        return e.code
    return None
`;

describeWithTorch('host reads of the torch worker ops (stageml_torch.ops)', () => {
  it('host_of answers an input and a contiguous reshape of it with the host values, nothing else', () => {
    const out = runNativePython(`${PRELUDE}
dev = torch.arange(12).reshape(3, 4)
src = dev.clone()
src[0, 0] = 99
c = ctx_with([(dev, src)])
flat = ops.host_of(dev.reshape(12), c)
print(json.dumps({
    "same": ops.host_of(dev, c) is src,
    "reshape": None if flat is None else flat.tolist()[:2],
    "columns": ops.host_of(dev[:, :2], c) is None,
    "rows": ops.host_of(dev[1:], c) is None,
    "transposed": ops.host_of(dev.t(), c) is None,
    "other dtype": ops.host_of(dev.view(torch.float64), c) is None,
    "not an input": ops.host_of(dev.clone(), c) is None,
    "no context": ops.host_of(dev, None) is None,
}))
`);
    expect(out).toEqual({
      same: true,
      reshape: [99, 1],
      columns: true,
      rows: true,
      transposed: true,
      'other dtype': true,
      'not an input': true,
      'no context': true,
    });
  }, 60_000);

  it("checks an index's bounds on the host copy, once per run for each index tensor, and still rejects one out of range", () => {
    const out = runNativePython(`${PRELUDE}
reads = []
orig = ops.host_of
def counted(t, ctx):
    reads.append(1)
    return orig(t, ctx)
ops.host_of = counted
table = torch.randn(5, 3)
dev = torch.tensor([0, 4, 2])
src = torch.tensor([0, 7, 2])  # the host copy says 7: out of range, though the stand-in device tensor is not
c = ctx_with([(dev, src)])
host_read = rejects(lambda: ops.op_gather([table, dev], {"axis": 0}, c))
ok = torch.tensor([1, 3])
c2 = graph._Ctx(torch.device("cpu"), {}, None, {})
first = ops.op_gather([table, ok], {"axis": 0}, c2)[0]
again = ops.op_index_select([table, ok], {"axis": 0}, c2)[0]
once = len(reads)
other = torch.tensor([1, 3])
ops.op_gather([table, other], {"axis": 0}, c2)
twice = len(reads)
bad = torch.tensor([1, 5])
first_bad = rejects(lambda: ops.op_gather([table, bad], {"axis": 0}, c2))
memo_bad = rejects(lambda: ops.op_gather([table, bad], {"axis": 0}, c2))
print(json.dumps({
    "host read": host_read,
    "values": first.tolist() == table[[1, 3]].tolist() and again.tolist() == first.tolist(),
    "reads": [once - 1, twice - 1],
    "bad": [first_bad, memo_bad],
}))
`);
    // The first gather read the host copy's bounds (7: rejected); the index read once for a gather
    // and an indexSelect in one run, again for another tensor of the same values; an index out of
    // range is rejected when first seen and from the memo.
    expect(out).toEqual({ 'host read': 'RT_EVAL_FAILED', values: true, reads: [1, 2], bad: ['RT_EVAL_FAILED', 'RT_EVAL_FAILED'] });
  }, 60_000);

  it('reads whether a mask is all zeros from the host copy of an input mask and of its reshape', () => {
    const out = runNativePython(`${PRELUDE}
dev = torch.zeros(2, 6)
src = dev.clone()
src[1, 5] = -1e30  # the host copy masks a key the stand-in device tensor does not
c = ctx_with([(dev, src)])
z = torch.zeros(2, 6)
c2 = graph._Ctx(torch.device("cpu"), {}, None, {})
print(json.dumps([ops._all_zero(dev, c), ops._all_zero(dev.reshape(2, 1, 1, 6), c), ops._all_zero(z, c2), ops._all_zero(z.reshape(2, 1, 1, 6), c2)]))
`);
    expect(out).toEqual([false, false, true, true]);
  }, 60_000);
});
