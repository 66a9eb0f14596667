import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type StageServer, createServer } from './index.js';

// Each vLLM field with a test that fails when the field is ignored (issue 37 item 3).
const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, any>;
const prompt0 = golden['llama.base'].prompt0 as { input_ids: number[]; greedy_new_ids: number[] };

async function post(base: string, path: string, body: unknown): Promise<{ status: number; json: any }> {
  const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}

describe("vLLM's request fields, honoured or refused", () => {
  let server: StageServer;
  let base: string;
  const greedy = (extra: Record<string, unknown>) => post(base, '/v1/completions', { model: 'llama', prompt: prompt0.input_ids, max_tokens: 12, temperature: 0, ignore_eos: true, return_token_ids: true, ...extra });
  beforeAll(async () => {
    server = await createServer({ modelDir: `${root}llama/base`, modelName: 'llama', padTokenId: 0 });
    base = await server.listen('127.0.0.1', 0);
  });
  afterAll(async () => {
    await server.shutdown();
  });

  it('stop_token_ids ends at the first listed token (with ignore_eos too)', async () => {
    const g = prompt0.greedy_new_ids;
    const at = g.indexOf(g[3]!);
    const r = await greedy({ stop_token_ids: [g[3]] });
    expect(r.json.choices[0].finish_reason).toBe('stop');
    expect(r.json.choices[0].token_ids).toEqual(g.slice(0, at + 1));
  });

  it('min_tokens holds stop tokens back until that many were generated', async () => {
    const g = prompt0.greedy_new_ids;
    const r = await greedy({ stop_token_ids: [g[0]], min_tokens: 4 });
    const ids = r.json.choices[0].token_ids as number[];
    expect(ids.length).toBeGreaterThanOrEqual(4);
    expect(ids.slice(0, 3)).not.toContain(g[0]);
  });

  it('include_stop_str_in_output keeps the matched stop string', async () => {
    const plain = await post(base, '/v1/completions', { model: 'llama', prompt: 'The staged', max_tokens: 12, temperature: 0, ignore_eos: true });
    const text = plain.json.choices[0].text as string;
    const stop = text.slice(4, 6);
    const at = text.indexOf(stop);
    const cut = await post(base, '/v1/completions', { model: 'llama', prompt: 'The staged', max_tokens: 12, temperature: 0, ignore_eos: true, stop: [stop] });
    const kept = await post(base, '/v1/completions', { model: 'llama', prompt: 'The staged', max_tokens: 12, temperature: 0, ignore_eos: true, stop: [stop], include_stop_str_in_output: true });
    expect(cut.json.choices[0].text).toBe(text.slice(0, at));
    expect(kept.json.choices[0].text).toBe(text.slice(0, at + stop.length));
  });

  it('allowed_token_ids restricts every token; skip_special_tokens false keeps special tokens in the text', async () => {
    const allowed = [100, 200, 300];
    const r = await greedy({ allowed_token_ids: allowed, temperature: 1, seed: 4 });
    expect((r.json.choices[0].token_ids as number[]).every((t) => allowed.includes(t))).toBe(true);
    const bos = (await post(base, '/tokenize', { prompt: 'x', return_token_strs: true })).json;
    expect(bos.token_strs[0]).toBe('<|bos|>');
    const special = await greedy({ allowed_token_ids: [bos.tokens[0]], max_tokens: 3 });
    expect(special.json.choices[0].text).toBe('');
    const kept = await greedy({ allowed_token_ids: [bos.tokens[0]], max_tokens: 3, skip_special_tokens: false });
    expect(kept.json.choices[0].text).toBe('<|bos|><|bos|><|bos|>');
  });

  it('bad_words bans a word the greedy output starts with', async () => {
    const g = prompt0.greedy_new_ids;
    const word = (await post(base, '/detokenize', { tokens: [g[0]] })).json.prompt as string;
    const r = await greedy({ bad_words: [word.trim() === '' ? word : word.trim()] });
    expect(r.json.choices[0].token_ids[0]).not.toBe(g[0]);
  });

  it('min_p 1 keeps only the most likely token: sampling at temperature 1 gives the greedy output', async () => {
    const g = prompt0.greedy_new_ids;
    const sampled = await Promise.all([1, 2, 3].map((seed) => greedy({ temperature: 1, seed })));
    // Without min_p a random model's sampled tokens leave the greedy path.
    expect(sampled.some((r) => JSON.stringify(r.json.choices[0].token_ids) !== JSON.stringify(g.slice(0, 12)))).toBe(true);
    for (const seed of [1, 2, 3]) expect((await greedy({ temperature: 1, seed, min_p: 1 })).json.choices[0].token_ids).toEqual(g.slice(0, 12));
    expect((await greedy({ min_p: 1.5 })).status).toBe(400);
  });

  it("prompt_logprobs gives each prompt token's log-probability, rank and the k most likely, as echo's logprobs score them", async () => {
    const ids = prompt0.input_ids;
    const r = await greedy({ prompt_logprobs: 2, max_tokens: 1 });
    expect(r.status, JSON.stringify(r.json)).toBe(200);
    const pl = r.json.choices[0].prompt_logprobs as (Record<string, { logprob: number; rank: number; decoded_token: string }> | null)[];
    expect(pl).toHaveLength(ids.length);
    expect(pl[0]).toBeNull();
    const echo = await post(base, '/v1/completions', { model: 'llama', prompt: ids, max_tokens: 1, temperature: 0, echo: true, logprobs: 2 });
    const want = echo.json.choices[0].logprobs.token_logprobs as (number | null)[];
    for (let i = 1; i < ids.length; i++) {
      const entry = pl[i]!;
      const own = entry[String(ids[i])]!;
      expect(own.logprob).toBeCloseTo(want[i]!, 5);
      const ranked = Object.values(entry).sort((a, b) => a.rank - b.rank);
      expect(ranked[0]!.rank).toBe(1);
      expect(ranked.every((e) => e.logprob <= ranked[0]!.logprob)).toBe(true);
      expect(Object.keys(entry).length).toBe(own.rank <= 2 ? 2 : 3);
    }
    const chat = await post(base, '/v1/chat/completions', { model: 'llama', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, prompt_logprobs: 0 });
    const cpl = chat.json.prompt_logprobs as (Record<string, { rank: number }> | null)[];
    expect(cpl[0]).toBeNull();
    expect(cpl.slice(1).every((e) => Object.keys(e!).length === 1)).toBe(true);
    const streamed = await greedy({ prompt_logprobs: 1, stream: true });
    expect(streamed.status).toBe(400);
    expect(streamed.json.error.message).toContain("'prompt_logprobs'");
  });

  it('truncate_prompt_tokens keeps the end of the prompt', async () => {
    const r = await greedy({ truncate_prompt_tokens: 3 });
    expect(r.json.usage.prompt_tokens).toBe(3);
  });

  it('/tokenize return_token_strs gives the vocabulary strings', async () => {
    const r = await post(base, '/tokenize', { prompt: 'the staged', add_special_tokens: false, return_token_strs: true });
    expect(r.json.token_strs).toHaveLength(r.json.tokens.length);
    expect((r.json.token_strs as string[]).join('').replaceAll('Ġ', ' ')).toBe('the staged');
    expect((await post(base, '/tokenize', { prompt: 'x' })).json.token_strs).toBeNull();
  });

  it('spaces_between_special_tokens is accepted and, as in vLLM with a fast tokenizer, joins special tokens without spaces either way', async () => {
    const bos = (await post(base, '/tokenize', { prompt: 'x', return_token_strs: true })).json.tokens[0] as number;
    for (const spaces of [true, false]) {
      const r = await greedy({ allowed_token_ids: [bos], max_tokens: 2, skip_special_tokens: false, spaces_between_special_tokens: spaces });
      expect(r.json.choices[0].text).toBe('<|bos|><|bos|>');
    }
  });

  it('refuses beam search and length_penalty, naming each', async () => {
    for (const [field, value] of [['use_beam_search', true], ['length_penalty', 2]] as const) {
      const r = await greedy({ [field]: value });
      expect(r.status, field).toBe(400);
      expect(r.json.error.message).toContain(`'${field}'`);
    }
    expect((await greedy({ use_beam_search: false, length_penalty: 1, min_p: 0 })).status).toBe(200);
    expect((await greedy({ stop_token_ids: [512] })).status).toBe(400);
  });
});
