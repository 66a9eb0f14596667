import { randomUUID } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { StageError, errorMessage } from '@stageml/ir';
import { type PickInfo, type TokenConstraint, logSoftmax, topOf } from '@stageml/models';
import { type Route, RouterCode, RouterError } from '@stageml/router';
import { bearer } from '../auth.js';
import { chatPromptIds } from '../chat-template.js';
import type { ServerContext } from '../context.js';
import { ServerCode, ServerError, errorType, statusOf } from '../errors.js';
import { type GenerationFields, type Outcome, type RunOptions, SseStream, maxTokensFor, runGeneration, stopIdsOf } from '../generation.js';
import { badWordIds, checkVllmFields, tokenFilter, truncatePrompt } from '../vllm-fields.js';
import { type CompletionLogprobs, type PromptLogprobEntry, type RankedPick, chatLogprobs, completionLogprobs, mergeCompletionLogprobs, vllmPromptLogprobs } from '../logprobs.js';
import { type ChatRequest, type CompletionRequest, chatSchema, completionSchema, contentText, unsupportedField } from '../schemas.js';
import { constraintFactory, constraintSpecOf } from '../structured-request.js';
import { type ToolPlan, ToolDeltaStream, templateMessages, toolChoiceOf, toolPlanOf } from '../tools.js';
import { normaliseSampling, parseBody } from '../validate.js';

/** A generation request, parsed, tokenized and checked against the limits. */
interface Prepared {
  readonly chat: boolean;
  readonly prompts: number[][];
  readonly body: (ChatRequest | CompletionRequest) & GenerationFields;
  readonly topLogprobs: number | undefined;
  readonly echo: boolean;
  readonly n: number;
  readonly bestOf: number;
  /** Sequences the request runs: prompts × `best_of`. */
  readonly sequences: number;
  /** Structured outputs (or a forced tool call): a fresh constraint per choice. */
  readonly constraint: (() => TokenConstraint) | undefined;
  /** How the chat request's tools are served. */
  readonly tools: ToolPlan | undefined;
}

/** A validated request with its route (tenant, adapter). */
interface Routed extends Prepared {
  readonly route: Route;
}

/** The prompts, body and logprob fields of a chat request. */
function parseChat(ctx: ServerContext, raw: unknown): Pick<Prepared, 'prompts' | 'body' | 'topLogprobs' | 'echo' | 'tools'> {
  const tok = ctx.lm.tokenizer;
  const c = parseBody(chatSchema, raw);
  if (tok === undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'this model has no tokenizer: chat needs one');
  const tools = toolPlanOf(c, ctx.opts);
  const messages = templateMessages(c.messages.map((m) => ({ ...m, role: m.role, content: contentText(m.content) })));
  const variables = { ...c.chat_template_kwargs, ...(tools?.templateTools === undefined ? {} : { tools: tools.templateTools }) };
  const prompts = [chatPromptIds(tok, messages, { ...(c.add_generation_prompt === undefined ? {} : { addGenerationPrompt: c.add_generation_prompt }), variables, template: c.chat_template ?? ctx.opts.chatTemplate })];
  if (c.top_logprobs != null && c.logprobs !== true) throw new ServerError(ServerCode.BAD_REQUEST, "'top_logprobs': needs 'logprobs': true");
  const topLogprobs = c.logprobs === true ? (c.top_logprobs ?? 0) : undefined;
  return { prompts, body: { ...c, max_tokens: c.max_completion_tokens ?? c.max_tokens }, topLogprobs, echo: false, tools };
}

/** The prompts, body and logprob fields of a completion request (long prompts tokenized off the event loop). */
async function parseCompletion(ctx: ServerContext, raw: unknown): Promise<Pick<Prepared, 'prompts' | 'body' | 'topLogprobs' | 'echo' | 'tools'>> {
  const c = parseBody(completionSchema, raw);
  if (Array.isArray(c['tools']) && c['tools'].length > 0) throw new ServerError(ServerCode.BAD_REQUEST, "'tools': only /v1/chat/completions takes tools");
  const p = c.prompt;
  const list: (string | number[])[] = typeof p === 'string' ? [p] : typeof p[0] === 'number' ? [p as number[]] : (p as (string | number[])[]);
  const worker = ctx.tokenizeWorker;
  if (worker === undefined && list.some((one) => typeof one === 'string')) throw new ServerError(ServerCode.BAD_REQUEST, 'this model has no tokenizer: send token ids');
  const prompts = await Promise.all(list.map((one) => (typeof one === 'string' ? worker!.encode(one, true) : Promise.resolve(one))));
  return { prompts, body: c, topLogprobs: c.logprobs ?? undefined, echo: c.echo === true, tools: undefined };
}

/** `body` with each default set where the body leaves the field out or null. */
function withDefaults(body: unknown, defaults: Readonly<Record<string, number>> | undefined): unknown {
  if (defaults === undefined || typeof body !== 'object' || body === null) return body;
  const out: Record<string, unknown> = { ...(body as Record<string, unknown>) };
  for (const [k, v] of Object.entries(defaults)) out[k] ??= v;
  return out;
}

/**
 * Parses, tokenizes and checks every field of a generation request — ids, ranges, lengths, the
 * sequence count — before anything else happens: a request that fails here loads no adapter,
 * evicts nothing and takes no queue slot. Throws 4xx naming the problem.
 */
async function prepare(ctx: ServerContext, req: FastifyRequest, chat: boolean): Promise<Prepared> {
  const { lm } = ctx;
  const unsupported = unsupportedField(req.body);
  if (unsupported !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, `'${unsupported}': this field is not supported by this server`);
  const raw = withDefaults(req.body, ctx.opts.generationDefaults);
  const parsed = chat ? parseChat(ctx, raw) : await parseCompletion(ctx, raw);
  const { topLogprobs, echo, tools } = parsed;
  const body = normaliseSampling(parsed.body, lm.config.vocabSize);
  checkVllmFields(body, lm.config.vocabSize);
  const prompts = parsed.prompts.map((q) => truncatePrompt(q, body));
  const requested = constraintSpecOf(body);
  if (requested !== undefined && tools?.spec !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, "'tool_choice': a forced tool call cannot be combined with a structured-output constraint");
  const spec = tools?.spec ?? requested;
  const stopIds = stopIdsOf(body, lm.config.eosTokenIds);
  const structured = spec === undefined ? undefined : constraintFactory(lm.tokenizer, lm.config.vocabSize, spec, stopIds);
  const constraint = tokenFilter(body, { vocabSize: lm.config.vocabSize, stopIds, badWords: badWordIds(lm.tokenizer, body.bad_words ?? []), inner: structured });
  for (const [i, p] of prompts.entries()) {
    const bad = p.find((t) => t >= lm.config.vocabSize);
    if (bad !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, `'prompt'${prompts.length > 1 ? `[${String(i)}]` : ''}: token id ${String(bad)} is outside the vocabulary [0, ${String(lm.config.vocabSize)})`);
    maxTokensFor(ctx.limits, p.length, body.max_tokens);
  }
  const n = body.n ?? 1;
  const bestOf = chat ? n : ((body as CompletionRequest).best_of ?? n);
  if (bestOf < n) throw new ServerError(ServerCode.BAD_REQUEST, `'best_of': must be at least n (${String(n)}), got ${String(bestOf)}`);
  if (body.stream_options != null && body.stream !== true) throw new ServerError(ServerCode.BAD_REQUEST, "'stream_options': only allowed with 'stream': true");
  if (bestOf > n && body.stream === true) throw new ServerError(ServerCode.BAD_REQUEST, "'best_of': cannot be larger than n when streaming");
  const sequences = prompts.length * bestOf;
  const most = ctx.opts.maxRequestSequences ?? Math.max(1, Math.floor((ctx.opts.maxBatch ?? 32) / 2));
  if (sequences > most) {
    throw new ServerError(ServerCode.BAD_REQUEST, `this request runs ${String(sequences)} sequences (${String(prompts.length)} prompt${prompts.length === 1 ? '' : 's'} × ${bestOf > n ? 'best_of' : 'n'} ${String(bestOf)}); the limit per request is ${String(most)}`);
  }
  return { chat, prompts, body, topLogprobs, echo, n, bestOf, sequences, constraint, tools };
}

/** Refuses with 429 (nothing started) when the tenant's queue cannot take every sequence of the request. */
function admitAll(ctx: ServerContext, tenant: string, sequences: number): void {
  if (!ctx.scheduler.hasRoom(tenant, sequences)) throw new RouterError(RouterCode.QUEUE_FULL, `this tenant's queue has no room for the request's ${String(sequences)} sequences; retry after the Retry-After seconds`);
}

/**
 * A token's text in context (a SentencePiece `▁of` is ' of', not 'of' as decoded alone): decoded
 * after an anchor token, as vLLM decodes logprob tokens after the sequence so far.
 */
function tokenTextOf(ctx: ServerContext): (t: number) => string {
  const tok = ctx.lm.tokenizer;
  const anchor = tok?.encode('a', { addSpecialTokens: false })[0];
  const anchorText = anchor === undefined ? '' : (tok?.decode([anchor], true) ?? '');
  return (t: number): string => {
    if (tok === undefined) return '';
    if (anchor === undefined) return tok.decode([t], true);
    const both = tok.decode([anchor, t], true);
    return both.startsWith(anchorText) ? both.slice(anchorText.length) : tok.decode([t], true);
  };
}

/**
 * Log-probabilities of the prompt's own tokens (echo with logprobs), scored in chunks of the step
 * budget (`prefillTokens`): each chunk's logits are turned into log-probabilities and dropped
 * before the next chunk runs, and the event loop is free between chunks.
 */
async function promptLogprobs(ctx: ServerContext, prompt: readonly number[], adapter: string | undefined, top: number): Promise<(RankedPick | null)[]> {
  const V = ctx.lm.config.vocabSize;
  const picks: (RankedPick | null)[] = [null];
  for await (const { start, logits } of ctx.lm.promptLogitChunks(adapter, prompt, undefined, { chunk: ctx.opts.prefillTokens ?? 64 })) {
    const rows = logits.length / V;
    // Row r holds the distribution of the token at start + r + 1.
    for (let r = 0; r < rows && start + r + 1 < prompt.length; r++) {
      const t = prompt[start + r + 1]!;
      const lp = logSoftmax(logits.subarray(r * V, (r + 1) * V));
      let rank = 1;
      for (let i = 0; i < V; i++) if (lp[i]! > lp[t]!) rank++;
      picks.push({ id: t, logprob: lp[t]!, rank, top: topOf(lp, top) });
    }
  }
  return picks;
}

/** A signal that fires when the client goes away before the answer is complete. */
function clientGone(req: FastifyRequest, reply: FastifyReply): AbortSignal {
  const ac = new AbortController();
  req.raw.on('close', () => {
    if (!req.raw.complete) ac.abort();
  });
  // The request body is complete long before the answer: a client gone mid-generation shows as the
  // response's connection closing before the response finished (plain and SSE alike).
  reply.raw.on('close', () => {
    if (!reply.raw.writableFinished) ac.abort();
  });
  return ac.signal;
}

/** What rendering an answer needs besides the request: ids, run and logprob helpers. */
interface Answer {
  readonly id: string;
  readonly created: number;
  readonly withIds: boolean;
  readonly echoText: readonly string[];
  readonly promptPicks: readonly (readonly (PickInfo | null)[])[];
  /** vLLM's `prompt_logprobs` of each prompt, when the request asks for them. */
  readonly promptLogprobs: readonly (readonly (PromptLogprobEntry | null)[])[] | undefined;
  run(pi: number, j: number, onDelta?: RunOptions['onDelta']): Promise<Outcome>;
  logprobsOf(picks: readonly (PickInfo | null)[], ids: readonly number[], offset0: number): unknown;
  usage(outs: readonly Outcome[]): Usage;
}

/** OpenAI's `usage`, with the prompt tokens the prefix cache served. */
interface Usage {
  readonly prompt_tokens: number;
  readonly completion_tokens: number;
  readonly total_tokens: number;
  readonly prompt_tokens_details: { readonly cached_tokens: number };
}

async function answerOf(ctx: ServerContext, req: FastifyRequest, reply: FastifyReply, p: Routed, tokenText: (t: number) => string): Promise<Answer> {
  const { prompts, topLogprobs, echo, chat } = p;
  const tok = ctx.lm.tokenizer;
  const gen = { lm: ctx.lm, scheduler: ctx.scheduler, metrics: ctx.metrics, limits: ctx.limits, modelName: ctx.modelName, prefixCaching: ctx.lm.prefixCaching };
  const fields: GenerationFields = p.body;
  const promptPicks = echo && topLogprobs !== undefined ? await Promise.all(prompts.map((q) => promptLogprobs(ctx, q, p.route.adapter, topLogprobs))) : prompts.map(() => []);
  const k = p.body.prompt_logprobs;
  const vllmPrompt = k == null ? undefined : (await Promise.all(prompts.map((q) => promptLogprobs(ctx, q, p.route.adapter, k)))).map((picks) => vllmPromptLogprobs(picks, tokenText));
  const gone = clientGone(req, reply);
  // Per prompt, the most prompt tokens any of its sequences took from the prefix cache.
  const cached = prompts.map(() => 0);
  const siblings = new AbortController();
  return {
    id: `${chat ? 'chatcmpl' : 'cmpl'}-${randomUUID()}`,
    created: Math.floor(Date.now() / 1000),
    withIds: p.body.return_token_ids === true,
    echoText: prompts.map((q) => (echo ? (tok?.decode(q) ?? '') : '')),
    promptPicks,
    promptLogprobs: vllmPrompt,
    // One sequence failing ends its siblings: a request is answered whole or not at all.
    run: (pi, j, onDelta) =>
      runGeneration(gen, p.route, prompts[pi]!, fields, {
        ...(topLogprobs === undefined && p.bestOf === p.n ? {} : { logprobs: topLogprobs ?? 0 }),
        seedOffset: j,
        ...(onDelta === undefined ? {} : { onDelta }),
        ...(p.constraint === undefined ? {} : { constraint: p.constraint }),
        signal: AbortSignal.any([gone, siblings.signal]),
      }).then((out) => {
        cached[pi] = Math.max(cached[pi]!, out.cachedTokens);
        return out;
      }).catch((e: unknown) => {
        siblings.abort();
        throw e;
      }),
    logprobsOf: (picks, ids, offset0) => (chat ? chatLogprobs(picks as PickInfo[], tokenText) : completionLogprobs(picks, ids, tokenText, offset0)),
    usage: (outs) => {
      const promptTokens = prompts.reduce((a, q) => a + q.length, 0);
      const completionTokens = outs.reduce((a, o) => a + o.ids.length, 0);
      return { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens, prompt_tokens_details: { cached_tokens: cached.reduce((x, y) => x + y, 0) } };
    },
  };
}

/** Streams every choice of `p` as server-sent events, ending with `[DONE]`. */
async function streamAnswer(reply: FastifyReply, p: Routed, a: Answer): Promise<FastifyReply> {
  const { chat, body, n, topLogprobs } = p;
  const sse = new SseStream(reply);
  const chunk = (index: number, choice: Record<string, unknown>) => ({ id: a.id, object: chat ? 'chat.completion.chunk' : 'text_completion', created: a.created, model: body.model, choices: [{ index, ...choice }] });
  const outs: Outcome[] = [];
  const one = async (pi: number, j: number): Promise<void> => {
    const index = pi * n + j;
    let text = '';
    if (chat) sse.preamble(chunk(index, { delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }));
    if (p.echo) {
      text = a.echoText[pi]!;
      sse.preamble(chunk(index, { text, logprobs: topLogprobs === undefined ? null : a.logprobsOf(a.promptPicks[pi]!, p.prompts[pi]!, 0), finish_reason: null }));
    }
    const tools = chat && p.tools !== undefined ? new ToolDeltaStream(p.tools) : undefined;
    const out = await a.run(pi, j, (delta, ids, picks) => {
      const lp = topLogprobs === undefined ? null : a.logprobsOf(picks, ids, text.length);
      text += delta;
      const tokenIds = a.withIds ? { token_ids: ids } : {};
      if (tools !== undefined) {
        for (const d of tools.push(delta)) sse.send(chunk(index, { delta: d, logprobs: lp, finish_reason: null, ...tokenIds }));
        return;
      }
      sse.send(chunk(index, chat ? { delta: { content: delta }, logprobs: lp, finish_reason: null, ...tokenIds } : { text: delta, logprobs: lp, finish_reason: null, ...tokenIds }));
    });
    outs.push(out);
    const end = tools?.finish(out.finishReason);
    for (const d of end?.deltas ?? []) sse.send(chunk(index, { delta: d, logprobs: null, finish_reason: null }));
    const finishReason = end?.finishReason ?? out.finishReason;
    sse.send(chunk(index, chat ? { delta: {}, logprobs: null, finish_reason: finishReason } : { text: '', logprobs: null, finish_reason: finishReason }));
  };
  try {
    await Promise.all(p.prompts.flatMap((_, pi) => Array.from({ length: n }, (_u, j) => one(pi, j))));
    if (body.stream_options?.include_usage === true) sse.send({ id: a.id, object: chat ? 'chat.completion.chunk' : 'text_completion', created: a.created, model: body.model, choices: [], usage: a.usage(outs) });
  } catch (e) {
    // Nothing sent yet (validation, admission, a failure before the first token): a plain
    // HTTP error with its status, never a 200 with an error event.
    if (!sse.started) throw e;
    const status = statusOf(e);
    sse.send({ error: { message: errorMessage(e), type: errorType(status), code: e instanceof StageError ? String(e.code) : 'SERVER_ERROR' } });
  }
  sse.done();
  return reply;
}

/** Runs every choice of `p` (best-of-n picks the most likely) and renders one JSON answer. */
async function collectAnswer(p: Routed, a: Answer): Promise<unknown> {
  const { chat, n, bestOf, topLogprobs } = p;
  const perPrompt = await Promise.all(
    p.prompts.map(async (_, pi) => {
      const all = await Promise.all(Array.from({ length: bestOf }, (_u, j) => a.run(pi, j)));
      return bestOf > n ? [...all].sort((x, y) => y.cumulativeLogprob - x.cumulativeLogprob).slice(0, n) : all;
    }),
  );
  const choices = perPrompt.flatMap((outs, pi) =>
    outs.map((out, j) => {
      const index = pi * n + j;
      const ids = a.withIds ? { token_ids: out.ids } : {};
      if (chat) {
        const { message, finishReason } = p.tools === undefined ? { message: { role: 'assistant', content: out.text }, finishReason: out.finishReason } : toolChoiceOf(p.tools, out.text, out.finishReason);
        return { index, message, logprobs: topLogprobs === undefined ? null : a.logprobsOf(out.picks, out.ids, 0), finish_reason: finishReason, ...ids };
      }
      const head = a.echoText[pi]!;
      const logprobs = topLogprobs === undefined ? null : mergeCompletionLogprobs(a.logprobsOf(a.promptPicks[pi]!, p.prompts[pi]!, 0) as CompletionLogprobs, a.logprobsOf(out.picks, out.ids, head.length) as CompletionLogprobs, p.echo);
      return { index, text: head + out.text, logprobs, finish_reason: out.finishReason, ...ids, ...(a.promptLogprobs === undefined ? {} : { prompt_logprobs: a.promptLogprobs[pi] }) };
    }),
  );
  // vLLM puts a chat's prompt_logprobs on the response (one prompt), a completion's on each choice.
  const chatPrompt = chat && a.promptLogprobs !== undefined ? { prompt_logprobs: a.promptLogprobs[0] } : {};
  return { id: a.id, object: chat ? 'chat.completion' : 'text_completion', created: a.created, model: p.body.model, choices, usage: a.usage(perPrompt.flat()), ...chatPrompt };
}

/** Leases the request's adapter from the resolver (loading it on demand) while the request runs. */
async function withAdapter(ctx: ServerContext, req: FastifyRequest, model: string, run: () => Promise<unknown>): Promise<unknown> {
  const { resolver, lm, modelName } = ctx;
  if (resolver === undefined || ctx.state.draining || model === modelName || ctx.aliases.has(model)) return run();
  // Only a key that may use the adapter may make the replica load it.
  if (!lm.adapterNames.includes(model)) ctx.registry.route(bearer(req), model, { baseModel: modelName, adapters: new Set([...lm.adapterNames, model]) });
  const release = await resolver.acquire(model);
  try {
    return await run();
  } finally {
    release();
  }
}

/** `POST /v1/completions` and `POST /v1/chat/completions` (plain and SSE). */
export function registerCompletionRoutes(app: FastifyInstance, ctx: ServerContext): void {
  const tokenText = tokenTextOf(ctx);
  const completion = async (req: FastifyRequest, reply: FastifyReply, chat: boolean): Promise<unknown> => {
    ctx.ensureOpen();
    // Everything is checked before the adapter is leased (and perhaps loaded) or a queue slot taken.
    const prepared = await prepare(ctx, req, chat);
    admitAll(ctx, ctx.tenantOf.get(req) ?? 'anonymous', prepared.sequences);
    return withAdapter(ctx, req, prepared.body.model, async () => {
      const p: Routed = { ...prepared, route: ctx.routeOf(req, ctx.resolveName(prepared.body.model)) };
      const a = await answerOf(ctx, req, reply, p, tokenText);
      // Checked again right before the sequences are submitted (all in this tick): all or none.
      admitAll(ctx, p.route.tenant, p.sequences);
      return p.body.stream === true ? streamAnswer(reply, p, a) : collectAnswer(p, a);
    });
  };
  app.post('/v1/completions', (req, reply) => completion(req, reply, false));
  app.post('/v1/chat/completions', (req, reply) => completion(req, reply, true));
}
