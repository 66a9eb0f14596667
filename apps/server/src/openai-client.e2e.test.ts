import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { Engine, generateWithEngine } from '@stageml/engine';
import { logSoftmax } from '@stageml/models';
import { SafetensorsFile } from '@stageml/safetensors';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type StageServer, createServer } from './index.js';

// Drives the server with the official `openai` npm client, on fixtures made by transformers 5.17 +
// PEFT 0.21 (tools/gen_fixtures_v2.py): a Mistral with sliding_window 16, a byte-fallback
// tokenizer and chat_template.jinja, adapters a and b; and the byte-level llama of peft-tiny.
const v2 = fileURLToPath(new URL('../../../fixtures/hf-v2/', import.meta.url));
const tiny = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${v2}golden.json`, 'utf8')) as Record<string, any>;
const prompts: string[] = golden['prompts'];
const greedyOf = (model: string, i: number): number[] => golden[`mistral.${model}`].prompts[`prompt${String(i)}`].greedy_new_ids;
const idsOf = (i: number): number[] => golden['mistral.base'].prompts[`prompt${String(i)}`].input_ids;
const chats: { messages: { role: string; content: string }[]; input_ids: number[]; greedy_new_ids: number[] }[] = golden['mistral.chat'];
const KEY = 'K';
const MAX_LEN = 100;

let server: StageServer;
let llama: StageServer;
let client: OpenAI;
let llamaClient: OpenAI;
let base: string;
let lm: Engine;
const lastLogits: Record<string, Float32Array> = {};

/** Extra (vLLM) body fields the client's types do not list. */
const extra = (o: Record<string, unknown>) => o as Record<string, never>;

beforeAll(async () => {
  server = await createServer({
    modelDir: `${v2}mistral-sw`,
    modelName: 'mistral',
    modelAliases: ['mistral-alias'],
    loraModules: { a: `${v2}mistral-sw/adapters/a`, b: `${v2}mistral-sw/adapters/b` },
    apiKey: KEY,
    maxModelLen: MAX_LEN,
    maxLoras: 4,
    maxBatch: 8,
  });
  base = await server.listen('127.0.0.1', 0);
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 });
  llama = await createServer({ modelDir: `${tiny}llama/base`, modelName: 'llama', adaptersDir: `${tiny}llama/adapters`, maxBatch: 8 });
  llamaClient = new OpenAI({ baseURL: `${await llama.listen('127.0.0.1', 0)}/v1`, apiKey: 'none', maxRetries: 0 });
  lm = await Engine.load(`${v2}mistral-sw`, { maxLoras: 1 });
  const f = await SafetensorsFile.open(`${v2}golden.safetensors`);
  for (const k of f.names()) {
    const t = await f.readTensor(k);
    const V = t.shape[1]!;
    lastLogits[k] = Float32Array.from(t.data.subarray(t.data.length - V));
  }
  await f.close();
});
afterAll(async () => {
  await server.shutdown();
  await llama.shutdown();
  lm.dispose();
});

async function streamText<T>(chunks: AsyncIterable<T>, pick: (c: T) => string | undefined): Promise<{ text: string; chunks: T[] }> {
  const all: T[] = [];
  let text = '';
  for await (const c of chunks) {
    all.push(c);
    text += pick(c) ?? '';
  }
  return { text, chunks: all };
}

describe('completions through the openai client', () => {
  it('greedy tokens and text equal transformers for base and adapters (text prompts past the window)', async () => {
    for (const model of ['mistral', 'a', 'b']) {
      for (let i = 0; i < prompts.length; i++) {
        const r = await client.completions.create({ model, prompt: prompts[i]!, max_tokens: 16, temperature: 0, ...extra({ ignore_eos: true, return_token_ids: true }) });
        const want = greedyOf(model === 'mistral' ? 'base' : model, i);
        expect((r.choices[0] as any).token_ids, `${model} prompt${String(i)}`).toEqual(want);
        expect(r.choices[0]!.text).toBe(lm.tokenizer!.decode(want));
        expect(r.usage).toEqual({ prompt_tokens: idsOf(i).length, completion_tokens: 16, total_tokens: idsOf(i).length + 16, prompt_tokens_details: { cached_tokens: expect.any(Number) } });
      }
    }
  });

  it('prompt arrays (text and ids) give one choice per prompt; aliases of the base model work', async () => {
    const r = await client.completions.create({ model: 'mistral-alias', prompt: [prompts[0]!, prompts[1]!], max_tokens: 16, temperature: 0, ...extra({ ignore_eos: true, return_token_ids: true }) });
    expect(r.model).toBe('mistral-alias');
    expect(r.choices.map((c) => c.index)).toEqual([0, 1]);
    expect(r.choices.map((c) => (c as any).token_ids)).toEqual([greedyOf('base', 0), greedyOf('base', 1)]);
    expect(r.usage!.prompt_tokens).toBe(idsOf(0).length + idsOf(1).length);
    const ids = await client.completions.create({ model: 'a', prompt: [idsOf(2), idsOf(3)], max_tokens: 16, temperature: 0, ...extra({ ignore_eos: true, return_token_ids: true }) });
    expect(ids.choices.map((c) => (c as any).token_ids)).toEqual([greedyOf('a', 2), greedyOf('a', 3)]);
  });

  it('streams deltas that add up to the non-streamed text, with a separate usage chunk (choices: []) when asked', async () => {
    const body = { model: 'b', prompt: prompts[1]!, max_tokens: 16, temperature: 0, ...extra({ ignore_eos: true }) };
    const full = await client.completions.create(body);
    const s = await streamText(await client.completions.create({ ...body, stream: true, stream_options: { include_usage: true } }), (c) => c.choices[0]?.text);
    expect(s.text).toBe(full.choices[0]!.text);
    const last = s.chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    // The same prompt again: every whole 16-token block short of its last token comes from the prefix cache.
    expect(last.usage).toEqual({ ...full.usage, prompt_tokens_details: { cached_tokens: Math.floor((full.usage!.prompt_tokens - 1) / 16) * 16 } });
    expect(s.chunks.at(-2)!.choices[0]!.finish_reason).toBe('length');
    const plain = await streamText(await client.completions.create({ ...body, stream: true }), (c) => c.choices[0]?.text);
    expect(plain.chunks.every((c) => c.choices.length === 1 && c.usage == null)).toBe(true);
  });

  it('streamed text equals non-streamed text on sampled output full of <0x..> byte tokens and byte-level BPE pieces (accented, CJK, emoji prompts)', async () => {
    const texts = ['Café au lait, naïve résumé:', '中文分词测试：模型在边界上解码。', 'Emoji 🤖🚀 and flags 🇫🇷 ☕'];
    for (const [c, model] of [
      [client, 'mistral'],
      [llamaClient, 'qv-r8'],
    ] as const) {
      for (const [i, prompt] of texts.entries()) {
        const body = { model, prompt, max_tokens: 24, temperature: 1.8, seed: 100 + i, ...extra({ ignore_eos: true }) };
        const full = await c.completions.create(body);
        const s = await streamText(await c.completions.create({ ...body, stream: true }), (x) => x.choices[0]?.text);
        expect(s.text, `${model}: ${prompt}`).toBe(full.choices[0]!.text);
        const chat = { model, messages: [{ role: 'user' as const, content: prompt }], max_tokens: 24, temperature: 1.8, seed: 7 + i, ...extra({ ignore_eos: true }) };
        const fullChat = await c.chat.completions.create(chat);
        const sc = await streamText(await c.chat.completions.create({ ...chat, stream: true }), (x) => x.choices[0]?.delta.content ?? undefined);
        expect(sc.text, `${model} chat: ${prompt}`).toBe(fullChat.choices[0]!.message.content);
      }
    }
  });

  it('a concurrent mixed load on the windowed model (base and adapters, left-padded caches) keeps every golden', async () => {
    const jobs = ['mistral', 'a', 'b'].flatMap((model) =>
      prompts.map(async (prompt, i) => {
        const r = await client.completions.create({ model, prompt, max_tokens: 16, temperature: 0, ...extra({ ignore_eos: true, return_token_ids: true }) });
        expect((r.choices[0] as any).token_ids, `${model} prompt${String(i)}`).toEqual(greedyOf(model === 'mistral' ? 'base' : model, i));
      }),
    );
    await Promise.all(jobs);
  });

  it('the issue 18 regression: 24 streamed tokens equal the non-streamed text on every peft-tiny prompt × model', async () => {
    const tinyGolden = JSON.parse(readFileSync(`${tiny}golden.json`, 'utf8')) as { prompts: string[]; families: { llama: { adapters: string[] } } };
    for (const model of ['llama', ...tinyGolden.families.llama.adapters]) {
      for (const prompt of [...tinyGolden.prompts, 'The staged program']) {
        const body = { model, prompt, max_tokens: 24, temperature: 0, ...extra({ ignore_eos: true }) };
        const full = await llamaClient.completions.create(body);
        const s = await streamText(await llamaClient.completions.create({ ...body, stream: true }), (c) => c.choices[0]?.text);
        expect(s.text, `${model}: ${prompt}`).toBe(full.choices[0]!.text);
      }
    }
  });

  it('best_of returns the sample with the highest cumulative log-probability', async () => {
    const body = { model: 'mistral', prompt: prompts[1]!, max_tokens: 6, temperature: 1.5, seed: 9, logprobs: 0, ...extra({ ignore_eos: true }) };
    const all = await client.completions.create({ ...body, n: 3 });
    const sums = all.choices.map((c) => c.logprobs!.token_logprobs!.reduce((a, x) => a + x, 0));
    const best = await client.completions.create({ ...body, n: 1, best_of: 3 });
    expect(best.choices[0]!.text).toBe(all.choices[sums.indexOf(Math.max(...sums))]!.text);
  });

  it('n samples differ, repeat with a seed, and differ across requests without one; best_of keeps n', async () => {
    const body = { model: 'mistral', prompt: prompts[0]!, max_tokens: 8, temperature: 1.5, n: 3, seed: 42, ...extra({ ignore_eos: true }) };
    const r1 = await client.completions.create(body);
    const r2 = await client.completions.create(body);
    expect(r1.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    expect(new Set(r1.choices.map((c) => c.text)).size).toBeGreaterThan(1);
    expect(r2.choices.map((c) => c.text)).toEqual(r1.choices.map((c) => c.text));
    expect(r1.usage!.completion_tokens).toBe(24);
    const unseeded = { model: body.model, prompt: body.prompt, temperature: body.temperature, ...extra({ ignore_eos: true }) };
    const u1 = await client.completions.create({ ...unseeded, n: 1, max_tokens: 16 });
    const u2 = await client.completions.create({ ...unseeded, n: 1, max_tokens: 16 });
    expect(u1.choices[0]!.text).not.toBe(u2.choices[0]!.text);
    const best = await client.completions.create({ ...body, n: 1, best_of: 3 });
    expect(best.choices).toHaveLength(1);
    await expect(client.completions.create({ ...body, n: 2, best_of: 1 })).rejects.toThrow(/best_of/);
  });

  it('logprobs: the greedy token and top_logprobs match transformers logits; echo returns the prompt with its logprobs', async () => {
    const r = await client.completions.create({ model: 'a', prompt: prompts[2]!, max_tokens: 4, temperature: 0, logprobs: 3, ...extra({ ignore_eos: true }) });
    const lp = r.choices[0]!.logprobs!;
    expect(lp.tokens).toHaveLength(4);
    expect(lp.top_logprobs![0]!).toHaveProperty(lp.tokens![0]!);
    expect(Object.keys(lp.top_logprobs![0]!)).toHaveLength(3);
    const want = logSoftmax(lastLogits['mistral.a.prompt2.logits']!);
    expect(lp.token_logprobs![0]!).toBeCloseTo(want[greedyOf('a', 2)[0]!]!, 4);
    expect(Math.max(...Object.values(lp.top_logprobs![0]!))).toBeCloseTo(lp.token_logprobs![0]!, 6);
    const echo = await client.completions.create({ model: 'a', prompt: prompts[2]!, max_tokens: 4, temperature: 0, logprobs: 1, echo: true, ...extra({ ignore_eos: true }) });
    expect(echo.choices[0]!.text).toBe(prompts[2]! + r.choices[0]!.text);
    expect(echo.choices[0]!.logprobs!.token_logprobs).toHaveLength(idsOf(2).length + 4);
    expect(echo.choices[0]!.logprobs!.token_logprobs![0]).toBeNull();
    expect(echo.choices[0]!.logprobs!.token_logprobs!.slice(-4)).toEqual(lp.token_logprobs!.map((x) => expect.closeTo(x, 6)));
    const plainEcho = await client.completions.create({ model: 'a', prompt: prompts[2]!, max_tokens: 4, temperature: 0, echo: true, stream: true, ...extra({ ignore_eos: true }) });
    expect((await streamText(plainEcho, (c) => c.choices[0]?.text)).text).toBe(echo.choices[0]!.text);
  });

  it('penalties and logit_bias act as the library applies them', async () => {
    const prompt = idsOf(1);
    for (const [fields, sampling] of [
      [{ presence_penalty: 1.5 }, { presencePenalty: 1.5 }],
      [{ frequency_penalty: 2 }, { frequencyPenalty: 2 }],
      [{ repetition_penalty: 1.3 }, { repetitionPenalty: 1.3, promptIds: prompt }],
    ] as const) {
      const r = await client.completions.create({ model: 'mistral', prompt, max_tokens: 12, temperature: 0, ...fields, ...extra({ ignore_eos: true, return_token_ids: true }) });
      const lib = await generateWithEngine(lm, prompt, { maxNewTokens: 12, stopTokens: [], sampling: { greedy: true, ...sampling } });
      expect((r.choices[0] as any).token_ids, JSON.stringify(fields)).toEqual(lib.newIds);
    }
    const biased = await client.completions.create({ model: 'mistral', prompt, max_tokens: 5, temperature: 0, logit_bias: { '300': 100 }, ...extra({ ignore_eos: true, return_token_ids: true }) });
    expect((biased.choices[0] as any).token_ids).toEqual([300, 300, 300, 300, 300]);
    await expect(client.completions.create({ model: 'mistral', prompt, max_tokens: 2, presence_penalty: 3 })).rejects.toThrow(/presence_penalty/);
    await expect(client.completions.create({ model: 'mistral', prompt, max_tokens: 2, logit_bias: { '512': 1 } })).rejects.toThrow(/'logit_bias': token id 512/);
  });

  it('max_tokens defaults to the remaining context under --max-model-len; longer requests are 400', async () => {
    const r = await client.completions.create({ model: 'mistral', prompt: prompts[0]!, temperature: 0, ...extra({ ignore_eos: true }) });
    expect(r.usage!.completion_tokens).toBe(MAX_LEN - idsOf(0).length);
    expect(r.choices[0]!.finish_reason).toBe('length');
    await expect(client.completions.create({ model: 'mistral', prompt: prompts[0]!, max_tokens: MAX_LEN })).rejects.toThrow(/maximum context length is 100/);
  });

  it('stop strings cut the text (streamed equal), and such requests are counted in the histograms', async () => {
    const full = await client.completions.create({ model: 'mistral', prompt: prompts[3]!, max_tokens: 16, temperature: 0, ...extra({ ignore_eos: true }) });
    const text = full.choices[0]!.text;
    const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 2);
    const before = await (await fetch(`${base}/metrics`)).text();
    const cut = await client.completions.create({ model: 'mistral', prompt: prompts[3]!, max_tokens: 16, temperature: 0, stop: [stop], ...extra({ ignore_eos: true }) });
    expect(cut.choices[0]!.finish_reason).toBe('stop');
    expect(cut.choices[0]!.text).toBe(text.slice(0, text.indexOf(stop)));
    const s = await streamText(await client.completions.create({ model: 'mistral', prompt: prompts[3]!, max_tokens: 16, temperature: 0, stop: [stop], stream: true, ...extra({ ignore_eos: true }) }), (c) => c.choices[0]?.text);
    expect(s.text).toBe(cut.choices[0]!.text);
    const after = await (await fetch(`${base}/metrics`)).text();
    const count = (t: string, name: string) => Number(new RegExp(`^${name}_count\\{model_name="mistral"\\} (\\d+)`, 'm').exec(t)?.[1] ?? 0);
    for (const h of ['vllm:e2e_request_latency_seconds', 'vllm:time_to_first_token_seconds', 'vllm:request_queue_time_seconds']) expect(count(after, h) - count(before, h), h).toBe(2);
    expect(count(after, 'vllm:inter_token_latency_seconds')).toBeGreaterThan(count(before, 'vllm:inter_token_latency_seconds'));
    expect(after).toMatch(/^vllm:kv_cache_usage_perc\{model_name="mistral"\} 0$/m);
    expect(after).toContain('max_lora="4"');
  });
});

describe('chat through the openai client', () => {
  it('prompt ids equal apply_chat_template (chat_template.jinja, one BOS) and greedy tokens equal transformers', async () => {
    for (const c of chats) {
      const r = await client.chat.completions.create({ model: 'mistral', messages: c.messages as any, max_completion_tokens: 12, temperature: 0, ...extra({ ignore_eos: true, return_token_ids: true }) });
      expect(r.usage!.prompt_tokens).toBe(c.input_ids.length);
      expect((r.choices[0] as any).token_ids).toEqual(c.greedy_new_ids);
      expect(r.choices[0]!.message).toEqual({ role: 'assistant', content: lm.tokenizer!.decode(c.greedy_new_ids) });
      const tok = (await (await fetch(`${base}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` }, body: JSON.stringify({ model: 'mistral', messages: c.messages }) })).json()) as { tokens: number[] };
      expect(tok.tokens).toEqual(c.input_ids);
    }
  });

  it('content parts and the developer role render as their string forms', async () => {
    const c = chats[2]!;
    const parts = c.messages.map((m) => ({ role: m.role, content: [{ type: 'text', text: m.content }] }));
    const r = await client.chat.completions.create({ model: 'mistral', messages: parts as any, max_completion_tokens: 12, temperature: 0, ...extra({ ignore_eos: true, return_token_ids: true }) });
    expect(r.usage!.prompt_tokens).toBe(c.input_ids.length);
    expect((r.choices[0] as any).token_ids).toEqual(c.greedy_new_ids);
    await expect(client.chat.completions.create({ model: 'mistral', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] })).rejects.toThrow(/image_url/);
  });

  it('streams with a role chunk, content deltas equal to the message, and include_usage; logprobs in chat format', async () => {
    const body = { model: 'a', messages: chats[0]!.messages as any, max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 2, ...extra({ ignore_eos: true }) };
    const full = await client.chat.completions.create(body);
    const content = full.choices[0]!.logprobs!.content!;
    expect(content).toHaveLength(10);
    expect(content[0]!.top_logprobs).toHaveLength(2);
    expect(content[0]!.top_logprobs[0]!.logprob).toBeCloseTo(content[0]!.logprob, 6);
    // Token strings are in context (' of', not 'of'), so here they add up to the message.
    expect(content.map((t) => t.token).join('')).toBe(full.choices[0]!.message.content);
    const s = await streamText(await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } }), (c) => c.choices[0]?.delta.content ?? undefined);
    expect(s.chunks[0]!.choices[0]!.delta.role).toBe('assistant');
    expect(s.text).toBe(full.choices[0]!.message.content);
    expect(s.chunks.flatMap((c) => c.choices[0]?.logprobs?.content ?? []).map((t) => t.logprob)).toEqual(content.map((t) => expect.closeTo(t.logprob, 9)));
    expect(s.chunks.at(-1)!.choices).toEqual([]);
    expect(s.chunks.at(-1)!.usage).toEqual({ ...full.usage, prompt_tokens_details: { cached_tokens: Math.floor((full.usage!.prompt_tokens - 1) / 16) * 16 } });
  });

  it('streamed n > 1 chat choices each add up to the non-streamed ones (same seed)', async () => {
    const body = { model: 'b', messages: chats[1]!.messages as any, max_completion_tokens: 10, temperature: 1.2, n: 2, ...extra({ seed: 11, ignore_eos: true }) };
    const full = await client.chat.completions.create(body);
    const texts: string[] = ['', ''];
    for await (const c of await client.chat.completions.create({ ...body, stream: true })) for (const ch of c.choices) texts[ch.index] = `${texts[ch.index] ?? ''}${ch.delta.content ?? ''}`;
    expect(texts).toEqual(full.choices.map((c) => c.message.content));
    await expect(client.chat.completions.create({ ...body, stream_options: { include_usage: true } })).rejects.toThrow(/'stream_options'/);
  });

  it('chat max_tokens defaults to the remaining context; n > 1 gives n choices', async () => {
    const r = await client.chat.completions.create({ model: 'mistral', messages: chats[0]!.messages as any, temperature: 1, n: 2, ...extra({ seed: 3, ignore_eos: true }) });
    expect(r.choices.map((c) => c.index)).toEqual([0, 1]);
    expect(r.usage!.completion_tokens).toBe(2 * (MAX_LEN - chats[0]!.input_ids.length));
  });
});

describe('errors, models and vLLM extras', () => {
  it('unsupported fields answer 400 naming the field', async () => {
    const m = { model: 'mistral', messages: [{ role: 'user' as const, content: 'hi' }], max_tokens: 2 };
    // Auto tool choice (the default with tools) needs --enable-auto-tool-choice, as vLLM.
    await expect(client.chat.completions.create({ ...m, tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] })).rejects.toThrow(/--enable-auto-tool-choice/);
    expect((await client.chat.completions.create({ ...m, response_format: { type: 'json_object' } })).choices[0]!.message.content).toMatch(/^\{/);
    expect((await client.chat.completions.create({ ...m, response_format: { type: 'text' } })).choices).toHaveLength(1);
    await expect(client.completions.create({ model: 'mistral', prompt: 'x', suffix: 'y' })).rejects.toThrow(/'suffix'/);
  });

  it('GET /v1/models/{id}: base, alias and adapters; 404 for others', async () => {
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(['mistral', 'mistral-alias', 'a', 'b']);
    expect((await client.models.retrieve('b')).id).toBe('b');
    expect((await client.models.retrieve('mistral')) as any).toMatchObject({ id: 'mistral', max_model_len: MAX_LEN, parent: null });
    await expect(client.models.retrieve('nope')).rejects.toBeInstanceOf(OpenAI.NotFoundError);
  });

  it('--api-key: /v1 requests without the key are 401', async () => {
    const anon = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await expect(anon.models.list()).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
    expect((await fetch(`${base}/health`)).status).toBe(200);
  });

  it('/tokenize, /detokenize (behind the API key, as /v1) and /version', async () => {
    const post = async (path: string, body: unknown) => (await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` }, body: JSON.stringify(body) })).json() as Promise<any>;
    expect((await fetch(`${base}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'x' }) })).status).toBe(401);
    const t = await post('/tokenize', { model: 'mistral', prompt: prompts[0] });
    expect(t).toEqual({ count: idsOf(0).length, max_model_len: MAX_LEN, tokens: idsOf(0), token_strs: null });
    expect((await post('/tokenize', { prompt: prompts[0], add_special_tokens: false })).tokens).toEqual(idsOf(0).slice(1));
    expect(await post('/detokenize', { model: 'mistral', tokens: idsOf(0) })).toEqual({ prompt: prompts[0] });
    expect((await post('/detokenize', { tokens: [99999] })).error.message).toContain('99999');
    expect(await (await fetch(`${base}/version`)).json()).toEqual({ version: expect.stringMatching(/^\d+\.\d+\.\d+/) });
  });
});

describe('engine hooks', () => {
  it('vllm:kv_cache_usage_perc reads the engine callback', async () => {
    let usage = 0.25;
    const s = await createServer({ modelDir: `${tiny}llama/base`, modelName: 'llama', kvCacheUsage: () => usage });
    try {
      const scrape = async () => (await s.app.inject({ method: 'GET', url: '/metrics' })).body;
      expect(await scrape()).toMatch(/^vllm:kv_cache_usage_perc\{model_name="llama"\} 0\.25$/m);
      usage = 0.5;
      expect(await scrape()).toMatch(/^vllm:kv_cache_usage_perc\{model_name="llama"\} 0\.5$/m);
    } finally {
      await s.shutdown();
    }
  });
});

describe('stop strings and emoji', () => {
  it('while holding back for a stop string, no delta ends inside a surrogate pair', async () => {
    const body = { model: 'qv-r8', prompt: 'Emoji 🤖🚀 and flags 🇫🇷 ☕', max_tokens: 24, temperature: 1.8, seed: 5, stop: ['zzzzzz'], ...extra({ ignore_eos: true }) };
    const full = await llamaClient.completions.create(body);
    const s = await streamText(await llamaClient.completions.create({ ...body, stream: true }), (c) => c.choices[0]?.text);
    expect(s.text).toBe(full.choices[0]!.text);
    for (const c of s.chunks) expect(c.choices[0]?.text ?? '').not.toMatch(/[\uD800-\uDBFF]$/);
  });
});
