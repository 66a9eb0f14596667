// `stageml serve --max-num-seqs` / `--max-num-batched-tokens`: vLLM's names for `--max-batch` and
// `--prefill-tokens`, one setting under two names.
import { describe, expect, it } from 'vitest';
import { aliased } from './commands/serve.js';

describe('stageml serve vLLM flag aliases', () => {
  it('takes the value under either name, the same value under both, and refuses two different ones', () => {
    expect(aliased('--max-batch', undefined, '--max-num-seqs', 64)).toBe(64);
    expect(aliased('--max-batch', 16, '--max-num-seqs', undefined)).toBe(16);
    expect(aliased('--prefill-tokens', 8192, '--max-num-batched-tokens', 8192)).toBe(8192);
    expect(aliased('--prefill-tokens', undefined, '--max-num-batched-tokens', undefined)).toBeUndefined();
    expect(() => aliased('--prefill-tokens', 64, '--max-num-batched-tokens', 8192)).toThrow(expect.objectContaining({ code: 'CLI_USAGE', message: expect.stringContaining('--max-num-batched-tokens 8192') as string }) as Error);
  });
});
