import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { IncrementalDetokenizer, type TextTokenizer, applyChatTemplate, loadTokenizer, parseLlamaConfig } from './index.js';

// Fixtures made by tools/gen_fixtures_v2.py (transformers 5.17, PEFT 0.21, tokenizers 0.23): the
// config, tokenizers, chat templates and detokenizer here; the model's logits and greedy tokens run
// through the engine (packages/engine/src/hf-v2-golden.test.ts).
const root = fileURLToPath(new URL('../../../fixtures/hf-v2/', import.meta.url));
interface PromptGolden {
  input_ids: number[];
  greedy_new_ids: number[];
}
interface ChatGolden {
  messages: { role: string; content: string }[];
  text: string;
  input_ids: number[];
  greedy_new_ids?: number[];
  no_generation_prompt_ids?: number[];
  tool_use_ids?: number[];
}
interface Golden {
  prompts: string[];
  'mistral.chat': ChatGolden[];
  'mistral.unicode': { text: string; input_ids: number[]; decoded: string }[];
  bytelevel: { chat: ChatGolden[]; unicode: { text: string; input_ids: number[]; decoded: string }[] };
  [k: string]: unknown;
}
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Golden;
const prompts = (model: string) => (golden[`mistral.${model}`] as { prompts: Record<string, PromptGolden> }).prompts;
let lm: { tokenizer: TextTokenizer | undefined };
let byteLevel: TextTokenizer;

beforeAll(async () => {
  lm = { tokenizer: await loadTokenizer(`${root}mistral-sw`) };
  byteLevel = (await loadTokenizer(`${root}bytelevel-chat`))!;
});

/** Streams `ids` through a detokenizer one token at a time; returns the deltas. */
function stream(tok: TextTokenizer, ids: readonly number[]): string[] {
  const d = new IncrementalDetokenizer(tok);
  const out = ids.map((id) => d.push(id));
  out.push(d.flush());
  return out;
}

describe('Mistral with sliding_window 16: config and tokenizer as transformers', () => {
  it('parses sliding_window from config.json', () => {
    const cfg = parseLlamaConfig(readFileSync(`${root}mistral-sw/config.json`, 'utf8'));
    expect(cfg.slidingWindow).toBe(16);
    expect(parseLlamaConfig(JSON.stringify({ ...JSON.parse(readFileSync(`${root}mistral-sw/config.json`, 'utf8')), sliding_window: null })).slidingWindow).toBeUndefined();
  });

  it('tokenizes the text prompts as transformers does (byte-fallback BPE)', () => {
    golden.prompts.forEach((text, i) => {
      expect(lm.tokenizer!.encode(text)).toEqual(prompts('base')[`prompt${String(i)}`]!.input_ids);
    });
  });
});

describe('chat templates', () => {
  it('chat_template.jinja: ids equal apply_chat_template (one BOS, from the template)', () => {
    for (const c of golden['mistral.chat']) {
      const r = applyChatTemplate(lm.tokenizer!, c.messages);
      expect(r.text).toBe(c.text);
      expect(r.ids).toEqual(c.input_ids);
      expect(r.ids.filter((t) => t === 1)).toHaveLength(1);
      expect(applyChatTemplate(lm.tokenizer!, c.messages, { addGenerationPrompt: false }).ids).toEqual(c.no_generation_prompt_ids);
    }
  });

  it('tokenizer_config.json list of named templates: default and by name', () => {
    expect(Object.keys(byteLevel.chatTemplates).sort()).toEqual(['default', 'tool_use']);
    for (const c of golden.bytelevel.chat) {
      const r = applyChatTemplate(byteLevel, c.messages);
      expect(r.text).toBe(c.text);
      expect(r.ids).toEqual(c.input_ids);
      expect(applyChatTemplate(byteLevel, c.messages, { template: 'tool_use', addGenerationPrompt: false }).ids).toEqual(c.tool_use_ids);
    }
    expect(() => applyChatTemplate(byteLevel, golden.bytelevel.chat[0]!.messages, { template: 'nope' })).toThrow(/no chat template 'nope'/);
  });
});

describe('incremental detokenization', () => {
  it('byte-fallback (<0x..>) and byte-level BPE: streamed deltas concatenate to decode(ids) for accented, CJK and emoji text', () => {
    for (const [tok, cases] of [
      [lm.tokenizer!, golden['mistral.unicode']],
      [byteLevel, golden.bytelevel.unicode],
    ] as const) {
      for (const c of cases) {
        expect(tok.encode(c.text)).toEqual(c.input_ids);
        expect(tok.decode(c.input_ids)).toBe(c.decoded);
        const deltas = stream(tok, c.input_ids);
        expect(deltas.join('')).toBe(c.decoded);
        // No delta carries a replacement character: incomplete sequences are held back.
        for (const d of deltas) expect(d).not.toContain('\uFFFD');
      }
    }
  });

  it('the byte-fallback fixture really splits characters into <0x..> tokens', () => {
    const ids = golden['mistral.unicode'][1]!.input_ids;
    expect(ids.some((id) => /^<0x[0-9A-F]{2}>$/.test(lm.tokenizer!.tokenOf(id) ?? ''))).toBe(true);
  });

  it('holds an incomplete sequence, then releases it whole; flush releases what never completed', () => {
    const tok = lm.tokenizer!;
    // The fixture's vocabulary: <unk>, <s>, </s>, then <0x00>..<0xFF>.
    const byteIds = [...Buffer.from('中')].map((b) => 3 + b);
    expect(byteIds.map((id) => tok.tokenOf(id))).toEqual(['<0xE4>', '<0xB8>', '<0xAD>']);
    const d = new IncrementalDetokenizer(tok);
    expect([d.push(byteIds[0]!), d.push(byteIds[1]!), d.push(byteIds[2]!)]).toEqual(['', '', '中']);
    const e = new IncrementalDetokenizer(tok);
    expect(e.push(byteIds[0]!)).toBe('');
    expect(e.flush()).toBe('\uFFFD');
    expect(e.text).toBe(tok.decode([byteIds[0]!]));
  });
});

describe('chat template sources', () => {
  it('tokenizer_config.json chat_template as a string; chat_template.jinja wins over it; a second BOS is never added', async () => {
    const { mkdtempSync, copyFileSync, writeFileSync, rmSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const dir = mkdtempSync(`${tmpdir()}/stageml-chat-`);
    try {
      copyFileSync(`${root}mistral-sw/tokenizer.json`, `${dir}/tokenizer.json`);
      const config = JSON.parse(readFileSync(`${root}mistral-sw/tokenizer_config.json`, 'utf8')) as Record<string, unknown>;
      writeFileSync(`${dir}/tokenizer_config.json`, JSON.stringify({ ...config, chat_template: golden['chat_template'] }));
      const fromConfig = (await loadTokenizer(dir))!;
      for (const c of golden['mistral.chat']) expect(applyChatTemplate(fromConfig, c.messages).ids).toEqual(c.input_ids);
      writeFileSync(`${dir}/chat_template.jinja`, '{{ bos_token }}X{% for m in messages %}{{ m.content }}{% endfor %}');
      const fromFile = (await loadTokenizer(dir))!;
      const r = applyChatTemplate(fromFile, [{ role: 'user', content: 'hi' }]);
      expect(r.text).toBe('<s>Xhi');
      expect(r.ids[0]).toBe(1);
      expect(r.ids.filter((t) => t === 1)).toHaveLength(1);
      writeFileSync(`${dir}/tokenizer_config.json`, JSON.stringify({ ...config, chat_template: 7 }));
      await expect(loadTokenizer(dir)).rejects.toThrow(/chat_template must be a string or a list/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('Qwen2 layer-dependent windows are refused, naming the field', () => {
    const cfg = JSON.parse(readFileSync(`${root}mistral-sw/config.json`, 'utf8')) as Record<string, unknown>;
    expect(() => parseLlamaConfig(JSON.stringify({ ...cfg, model_type: 'qwen2', use_sliding_window: true }))).toThrow(/use_sliding_window/);
    expect(parseLlamaConfig(JSON.stringify({ ...cfg, model_type: 'qwen2' })).slidingWindow).toBeUndefined();
  });
});
