import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { dtypeOf, vllmServeOptions } from './vllm-flags.js';

const dir = mkdtempSync(join(tmpdir(), 'stageml-vllm-flags-'));
writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ do_sample: true, temperature: 0.6, top_p: 0.9, top_k: 20, repetition_penalty: 1.05, bos_token_id: 1 }));
writeFileSync(join(dir, 'template.jinja'), '{% for m in messages %}{{ m.content }}{% endfor %}');
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

describe('vllmServeOptions', () => {
  it('turns prefix caching on by default and off with --no-enable-prefix-caching; refuses vLLM quantization methods naming what we have', async () => {
    expect((await vllmServeOptions({}, {})).prefixCaching).toBe(true);
    expect((await vllmServeOptions({ enablePrefixCaching: true }, {})).prefixCaching).toBe(true);
    const off = await vllmServeOptions({ enablePrefixCaching: false }, {});
    expect([off.prefixCaching, off.notes]).toEqual([false, []]);
    await expect(vllmServeOptions({ quantization: 'awq' }, {})).rejects.toThrow(/--quantization awq.*--quantize/);
  });

  it('tool flags need each other', async () => {
    await expect(vllmServeOptions({ enableAutoToolChoice: true }, {})).rejects.toThrow(/needs --tool-call-parser/);
    await expect(vllmServeOptions({ enableAutoToolChoice: true, toolCallParser: 'pythonic' }, {})).rejects.toThrow(/hermes, llama3_json, mistral/);
    expect(await vllmServeOptions({ enableAutoToolChoice: true, toolCallParser: 'hermes' }, {})).toMatchObject({ enableAutoToolChoice: true, toolCallParser: 'hermes' });
  });

  it('reads generation_config.json defaults unless --generation-config vllm', async () => {
    expect((await vllmServeOptions({}, { modelDir: dir })).generationDefaults).toEqual({ temperature: 0.6, top_p: 0.9, top_k: 20, repetition_penalty: 1.05 });
    expect((await vllmServeOptions({ generationConfig: 'vllm' }, { modelDir: dir })).generationDefaults).toBeUndefined();
    expect((await vllmServeOptions({ generationConfig: dir }, { modelDir: '/nonexistent' })).generationDefaults).toMatchObject({ top_k: 20 });
  });

  it('reads --chat-template from a file or as text', async () => {
    expect((await vllmServeOptions({ chatTemplate: join(dir, 'template.jinja') }, {})).chatTemplate).toContain('{% for m in messages %}');
    expect((await vllmServeOptions({ chatTemplate: '{{ messages[0].content }}' }, {})).chatTemplate).toBe('{{ messages[0].content }}');
    await expect(vllmServeOptions({ chatTemplate: '/no/such/file.jinja' }, {})).rejects.toThrow(/neither a file nor a template/);
  });
});

describe('dtypeOf', () => {
  it("maps vLLM's dtype names to ours", () => {
    expect(['auto', 'bfloat16', 'half', 'float16', 'float32', 'bf16', 'checkpoint'].map(dtypeOf)).toEqual([undefined, 'bf16', 'f16', 'f16', 'f32', 'bf16', 'checkpoint']);
  });
});
