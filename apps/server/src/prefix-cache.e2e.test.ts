import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { type StageServer, createServer } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const TEMPLATE = '{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:';
/** A 40-token prompt: two whole 16-token blocks short of its last token. */
const PROMPT = Array.from({ length: 40 }, (_, i) => 3 + ((i * 37) % 500));
const SYSTEM = 'You are a careful assistant who answers every question about the weather in great detail and with numbers.';

async function start(prefixCaching: boolean): Promise<{ server: StageServer; base: string }> {
  const server = await createServer({ modelDir: `${root}llama/base`, modelName: 'llama', adaptersDir: `${root}llama/adapters`, chatTemplate: TEMPLATE, maxBatch: 4, maxModelLen: 256, maxLoras: 4, maxLoraRank: 16, prefixCaching });
  return { server, base: await server.listen('127.0.0.1', 0) };
}

async function post(base: string, path: string, body: unknown): Promise<Record<string, unknown>> {
  const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  expect(r.status).toBe(200);
  return (await r.json()) as Record<string, unknown>;
}

/** The usage of a streamed completion (`stream_options.include_usage`) and its text. */
async function streamed(base: string, body: Record<string, unknown>): Promise<{ text: string; usage: Record<string, unknown> }> {
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }) });
  let text = '';
  let usage: Record<string, unknown> = {};
  for (const line of (await r.text()).split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const ev = JSON.parse(line.slice(6)) as { choices: { text?: string }[]; usage?: Record<string, unknown> };
    for (const c of ev.choices) text += c.text ?? '';
    if (ev.usage != null) usage = ev.usage;
  }
  return { text, usage };
}

async function counter(base: string, name: string): Promise<number | undefined> {
  const m = new RegExp(`^${name}\\{model_name="llama"\\} (\\S+)$`, 'm').exec(await (await fetch(`${base}/metrics`)).text());
  return m === null ? undefined : Number(m[1]);
}

describe('prefix caching through the HTTP server', () => {
  it('reports cached_tokens in usage (completions, chat, streaming) and the vllm:prefix_cache_* counters, with the same text as without', async () => {
    const runs: { texts: string[]; cached: number[] }[] = [];
    for (const on of [true, false]) {
      const { server, base } = await start(on);
      const texts: string[] = [];
      const cached: number[] = [];
      try {
        for (const model of ['llama', 'llama', 'qv-r8', 'qv-r8', 'o-r2']) {
          const r = await post(base, '/v1/completions', { model, prompt: PROMPT, max_tokens: 6, temperature: 0, ignore_eos: true });
          texts.push((r['choices'] as { text: string }[])[0]!.text);
          cached.push((r['usage'] as { prompt_tokens_details: { cached_tokens: number } }).prompt_tokens_details.cached_tokens);
        }
        const s = await streamed(base, { model: 'llama', prompt: [...PROMPT, 9, 9], max_tokens: 6, temperature: 0, ignore_eos: true });
        texts.push(s.text);
        cached.push((s.usage['prompt_tokens_details'] as { cached_tokens: number }).cached_tokens);
        for (const question of ['How warm is it today?', 'Will it rain tomorrow?']) {
          const r = await post(base, '/v1/chat/completions', { model: 'llama', messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: question }], max_tokens: 6, temperature: 0, ignore_eos: true });
          texts.push((r['choices'] as { message: { content: string } }[])[0]!.message.content);
          cached.push((r['usage'] as { prompt_tokens_details: { cached_tokens: number } }).prompt_tokens_details.cached_tokens);
        }
        const queries = await counter(base, 'vllm:prefix_cache_queries');
        const hits = await counter(base, 'vllm:prefix_cache_hits');
        if (on) {
          // Every prompt token was looked up; the hits are the cached tokens usage reported.
          expect(queries).toBeGreaterThanOrEqual(5 * 40 + 42);
          expect(hits).toBe(cached.reduce((a, b) => a + b, 0));
        } else expect([queries ?? 0, hits ?? 0]).toEqual([0, 0]);
      } finally {
        await server.shutdown();
      }
      runs.push({ texts, cached });
    }
    const [on, off] = runs as [(typeof runs)[0], (typeof runs)[0]];
    expect(on.texts).toEqual(off.texts);
    expect(off.cached.every((c) => c === 0)).toBe(true);
    // Base: miss, then its 32 whole-block tokens; qv-r8 adapts q/v (it reaches K/V): its own blocks;
    // o-r2 adapts o_proj of every layer but the last's reaches the next layer's K/V too: its own.
    expect(on.cached.slice(0, 5)).toEqual([0, 32, 0, 32, 0]);
    // The streamed prompt extends the base prompt: every block the base request cached, and more.
    expect(on.cached[5]).toBeGreaterThanOrEqual(32);
    // The second chat shares the system prompt's blocks with the first.
    expect(on.cached[7]).toBeGreaterThan(0);
  }, 120_000);
});
