// Server-sent events of the OpenAI-style streaming endpoints, as the serving benchmarks read them,
// and the decode timings read off the arrival times of their token events.

/**
 * Splits the complete events off the front of `buf` (text received so far): each event's `data:`
 * payload (its `data:` lines joined by newlines; events without one and `[DONE]` left out) and the
 * unfinished rest. Events end at a blank line (`\n\n`, or `\r\n\r\n`).
 */
export function splitEvents(buf: string): { data: string[]; rest: string } {
  const data: string[] = [];
  const text = buf.includes('\r') ? buf.replace(/\r\n?/g, '\n') : buf;
  let from = 0;
  let end: number;
  while ((end = text.indexOf('\n\n', from)) >= 0) {
    const lines = text.slice(from, end).split('\n');
    from = end + 2;
    const payload = lines.filter((l) => l.startsWith('data:')).map((l) => l.slice(l.startsWith('data: ') ? 6 : 5));
    if (payload.length > 0 && !(payload.length === 1 && payload[0] === '[DONE]')) data.push(payload.join('\n'));
  }
  return { data, rest: text.slice(from) };
}

/** Calls `on` with each `data:` payload of a server-sent event stream as it arrives (`[DONE]` left out). */
export async function streamEvents(r: Response, on: (data: string) => void): Promise<void> {
  const reader = r.body!.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    const { data, rest } = splitEvents(buf + dec.decode(value, { stream: true }));
    buf = rest;
    for (const d of data) on(d);
  }
}

/** One streamed event that carried tokens: when it arrived (ms) and how many tokens it carried. */
export interface TokenArrival {
  readonly at: number;
  readonly tokens: number;
}

/**
 * The gap (ms) before each token after the stream's first event: an event of n tokens that came
 * d ms after the one before gives n gaps of d / n (a step whose tokens were sent together is one
 * decode step per token all the same). The first event's tokens have no gap (they follow the
 * prefill); events of no tokens are skipped.
 */
export function tokenGaps(arrivals: readonly TokenArrival[]): number[] {
  const gaps: number[] = [];
  let last: number | undefined;
  for (const a of arrivals) {
    if (a.tokens <= 0) continue;
    if (last !== undefined) for (let i = 0; i < a.tokens; i++) gaps.push((a.at - last) / a.tokens);
    last = a.at;
  }
  return gaps;
}

/** The decode phase of concurrent streams: tokens that arrived in it, its length (ms) and their rate. */
export interface DecodePhase {
  readonly tokens: number;
  readonly ms: number;
  readonly tokensPerSecond: number;
}

/**
 * The decode phase of streams that ran concurrently: from the moment every stream had its first
 * token (each prompt prefilled) to the last token of any; its tokens are those arriving after that
 * moment. Undefined when a stream had no token or the phase is empty.
 */
export function decodePhase(streams: readonly (readonly TokenArrival[])[]): DecodePhase | undefined {
  const firsts = streams.map((s) => s.find((a) => a.tokens > 0)?.at);
  if (streams.length === 0 || firsts.some((t) => t === undefined)) return undefined;
  const start = Math.max(...(firsts as number[]));
  let end = start;
  let tokens = 0;
  for (const s of streams) {
    for (const a of s) {
      if (a.tokens <= 0 || a.at <= start) continue;
      tokens += a.tokens;
      end = Math.max(end, a.at);
    }
  }
  const ms = end - start;
  return tokens === 0 || ms <= 0 ? undefined : { tokens, ms, tokensPerSecond: tokens / (ms / 1000) };
}

/** Streams one greedy completion of token ids (`ignore_eos`, usage included): its token ids, the time to the first one (ms) and the prompt tokens the server served from its prefix cache. */
export async function streamCompletion(base: string, model: string, prompt: readonly number[], maxTokens: number): Promise<{ ids: number[]; ttftMs: number; cached: number }> {
  const start = performance.now();
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true, return_token_ids: true, stream_options: { include_usage: true } }) });
  if (r.status !== 200) throw new Error(`status ${String(r.status)}: ${await r.text()}`);
  const ids: number[] = [];
  let first: number | undefined;
  let cached = 0;
  await streamEvents(r, (ev) => {
    const j = JSON.parse(ev) as { choices?: { token_ids?: number[] }[]; usage?: { prompt_tokens_details?: { cached_tokens: number } }; error?: { message: string } };
    if (j.error !== undefined) throw new Error(j.error.message);
    for (const t of j.choices?.[0]?.token_ids ?? []) {
      first ??= performance.now();
      ids.push(t);
    }
    cached = j.usage?.prompt_tokens_details?.cached_tokens ?? cached;
  });
  return { ids, ttftMs: first! - start, cached };
}

/** The median of `xs` (the mean of the middle two for an even count). */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 === 1 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}
