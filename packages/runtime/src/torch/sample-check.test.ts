// The torch worker's own checks of a run's `sample` header (worker.check_sample): a frame from a
// client other than this package's executor (which checks first) is refused with RT_BAD_VALUE,
// naming the row and the field, before anything runs.
import { expect, it } from 'vitest';
import { describeWithTorch, runNativePython } from './test-support.js';

describeWithTorch('torch worker sample checks (CPU torch)', () => {
  it('refuses bad sample columns and processing entries, naming them; accepts good ones', () => {
    const out = runNativePython(`
import json
from stageml_torch import worker, errors
class Prog:
    name = "pick"
    outputs = [("logits", 1), ("ids", 2)]
    value_types = {1: ([2, 4], "f32"), 2: ([2], "i64")}
    def output_names(self):
        return ["logits", "ids"]
good = {"temperature": [1, 0], "topK": [0, 2], "topP": [1, 0.5], "u": [0.5, 0]}
cases = {
    "ok": {"logits": good},
    "ok processing": {"logits": dict(good, processing=[None, {"logitBias": [[1, 2.5]], "repetitionPenalty": 1.2, "seen": [0, 3], "frequencyPenalty": 0.5, "presencePenalty": -1, "counts": [[3, 2]]}])},
    "int output": {"ids": good},
    "lengths": {"logits": dict(good, u=[0.5])},
    "temperature": {"logits": dict(good, temperature=[-1, 0])},
    "topK": {"logits": dict(good, topK=[0, True])},
    "topP": {"logits": dict(good, topP=[0, 1])},
    "u": {"logits": dict(good, u=[0.5, 1])},
    "processing length": {"logits": dict(good, processing=[None])},
    "processing type": {"logits": dict(good, processing=[None, 3])},
    "bias pair": {"logits": dict(good, processing=[{"logitBias": [[1]]}, None])},
    "bias dup": {"logits": dict(good, processing=[{"logitBias": [[1, 1.0], [1, 2.0]]}, None])},
    "seen": {"logits": dict(good, processing=[None, {"seen": [1, -1]}])},
    "counts": {"logits": dict(good, processing=[None, {"counts": [[1, 0]]}])},
    "repetition": {"logits": dict(good, processing=[None, {"repetitionPenalty": 0}])},
    "presence": {"logits": dict(good, processing=[None, {"presencePenalty": "x"}])},
}
res = {}
for k, sample in cases.items():
    try:
        worker.check_sample(Prog(), {"sample": sample})
        res[k] = "ok"
    except errors.WorkerError as e:
        res[k] = "%s: %s" % (e.code, e)
print(json.dumps(res))
`) as Record<string, string>;
    expect(out['ok']).toBe('ok');
    expect(out['ok processing']).toBe('ok');
    const want: Record<string, string> = {
      'int output': "sample names 'ids'",
      lengths: 'one entry per row',
      temperature: 'row 0: temperature',
      topK: 'row 1: topK',
      topP: 'row 0: topP',
      u: 'row 1: u',
      'processing length': 'one processing entry',
      'processing type': 'row 1: processing must be an object',
      'bias pair': 'row 0: processing logitBias must be [id, value] pairs',
      'bias dup': 'row 0: processing logitBias ids must be distinct',
      seen: 'row 1: processing seen must be distinct token ids',
      counts: 'row 1: processing counts must be [id, value] pairs',
      repetition: 'row 1: processing repetitionPenalty',
      presence: 'row 1: processing presencePenalty',
    };
    for (const [k, msg] of Object.entries(want)) {
      expect(out[k], k).toContain('RT_BAD_VALUE');
      expect(out[k], k).toContain(msg);
    }
  }, 60_000);
});
