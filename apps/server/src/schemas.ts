import { z } from 'zod';

const tokenIds = z.array(z.number().int().nonnegative()).min(1);
const prompt = z.union([z.string().min(1), tokenIds, z.array(z.string().min(1)).min(1), z.array(tokenIds).min(1)]);
const penalty = z.number().min(-2).max(2).nullish();

const sampling = {
  max_tokens: z.number().int().positive().nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  top_k: z.number().int().min(-1).nullish(),
  seed: z.number().int().nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.looseObject({ include_usage: z.boolean().nullish(), continuous_usage_stats: z.boolean().nullish() }).nullish(),
  stop: z.union([z.string(), z.array(z.string()).max(8)]).nullish(),
  n: z.number().int().min(1).max(16).nullish(),
  presence_penalty: penalty,
  frequency_penalty: penalty,
  repetition_penalty: z.number().gt(0).max(10).nullish(),
  logit_bias: z.record(z.string().regex(/^\d+$/, 'keys must be token ids'), z.number().min(-100).max(100)).nullish(),
  ignore_eos: z.boolean().optional(),
  return_token_ids: z.boolean().optional(),
  pad_token_id: z.number().int().nonnegative().optional(),
  user: z.string().nullish(),
  // vLLM's extra sampling fields (vllm-fields.ts: honoured, or refused naming the field).
  stop_token_ids: z.array(z.number().int().nonnegative()).nullish(),
  min_tokens: z.number().int().nonnegative().nullish(),
  min_p: z.number().min(0).max(1).nullish(),
  include_stop_str_in_output: z.boolean().nullish(),
  skip_special_tokens: z.boolean().nullish(),
  spaces_between_special_tokens: z.boolean().nullish(),
  truncate_prompt_tokens: z.number().int().positive().nullish(),
  bad_words: z.array(z.string().min(1)).nullish(),
  allowed_token_ids: z.array(z.number().int().nonnegative()).nullish(),
  prompt_logprobs: z.number().int().min(0).nullish(),
  length_penalty: z.number().nullish(),
  use_beam_search: z.boolean().nullish(),
};

/**
 * Fields of the OpenAI API this server does not implement: present (and not their neutral value),
 * they answer 400 naming the field instead of being silently ignored.
 */
const UNSUPPORTED: Readonly<Record<string, (v: unknown) => boolean>> = {
  functions: (v) => Array.isArray(v) && v.length > 0,
  function_call: (v) => v !== 'none' && v !== 'auto',
  suffix: (v) => v !== '',
  audio: () => true,
  modalities: (v) => !(Array.isArray(v) && v.every((m) => m === 'text')),
  prediction: () => true,
  web_search_options: () => true,
};

/** The first unsupported field set in `body` (`null`/absent fields are fine), or undefined. */
export function unsupportedField(body: unknown): string | undefined {
  if (typeof body !== 'object' || body === null) return undefined;
  for (const [k, isSet] of Object.entries(UNSUPPORTED)) {
    const v = (body as Record<string, unknown>)[k];
    if (v !== undefined && v !== null && isSet(v)) return k;
  }
  return undefined;
}

/**
 * `POST /v1/completions` body (OpenAI; prompt arrays of strings or token-id lists, `n`/`best_of`,
 * `logprobs` 0–20, `echo`; vLLM extensions `top_k`, `repetition_penalty`, `ignore_eos`, `return_token_ids`).
 */
export const completionSchema = z.looseObject({
  model: z.string().min(1),
  prompt,
  ...sampling,
  best_of: z.number().int().min(1).max(16).nullish(),
  logprobs: z.number().int().min(0).max(20).nullish(),
  echo: z.boolean().nullish(),
});
/** A parsed completion request. */
export type CompletionRequest = z.infer<typeof completionSchema>;

const contentPart = z.looseObject({ type: z.string(), text: z.string().optional() }).superRefine((v, ctx) => {
  if (v.type !== 'text') ctx.addIssue({ code: 'custom', message: `content part type '${v.type}' is not supported (only 'text')`, path: ['type'] });
  else if (typeof v.text !== 'string') ctx.addIssue({ code: 'custom', message: "a 'text' part needs a string 'text'", path: ['text'] });
});

/**
 * A chat message: content as a string or a list of text parts; roles system, developer, user,
 * assistant (with `tool_calls`), tool (with `tool_call_id`). Other fields reach the chat template.
 */
export const messageSchema = z.looseObject({
  role: z.enum(['system', 'developer', 'user', 'assistant', 'tool']),
  content: z.union([z.string(), z.array(contentPart)]).nullish(),
  name: z.string().optional(),
});

/** `POST /v1/chat/completions` body (OpenAI; vLLM extras `add_generation_prompt`, `chat_template_kwargs`). */
export const chatSchema = z.looseObject({
  model: z.string().min(1),
  messages: z.array(messageSchema).min(1),
  ...sampling,
  max_completion_tokens: z.number().int().positive().nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().min(0).max(20).nullish(),
  add_generation_prompt: z.boolean().optional(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).optional(),
  chat_template: z.string().optional(),
});
/** A parsed chat request. */
export type ChatRequest = z.infer<typeof chatSchema>;

/** Content of a chat message as a string: text parts joined with newlines, as vLLM does. */
export function contentText(content: ChatRequest['messages'][number]['content']): string {
  if (content == null) return '';
  if (typeof content === 'string') return content;
  return content.map((p) => p.text ?? '').join('\n');
}

/** `POST /tokenize` body (vLLM) with a prompt. */
export const tokenizePromptSchema = z.looseObject({ model: z.string().optional(), prompt: z.string(), add_special_tokens: z.boolean().optional() });
/** `POST /tokenize` body (vLLM) with chat messages, rendered with the chat template. */
export const tokenizeChatSchema = z.looseObject({
  model: z.string().optional(),
  messages: z.array(messageSchema).min(1),
  add_generation_prompt: z.boolean().optional(),
  add_special_tokens: z.boolean().optional(),
});

/** `POST /detokenize` body (vLLM). */
export const detokenizeSchema = z.looseObject({ model: z.string().optional(), tokens: z.array(z.number().int().nonnegative()) });

/** `POST /v1/load_lora_adapter` body (vLLM). */
export const loadAdapterSchema = z.strictObject({
  lora_name: z.string().regex(/^[A-Za-z0-9_.-]+$/, 'letters, digits, _ . - only'),
  lora_path: z.string().min(1),
  tenants: z.array(z.string()).optional(),
});

/** `POST /v1/unload_lora_adapter` body (vLLM). */
export const unloadAdapterSchema = z.strictObject({ lora_name: z.string().min(1), lora_int_id: z.number().int().optional() });

/** The first validation problem as `field: message`. */
export function describeIssue(e: z.ZodError): string {
  const i = e.issues[0]!;
  return `${i.path.length > 0 ? `'${i.path.join('.')}'` : 'body'}: ${i.message}`;
}
