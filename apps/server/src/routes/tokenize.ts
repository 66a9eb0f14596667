import type { FastifyInstance } from 'fastify';
import { chatTemplateOf, encodeChat } from '@stageml/models';
import { chatPromptIds, transcriptIds } from '../chat-template.js';
import type { ServerContext } from '../context.js';
import { ServerCode, ServerError } from '../errors.js';
import { contentText, detokenizeSchema, tokenizeChatSchema, tokenizePromptSchema } from '../schemas.js';
import { parseBody } from '../validate.js';

/** Largest `/tokenize` and `/detokenize` body (bytes), below the server's body limit when that is smaller. */
export const TOKENIZE_BODY_LIMIT = 256 * 1024;

/**
 * vLLM's tokenizer endpoints: `POST /tokenize` (a prompt or chat messages) and `POST /detokenize`,
 * behind the same authentication as `/v1` (the request guards) and a body limit of their own.
 */
export function registerTokenizerRoutes(app: FastifyInstance, ctx: ServerContext): void {
  const { lm } = ctx;
  const bodyLimit = Math.min(TOKENIZE_BODY_LIMIT, ctx.opts.bodyLimit ?? 1024 * 1024);
  app.post('/tokenize', { bodyLimit }, async (req) => {
    if (lm.tokenizer === undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'this model has no tokenizer');
    const isChat = typeof req.body === 'object' && req.body !== null && 'messages' in req.body;
    let tokens: number[];
    if (isChat) {
      const body = parseBody(tokenizeChatSchema, req.body);
      if (body.model !== undefined) ctx.routeOf(req, ctx.resolveName(body.model));
      const messages = body.messages.map((m) => ({ ...m, content: contentText(m.content) }));
      const template = chatTemplateOf(lm.tokenizer);
      tokens = body.add_special_tokens === true
        ? template === undefined
          ? transcriptIds(lm.tokenizer, messages)
          : encodeChat(lm.tokenizer, template, messages, { addGenerationPrompt: true }, true).ids
        : chatPromptIds(lm.tokenizer, messages, body.add_generation_prompt === undefined ? {} : { addGenerationPrompt: body.add_generation_prompt });
    } else {
      const body = parseBody(tokenizePromptSchema, req.body);
      if (body.model !== undefined) ctx.routeOf(req, ctx.resolveName(body.model));
      // A long prompt is tokenized on the worker: the event loop stays free.
      tokens = ctx.tokenizeWorker === undefined ? lm.tokenizer.encode(body.prompt, { addSpecialTokens: body.add_special_tokens ?? true }) : await ctx.tokenizeWorker.encode(body.prompt, body.add_special_tokens ?? true);
    }
    // vLLM: `return_token_strs` adds each id's vocabulary string (convert_ids_to_tokens).
    const strs = (req.body as { return_token_strs?: unknown }).return_token_strs === true;
    const tok = lm.tokenizer;
    return { count: tokens.length, max_model_len: ctx.limits.maxModelLen, tokens, token_strs: strs ? tokens.map((t) => tok.tokenOf(t) ?? null) : null };
  });
  app.post('/detokenize', { bodyLimit }, (req) => {
    const body = parseBody(detokenizeSchema, req.body);
    if (lm.tokenizer === undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'this model has no tokenizer');
    if (body.model !== undefined) ctx.routeOf(req, ctx.resolveName(body.model));
    const bad = body.tokens.find((t) => t >= lm.config.vocabSize);
    if (bad !== undefined) throw new ServerError(ServerCode.BAD_REQUEST, `'tokens': token id ${String(bad)} is outside the vocabulary [0, ${String(lm.config.vocabSize)})`);
    return { prompt: lm.tokenizer.decode(body.tokens) };
  });
}
