// `stageml serve --tensor-parallel-size` / `-tp`: refused before any worker starts when it cannot work.
import { describe, expect, it } from 'vitest';
import { runCli } from './cli.js';
import { checkTensorParallel } from './commands/serve.js';

const quiet = { out: () => undefined, err: () => undefined };

describe('checkTensorParallel', () => {
  it('passes 1 and absent through, and sizes the heads split over', () => {
    expect(checkTensorParallel(undefined, 'auto', undefined)).toBeUndefined();
    expect(checkTensorParallel(1, 'auto', { heads: 4, kvHeads: 2 })).toBe(1);
    expect(checkTensorParallel(2, 'torch', { heads: 4, kvHeads: 2 })).toBe(2);
    // Fewer key/value heads than ranks: replicated (4 ranks, 2 KV heads).
    expect(checkTensorParallel(4, 'torch', { heads: 32, kvHeads: 2 })).toBe(4);
  });

  it('refuses another executor than torch, and heads the size does not divide, naming the numbers', () => {
    expect(() => checkTensorParallel(2, 'auto', undefined)).toThrow(expect.objectContaining({ code: 'CLI_USAGE', message: expect.stringContaining('--executor torch') as string }) as Error);
    expect(() => checkTensorParallel(3, 'torch', { heads: 4, kvHeads: 2 })).toThrow(expect.objectContaining({ code: 'CLI_USAGE', message: expect.stringContaining('4 attention heads') as string }) as Error);
    expect(() => checkTensorParallel(4, 'torch', { heads: 12, kvHeads: 6 })).toThrow(expect.objectContaining({ code: 'CLI_USAGE', message: expect.stringContaining('6 key/value heads') as string }) as Error);
  });
});

describe('stageml serve --tensor-parallel-size', () => {
  it('refuses 0 and -1 under either name as usage errors', async () => {
    for (const argv of [['--tensor-parallel-size', '0'], ['-tp', '0'], ['-tp', '-1'], ['-tp=0']]) {
      expect(await runCli(['serve', 'fixtures/peft-tiny/llama/base', '--executor', 'torch', ...argv], quiet), argv.join(' ')).toBe(2);
    }
  });
});
