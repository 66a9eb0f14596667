import { randomInt } from 'node:crypto';
import type { FastifyReply } from 'fastify';
import type { Engine } from '@stageml/engine';
import { IncrementalDetokenizer, type PickInfo, type SamplingOptions, type TokenConstraint } from '@stageml/models';
import type { GenerationResult, Route, Scheduler } from '@stageml/router';
import type { ServerMetrics } from './metrics.js';
import { ServerCode, ServerError } from './errors.js';

/** Sampling, penalty and length fields shared by completions and chat. */
export interface GenerationFields {
  readonly max_tokens?: number | null | undefined;
  readonly temperature?: number | null | undefined;
  readonly top_p?: number | null | undefined;
  readonly top_k?: number | null | undefined;
  readonly seed?: number | null | undefined;
  readonly stop?: string | string[] | null | undefined;
  readonly ignore_eos?: boolean | undefined;
  readonly pad_token_id?: number | undefined;
  readonly presence_penalty?: number | null | undefined;
  readonly frequency_penalty?: number | null | undefined;
  readonly repetition_penalty?: number | null | undefined;
  readonly logit_bias?: Readonly<Record<string, number>> | null | undefined;
  /** vLLM: more tokens that end generation (kept out of the text, as EOS; honoured with `ignore_eos` too). */
  readonly stop_token_ids?: readonly number[] | null | undefined;
  /** vLLM: no stop token or stop string ends generation before this many tokens. */
  readonly min_tokens?: number | null | undefined;
  /** vLLM: a matched stop string stays in the text. */
  readonly include_stop_str_in_output?: boolean | null | undefined;
  /** vLLM: false keeps special tokens in the text. */
  readonly skip_special_tokens?: boolean | null | undefined;
  /** vLLM: drop tokens less likely than this share of the most likely one (0: off). */
  readonly min_p?: number | null | undefined;
}

/** Limits the server enforces on every request. */
export interface Limits {
  /** Prompt plus completion tokens (`--max-model-len`, default the model's positions). */
  readonly maxModelLen: number;
  /** Most prompt tokens, when capped below the context. */
  readonly maxPromptTokens?: number | undefined;
  /** Most new tokens per request, when capped (no cap by default, as vLLM). */
  readonly maxNewTokens: number | undefined;
  readonly padTokenId: number | undefined;
}

/**
 * Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`): dividing logits by a tiny positive
 * temperature overflows to infinities and would pick one token forever.
 */
export const GREEDY_BELOW_TEMPERATURE = 1e-5;

/** The model surface the server needs of its engine. */
export type ServedModel = Pick<Engine, 'tokenizer' | 'config' | 'adapterNames'>;

/**
 * Sampling options from OpenAI fields: temperature 0 means greedy; with no `seed`, a random one
 * (so repeated requests differ, as OpenAI and vLLM); penalties and `logit_bias` as vLLM applies them.
 */
export function samplingOf(f: GenerationFields, seedOffset = 0): SamplingOptions {
  const processing = {
    ...(f.presence_penalty == null ? {} : { presencePenalty: f.presence_penalty }),
    ...(f.frequency_penalty == null ? {} : { frequencyPenalty: f.frequency_penalty }),
    ...(f.repetition_penalty == null ? {} : { repetitionPenalty: f.repetition_penalty }),
    ...(f.logit_bias == null ? {} : { logitBias: f.logit_bias as Record<number, number> }),
  };
  if (f.temperature != null && f.temperature < GREEDY_BELOW_TEMPERATURE) return { greedy: true, ...processing };
  return {
    ...processing,
    ...(f.temperature == null ? {} : { temperature: f.temperature }),
    ...(f.top_p == null ? {} : { topP: f.top_p }),
    ...(f.top_k == null || f.top_k <= 0 ? {} : { topK: f.top_k }),
    ...(f.min_p == null || f.min_p <= 0 ? {} : { minP: f.min_p }),
    seed: (f.seed ?? randomInt(2 ** 31)) + seedOffset,
  };
}

/**
 * `max_tokens` of a request: the requested number, or the remaining context under
 * `maxModelLen` (vLLM's default). Prompts that leave no room, or requests past the context or the
 * server's cap, are `SERVER_TOO_MANY_TOKENS` with vLLM's wording.
 */
export function maxTokensFor(limits: Limits, promptTokens: number, requested: number | null | undefined): number {
  const len = limits.maxModelLen;
  if (limits.maxPromptTokens !== undefined && promptTokens > limits.maxPromptTokens) {
    throw new ServerError(ServerCode.TOO_MANY_TOKENS, `the prompt has ${String(promptTokens)} tokens; the limit is ${String(limits.maxPromptTokens)}`);
  }
  if (promptTokens >= len) {
    throw new ServerError(ServerCode.TOO_MANY_TOKENS, `This model's maximum context length is ${String(len)} tokens. However, your prompt has ${String(promptTokens)} tokens, which leaves no room for a completion.`);
  }
  const maxTokens = requested ?? Math.min(len - promptTokens, limits.maxNewTokens ?? Infinity);
  if (promptTokens + maxTokens > len) {
    throw new ServerError(
      ServerCode.TOO_MANY_TOKENS,
      `This model's maximum context length is ${String(len)} tokens. However, you requested ${String(promptTokens + maxTokens)} tokens (${String(promptTokens)} in the prompt, ${String(maxTokens)} in the completion). Please reduce the length of the prompt or max_tokens.`,
    );
  }
  if (limits.maxNewTokens !== undefined && maxTokens > limits.maxNewTokens) {
    throw new ServerError(ServerCode.TOO_MANY_TOKENS, `max_tokens ${String(maxTokens)} exceeds the server's limit ${String(limits.maxNewTokens)}`);
  }
  return maxTokens;
}

/** One finished generation, ready to render as an OpenAI choice. */
export interface Outcome {
  readonly text: string;
  readonly ids: number[];
  readonly finishReason: 'stop' | 'length';
  readonly promptTokens: number;
  /** Prompt tokens the prefix cache served (`usage.prompt_tokens_details.cached_tokens`). */
  readonly cachedTokens: number;
  /** Per generated token, its log-probability and the top ones (when logprobs were asked for). */
  readonly picks: PickInfo[];
  /** Sum of the generated tokens' log-probabilities (with `picks`). */
  readonly cumulativeLogprob: number;
}

/** Per-request options of `runGeneration`. */
export interface RunOptions {
  /** Collect log-probabilities: the number of top ones per token (0: only the chosen token's). */
  readonly logprobs?: number | undefined;
  /** Added to the seed (the j-th of `n` samples). */
  readonly seedOffset?: number;
  /** Streaming: the text a step released, with the token ids and log-probabilities since the last call. */
  readonly onDelta?: (delta: string, ids: number[], picks: PickInfo[]) => void;
  readonly signal?: AbortSignal | undefined;
  /** Structured outputs: a fresh constraint for this generation (its mask applies to every pick). */
  readonly constraint?: (() => TokenConstraint) | undefined;
}

/**
 * Streams events of one generation as server-sent events (`data: …\n\n`, then `data: [DONE]`).
 * The 200 and its headers go out with the first event, not before: a request that fails
 * validation or admission before its first token still gets its 4xx/429 (with `Retry-After`).
 */
export class SseStream {
  #open = true;
  #started = false;
  readonly #preamble: unknown[] = [];
  constructor(private readonly reply: FastifyReply) {
    reply.raw.on('close', () => {
      this.#open = false;
    });
  }
  /** Whether the headers (and so a 200) have been sent. */
  get started(): boolean {
    return this.#started;
  }
  /** Queues an event sent ahead of the first `send` (the chat role chunk); sent at once when already started. */
  preamble(data: unknown): void {
    if (this.#started) this.send(data);
    else this.#preamble.push(data);
  }
  #start(): void {
    if (this.#started) return;
    this.#started = true;
    // A client that sent `Connection: close` gets it back, and the socket ends with the stream.
    const close = /(?:^|,)\s*close\s*(?:,|$)/i.test(this.reply.request.headers.connection ?? '');
    this.reply.raw.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: close ? 'close' : 'keep-alive' });
    for (const d of this.#preamble.splice(0)) this.reply.raw.write(`data: ${JSON.stringify(d)}\n\n`);
  }
  /** Whether the client is still connected. */
  get open(): boolean {
    return this.#open;
  }
  /** Sends one JSON event. */
  send(data: unknown): void {
    if (!this.#open) return;
    this.#start();
    this.reply.raw.write(`data: ${JSON.stringify(data)}\n\n`);
  }
  /** Ends the stream with `[DONE]`. */
  done(): void {
    if (this.#open) {
      this.#start();
      this.reply.raw.end('data: [DONE]\n\n');
    }
    this.#open = false;
  }
}

/** The ids that end a generation: EOS (unless `ignore_eos`) and vLLM's `stop_token_ids`. */
export function stopIdsOf(f: GenerationFields, eos: readonly number[]): number[] {
  return [...new Set([...(f.ignore_eos === true ? [] : eos), ...(f.stop_token_ids ?? [])])];
}

/** Records a finished generation's token counts, ending, latencies and prefix-cache counters. */
function recordGeneration(
  ctx: { metrics: ServerMetrics; prefixCaching?: boolean },
  labels: { model_name: string },
  g: { prompt: number; generated: number; cached: number; finishReason: string; submitted: number; firstAt: number | undefined; result: GenerationResult | undefined },
): void {
  const end = performance.now();
  ctx.metrics.promptTokens.inc(labels, g.prompt);
  ctx.metrics.generationTokens.inc(labels, g.generated);
  ctx.metrics.success.inc({ ...labels, finished_reason: g.finishReason });
  ctx.metrics.latency.observe(labels, (end - g.submitted) / 1000);
  if (g.firstAt !== undefined) ctx.metrics.ttft.observe(labels, (g.firstAt - g.submitted) / 1000);
  const queueMs = (g.result as { queueTimeMs?: unknown } | undefined)?.queueTimeMs;
  ctx.metrics.queueTime.observe(labels, (typeof queueMs === 'number' ? queueMs : (g.firstAt ?? end) - g.submitted) / 1000);
  if (g.result !== undefined) ctx.metrics.paths.inc({ path: g.result.path });
  if (ctx.prefixCaching === true) {
    ctx.metrics.prefixCacheQueries.inc(labels, g.prompt);
    ctx.metrics.prefixCacheHits.inc(labels, g.cached);
  }
}

/**
 * Runs one generation through the scheduler. Text comes from an incremental detokenizer (UTF-8
 * safe: incomplete sequences are held back), so streamed deltas and the non-streamed text are the
 * same string. Stop strings are searched in the released text (the match is cut, and while
 * streaming the last `longest stop − 1` characters are held back so no partial stop string is
 * sent). Records latency, time-to-first-token, inter-token and queue-time metrics for every
 * request that produced tokens, stop-string endings included.
 */
export async function runGeneration(
  ctx: { lm: ServedModel; scheduler: Scheduler; metrics: ServerMetrics; limits: Limits; modelName: string; /** Whether the engine's prefix cache is on (the `vllm:prefix_cache_*` counters move). */ prefixCaching?: boolean },
  route: Route,
  prompt: readonly number[],
  f: GenerationFields,
  opts: RunOptions = {},
): Promise<Outcome> {
  const { lm, limits } = ctx;
  const maxTokens = maxTokensFor(limits, prompt.length, f.max_tokens);
  const stops = f.stop == null ? [] : (Array.isArray(f.stop) ? f.stop : [f.stop]).filter((s) => s !== '');
  const hold = stops.length === 0 ? 0 : Math.max(...stops.map((s) => s.length)) - 1;
  const detok = lm.tokenizer === undefined ? undefined : new IncrementalDetokenizer(lm.tokenizer, { keepSpecial: f.skip_special_tokens === false });
  const minTokens = f.min_tokens ?? 0;
  const ids: number[] = [];
  const picks: PickInfo[] = [];
  let pendingIds: number[] = [];
  let pendingPicks: PickInfo[] = [];
  let sent = '';
  let stoppedBy: string | undefined;
  let lastPick: PickInfo | undefined;
  const inner = new AbortController();
  const onAbort = (): void => {
    inner.abort();
  };
  opts.signal?.addEventListener('abort', onAbort, { once: true });
  /**
   * Sends the text past `sent` with the tokens since the last delta. An empty delta waits for text
   * unless `final` — or the model has no tokenizer: then the token ids are all a stream carries, so
   * each goes out as it is chosen.
   */
  const release = (visible: string, final = false): void => {
    const delta = visible.slice(sent.length);
    if (delta === '' && (pendingIds.length === 0 || (!final && detok !== undefined))) return;
    sent = visible;
    opts.onDelta?.(delta, pendingIds, pendingPicks);
    pendingIds = [];
    pendingPicks = [];
  };
  const submitted = performance.now();
  let firstAt: number | undefined;
  let lastAt: number | undefined;
  const labels = { model_name: ctx.modelName };
  const sampling: SamplingOptions = {
    ...samplingOf(f, opts.seedOffset ?? 0),
    ...(opts.logprobs === undefined
      ? {}
      : {
          topLogprobs: opts.logprobs,
          onPick: (info: PickInfo) => {
            lastPick = info;
          },
        }),
    ...(f.repetition_penalty == null ? {} : { promptIds: prompt }),
    ...(opts.constraint === undefined ? {} : { constraint: opts.constraint() }),
  };
  let result: GenerationResult | undefined;
  try {
    result = await ctx.scheduler.submit({
      tenant: route.tenant,
      adapter: route.adapter,
      prompt,
      maxNewTokens: maxTokens,
      sampling,
      stopTokens: stopIdsOf(f, lm.config.eosTokenIds),
      padTokenId: f.pad_token_id ?? limits.padTokenId,
      signal: inner.signal,
      onToken: (id) => {
        if (stoppedBy !== undefined) return;
        const now = performance.now();
        if (lastAt !== undefined) ctx.metrics.interTokenLatency.observe(labels, (now - lastAt) / 1000);
        firstAt ??= now;
        lastAt = now;
        ids.push(id);
        pendingIds.push(id);
        if (lastPick !== undefined) {
          picks.push(lastPick);
          pendingPicks.push(lastPick);
          lastPick = undefined;
        }
        detok?.push(id);
        const text = detok?.text ?? '';
        if (stops.length > 0 && ids.length >= minTokens) {
          const from = Math.max(0, sent.length - hold);
          const hit = stops.map((s) => ({ s, at: text.indexOf(s, from) })).filter((h) => h.at >= 0).sort((a, b) => a.at - b.at)[0];
          if (hit !== undefined) {
            stoppedBy = hit.s;
            release(text.slice(0, hit.at + (f.include_stop_str_in_output === true ? hit.s.length : 0)), true);
            inner.abort();
            return;
          }
        }
        let cut = Math.max(sent.length, text.length - hold);
        // Never split a surrogate pair (an emoji) across two deltas.
        if (cut > sent.length && cut < text.length && /[\uD800-\uDBFF]/.test(text[cut - 1]!)) cut--;
        release(text.slice(0, cut));
      },
    });
  } catch (e) {
    if (stoppedBy === undefined) throw e;
  } finally {
    opts.signal?.removeEventListener('abort', onAbort);
  }
  if (stoppedBy === undefined) {
    detok?.flush();
    release(detok?.text ?? '', true);
  } else release(sent, true);
  const finishReason = stoppedBy !== undefined ? 'stop' : result!.finishReason;
  const cachedTokens = result?.cachedTokens ?? 0;
  recordGeneration(ctx, labels, { prompt: prompt.length, generated: ids.length, cached: cachedTokens, finishReason, submitted, firstAt, result });
  return { text: sent, ids, finishReason, promptTokens: prompt.length, cachedTokens, picks, cumulativeLogprob: picks.reduce((a, p) => a + p.logprob, 0) };
}
