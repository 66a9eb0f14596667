import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { checkAdapterPath } from './adapter-guard.js';

const adapters = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/adapters/', import.meta.url));

describe('checkAdapterPath', () => {
  it('without a root refuses runtime loads naming the flag that enables them (VLLM_ALLOW_RUNTIME_LORA_UPDATING opens nothing)', async () => {
    await expect(checkAdapterPath(`${adapters}qv-r8`, { roots: [] })).rejects.toMatchObject({ code: 'SERVER_ADAPTER_PATH', message: expect.stringMatching(/--adapter-root DIR.*VLLM_ALLOW_RUNTIME_LORA_UPDATING/) });
  });

  it('with a root loads inside it and refuses outside it', async () => {
    await expect(checkAdapterPath(`${adapters}qv-r8`, { roots: [adapters] })).resolves.toMatch(/qv-r8$/);
    await expect(checkAdapterPath('/etc', { roots: [adapters] })).rejects.toMatchObject({ code: 'SERVER_ADAPTER_PATH' });
  });
});
