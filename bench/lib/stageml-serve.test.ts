import { describe, expect, it } from 'vitest';
import { readServeLog } from './stageml-serve.js';

describe('readServeLog', () => {
  const auto = "executor: cpu-native ('cpu-native' (prebuilt avx512-vnni) is fastest on this model's step: cpu-native 4.21 + 27.64 ms, onnxruntime 58.48 + – ms)";
  const ready = 'stageml server ready on http://127.0.0.1:41233 · model bench/tmp/m · adapters: a0, a1 · executor cpu-native (f32)';

  it("reads the address and executor of the ready line and auto's line", () => {
    expect(readServeLog(`${auto}\n${ready}\ntry: curl …\n`)).toEqual({ executorLine: auto, ready: { line: ready, base: 'http://127.0.0.1:41233', executor: 'cpu-native' } });
  });

  it('has no ready line until the server prints it, and no auto line when the executor was named', () => {
    expect(readServeLog(`${auto}\n`)).toEqual({ executorLine: auto });
    expect(readServeLog(`${ready}\n`).executorLine).toBeUndefined();
    expect(readServeLog('stageml server ready on http://127.0.0.1:1')).toEqual({});
  });
});
