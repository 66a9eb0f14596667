import type { FastifyReply } from 'fastify';
import type { Engine } from '@stageml/engine';
import type { SamplingOptions } from '@stageml/models';
import type { GenerationResult, Route, Scheduler } from '@stageml/router';
import type { ServerMetrics } from './metrics.js';
import { ServerCode, ServerError } from './errors.js';

/** Sampling and length fields shared by completions and chat. */
export interface GenerationFields {
  readonly max_tokens?: number | undefined;
  readonly temperature?: number | undefined;
  readonly top_p?: number | undefined;
  readonly top_k?: number | undefined;
  readonly seed?: number | undefined;
  readonly stream?: boolean | undefined;
  readonly stop?: string | string[] | null | undefined;
  readonly ignore_eos?: boolean | undefined;
  readonly return_token_ids?: boolean | undefined;
  readonly pad_token_id?: number | undefined;
}

/** Limits the server enforces on every request. */
export interface Limits {
  readonly maxPromptTokens: number;
  readonly maxNewTokens: number;
  readonly defaultMaxTokens: number;
  readonly padTokenId: number | undefined;
}

/** Sampling options from OpenAI fields: temperature 0 means greedy. */
export function samplingOf(f: GenerationFields): SamplingOptions {
  if (f.temperature === 0) return { greedy: true };
  return {
    ...(f.temperature === undefined ? {} : { temperature: f.temperature }),
    ...(f.top_p === undefined ? {} : { topP: f.top_p }),
    ...(f.top_k === undefined || f.top_k <= 0 ? {} : { topK: f.top_k }),
    ...(f.seed === undefined ? {} : { seed: f.seed }),
  };
}

/** One finished (or streamed) generation, ready to render as an OpenAI response. */
export interface Outcome {
  readonly text: string;
  readonly ids: number[];
  readonly finishReason: 'stop' | 'length';
  readonly promptTokens: number;
}

/** Streams events of one generation as server-sent events (`data: …\n\n`, then `data: [DONE]`). */
export class SseStream {
  #open = true;
  constructor(private readonly reply: FastifyReply) {
    reply.raw.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
    reply.raw.on('close', () => {
      this.#open = false;
    });
  }
  /** Whether the client is still connected. */
  get open(): boolean {
    return this.#open;
  }
  /** Sends one JSON event. */
  send(data: unknown): void {
    if (this.#open) this.reply.raw.write(`data: ${JSON.stringify(data)}\n\n`);
  }
  /** Ends the stream with `[DONE]`. */
  done(): void {
    if (this.#open) this.reply.raw.end('data: [DONE]\n\n');
    this.#open = false;
  }
}

/**
 * Runs one generation through the scheduler: checks token limits, applies stop strings on the
 * decoded text (the matched stop string is cut from the text), streams deltas through `onDelta`,
 * and records metrics. Throws coded errors for limits, queue-full and validation problems.
 */
export async function runGeneration(
  ctx: { lm: Engine; scheduler: Scheduler; metrics: ServerMetrics; limits: Limits; modelName: string },
  route: Route,
  prompt: readonly number[],
  f: GenerationFields,
  onDelta?: (delta: string, id: number) => void,
  signal?: AbortSignal,
): Promise<Outcome> {
  const { lm, limits } = ctx;
  if (prompt.length > limits.maxPromptTokens) {
    throw new ServerError(ServerCode.TOO_MANY_TOKENS, `the prompt has ${String(prompt.length)} tokens; the limit is ${String(limits.maxPromptTokens)}`);
  }
  const maxTokens = f.max_tokens ?? limits.defaultMaxTokens;
  if (maxTokens > limits.maxNewTokens) throw new ServerError(ServerCode.TOO_MANY_TOKENS, `max_tokens ${String(maxTokens)} exceeds the limit ${String(limits.maxNewTokens)}`);
  if (prompt.length + maxTokens > lm.config.maxPositions) {
    throw new ServerError(ServerCode.TOO_MANY_TOKENS, `prompt (${String(prompt.length)}) + max_tokens (${String(maxTokens)}) exceeds the model's ${String(lm.config.maxPositions)} positions`);
  }
  const stops = f.stop === undefined || f.stop === null ? [] : (Array.isArray(f.stop) ? f.stop : [f.stop]).filter((s) => s !== '');
  const ids: number[] = [];
  let sent = '';
  let stoppedBy: string | undefined;
  const inner = new AbortController();
  const onAbort = (): void => {
    inner.abort();
  };
  signal?.addEventListener('abort', onAbort, { once: true });
  const decode = (xs: number[]): string => lm.tokenizer?.decode(xs) ?? '';
  let result: GenerationResult | undefined;
  try {
    result = await ctx.scheduler.submit({
      tenant: route.tenant,
      adapter: route.adapter,
      prompt,
      maxNewTokens: maxTokens,
      sampling: samplingOf(f),
      stopTokens: f.ignore_eos === true ? [] : lm.config.eosTokenIds,
      padTokenId: f.pad_token_id ?? limits.padTokenId,
      signal: inner.signal,
      onToken: (id) => {
        if (stoppedBy !== undefined) return;
        ids.push(id);
        const text = decode(ids);
        const hit = stops.map((s) => ({ s, at: text.indexOf(s) })).filter((h) => h.at >= 0).sort((a, b) => a.at - b.at)[0];
        const visible = hit === undefined ? text : text.slice(0, hit.at);
        if (visible.length > sent.length && visible.startsWith(sent)) {
          onDelta?.(visible.slice(sent.length), id);
          sent = visible;
        } else onDelta?.('', id);
        if (hit !== undefined) {
          stoppedBy = hit.s;
          inner.abort();
        }
      },
    });
  } catch (e) {
    if (stoppedBy === undefined) throw e;
  } finally {
    signal?.removeEventListener('abort', onAbort);
  }
  const finishReason = stoppedBy !== undefined ? 'stop' : result!.finishReason;
  const text = stoppedBy !== undefined ? sent : decode(ids);
  const labels = { model_name: ctx.modelName };
  ctx.metrics.promptTokens.inc(labels, prompt.length);
  ctx.metrics.generationTokens.inc(labels, ids.length);
  ctx.metrics.success.inc({ ...labels, finished_reason: finishReason });
  if (result !== undefined) {
    ctx.metrics.paths.inc({ path: result.path });
    ctx.metrics.latency.observe(labels, result.latencyMs / 1000);
    ctx.metrics.ttft.observe(labels, result.timeToFirstTokenMs / 1000);
  }
  return { text, ids, finishReason, promptTokens: prompt.length };
}
