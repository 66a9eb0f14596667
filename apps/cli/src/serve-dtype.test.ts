// `stageml serve --dtype`: the bf16 engine computes what `stageml stage --dtype bf16` (PEFT-exact,
// adapter factors f32) computes, bit for bit; the flags' parsing and defaults.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { interpret } from '@stageml/ir';
import { createServer } from '@stageml/server';
import { isOrtAvailable, isTorchAvailable, loadBundle } from '@stageml/runtime';
import { afterAll, describe, expect, it } from 'vitest';
import { serveDtypes } from './commands/serve.js';
import { ExitCode } from './index.js';
import { fixture, prefillInputs, runCaptured as run } from './test-fixtures.js';

const ORT_HERE = await isOrtAvailable();
const dir = mkdtempSync(join(tmpdir(), 'stageml-serve-dtype-'));
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

describe('stageml serve --dtype', () => {
  it('the bf16 engine equals the bf16 bundle of `stage --dtype bf16` bit for bit (prefill logits, every fixture adapter)', async () => {
    const ids = [1, 52, 317, 335, 262, 438, 309, 487];
    // The engine `stageml serve --dtype bf16` builds (through the server's options).
    const server = await createServer({ modelDir: fixture('peft-tiny/llama/base'), dtype: 'bf16', maxLoras: 4, maxLoraRank: 16 });
    const engine = server.lm;
    try {
      expect(engine.dtype).toBe('bf16');
      for (const adapter of ['all-r16', 'qv-r8', 'mlp-r4-rslora', 'o-r2']) {
        const out = join(dir, adapter);
        const staged = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture(`peft-tiny/llama/adapters/${adapter}`), '--cutoff', 'adapter', '--dtype', 'bf16', '--out', out]);
        expect(staged.code).toBe(ExitCode.OK);
        const b = await loadBundle(out);
        const logits = interpret(b.residual, { inputs: prefillInputs(ids, 2, 2, 16), weights: b.constants })['logits']!;
        const V = logits.shape[2]!;
        const want = logits.data.subarray((ids.length - 1) * V, ids.length * V);
        await engine.loadAdapter(fixture(`peft-tiny/llama/adapters/${adapter}`), adapter);
        const seq = engine.open(adapter, ids);
        expect(await engine.attach(seq)).toBe(true);
        const got = (await engine.prefill(seq, { maxChunk: 64 }))!;
        engine.release(seq);
        expect(Array.from(got), adapter).toEqual(Array.from(want));
      }
    } finally {
      await server.shutdown();
    }
  }, 120_000);

  it('parses --dtype and --adapter-dtype: checkpoint by default on torch (f32 with --quantize), f32 elsewhere; bad values are CLI_USAGE', async () => {
    // LoRA factors in the compute dtype on CUDA (the bank kernel's tables), PEFT's f32 elsewhere.
    expect(serveDtypes(undefined, undefined, 'torch-cuda')).toEqual({ dtype: 'checkpoint', adapterDtype: 'same' });
    expect(serveDtypes(undefined, 'auto', 'torch-cuda')).toEqual({ dtype: 'checkpoint', adapterDtype: 'same' });
    expect(serveDtypes(undefined, 'f32', 'torch-cuda')).toEqual({ dtype: 'checkpoint', adapterDtype: 'f32' });
    expect(serveDtypes(undefined, undefined, 'torch-cpu')).toEqual({ dtype: 'checkpoint' });
    expect(serveDtypes('f32', 'auto', 'torch-cuda')).toEqual({ dtype: 'f32' });
    expect(() => serveDtypes(undefined, 'int4', 'torch-cuda')).toThrow("--adapter-dtype must be one of auto, f32, same, int8, got 'int4'");
    // int8 factors: an f32 engine on every executor (checkpoint resolved and checked by the engine).
    expect(serveDtypes(undefined, 'int8', 'torch-cuda')).toEqual({ dtype: 'f32', adapterDtype: 'int8' });
    expect(serveDtypes(undefined, 'int8', 'cpu-native')).toEqual({ dtype: 'f32', adapterDtype: 'int8' });
    expect(serveDtypes('float32', 'int8', 'cpu-native')).toEqual({ dtype: 'f32', adapterDtype: 'int8' });
    expect(serveDtypes('checkpoint', 'int8', 'cpu-native')).toEqual({ dtype: 'checkpoint', adapterDtype: 'int8' });
    expect(() => serveDtypes('bf16', 'int8', 'cpu-native')).toThrow('--adapter-dtype int8 stores int8 factors beside an f32 engine');
    expect(serveDtypes(undefined, undefined, 'torch-cpu', true)).toEqual({ dtype: 'f32' });
    expect(serveDtypes(undefined, undefined, 'onnxruntime')).toEqual({ dtype: 'f32' });
    expect(serveDtypes('bf16', 'same', 'interpreter')).toEqual({ dtype: 'bf16', adapterDtype: 'same' });
    expect(() => serveDtypes('fp8', undefined, 'torch-cpu')).toThrow("--dtype must be one of auto, bfloat16, float16, float32, f32, bf16, f16, checkpoint, got 'fp8'");
    // vLLM's spellings: auto is the default choice, the others the compute dtypes.
    expect(serveDtypes('auto', undefined, 'torch-cuda')).toEqual({ dtype: 'checkpoint', adapterDtype: 'same' });
    expect(serveDtypes('auto', undefined, 'onnxruntime')).toEqual({ dtype: 'f32' });
    expect(serveDtypes('bfloat16', 'same', 'torch-cuda')).toEqual({ dtype: 'bf16', adapterDtype: 'same' });
    expect(serveDtypes('float16', undefined, 'interpreter')).toEqual({ dtype: 'f16' });
    expect(serveDtypes('float32', undefined, 'torch-cuda')).toEqual({ dtype: 'f32' });
    expect(serveDtypes('bf16', undefined, 'torch-cpu')).toEqual({ dtype: 'bf16' });
    expect(() => serveDtypes('float32', 'same', 'torch-cpu')).toThrow('--adapter-dtype applies to a bf16/f16 --dtype');
    expect(() => serveDtypes('toString', undefined, 'torch-cpu')).toThrow('--dtype must be one of');
    expect(() => serveDtypes('f32', 'same', 'torch-cpu')).toThrow('--adapter-dtype applies to a bf16/f16 --dtype');
    for (const args of [['--dtype', 'fp8'], ['--dtype', 'bf16', '--adapter-dtype', 'bf16']]) {
      const r = await run(['serve', '--model', fixture('peft-tiny/llama/base'), '--port', '0', ...args]);
      expect(r.code).toBe(ExitCode.USAGE);
      expect(r.err).toContain('CLI_USAGE');
    }
  });

  it.skipIf(!ORT_HERE)('refuses --dtype bf16 on onnxruntime with ENGINE_UNSUPPORTED_DTYPE before listening', async () => {
    const r = await run(['serve', '--model', fixture('peft-tiny/llama/base'), '--port', '0', '--dtype', 'bf16', '--executor', 'onnxruntime']);
    expect(r.code).toBe(ExitCode.INVALID_INPUT);
    expect(r.err).toContain('ENGINE_UNSUPPORTED_DTYPE');
    expect(r.err).toContain("the executor 'onnxruntime' cannot run bf16 programs");
  });

  it('--gpu-memory-utilization: a share in (0, 1], an executor that reports its device memory, ENGINE_DEVICE_MEMORY naming the sizes when the plan does not fit', async () => {
    const model = fixture('peft-tiny/llama/base');
    for (const v of ['0', '1.5', 'half']) {
      const r = await run(['serve', '--model', model, '--port', '0', '--executor', 'interpreter', '--gpu-memory-utilization', v]);
      expect(r.code).toBe(ExitCode.USAGE);
      expect(r.err).toContain('(0, 1]');
    }
    const noDevice = await run(['serve', '--model', model, '--port', '0', '--executor', 'interpreter', '--gpu-memory-utilization', '0.9']);
    expect(noDevice.code).toBe(ExitCode.USAGE);
    expect(noDevice.err).toContain("reports its device's memory");
    if (!isTorchAvailable()) return;
    // The worker reports its device's memory (the host's on a CPU worker): a 10-millionth of it does not hold this plan.
    const tight = await run(['serve', '--model', model, '--port', '0', '--executor', 'torch', '--max-loras', '2', '--max-lora-rank', '8', '--gpu-memory-utilization', '0.0000001']);
    expect(tight.code).toBe(ExitCode.INVALID_INPUT);
    expect(tight.err).toContain('ENGINE_DEVICE_MEMORY');
    expect(tight.err).toMatch(/weights .* slot tables .* KV .* workspace/);
  }, 120_000);
});
