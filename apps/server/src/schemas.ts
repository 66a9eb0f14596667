import { z } from 'zod';

const tokenIds = z.array(z.number().int().nonnegative()).min(1);
const prompt = z.union([z.string().min(1), tokenIds, z.array(z.string().min(1)).length(1), z.array(tokenIds).length(1)]);

const sampling = {
  max_tokens: z.number().int().positive().optional(),
  temperature: z.number().min(0).max(2).optional(),
  top_p: z.number().gt(0).max(1).optional(),
  top_k: z.number().int().min(-1).optional(),
  seed: z.number().int().nonnegative().optional(),
  stream: z.boolean().optional(),
  stop: z.union([z.string(), z.array(z.string()).max(8)]).nullish(),
  n: z.literal(1).optional(),
  logprobs: z.null().optional(),
  ignore_eos: z.boolean().optional(),
  return_token_ids: z.boolean().optional(),
  pad_token_id: z.number().int().nonnegative().optional(),
  user: z.string().optional(),
};

/** `POST /v1/completions` body (OpenAI; vLLM extensions `top_k`, `ignore_eos`, `return_token_ids`). */
export const completionSchema = z.looseObject({ model: z.string().min(1), prompt, ...sampling });
/** A parsed completion request. */
export type CompletionRequest = z.infer<typeof completionSchema>;

/** `POST /v1/chat/completions` body. */
export const chatSchema = z.looseObject({
  model: z.string().min(1),
  messages: z.array(z.looseObject({ role: z.enum(['system', 'user', 'assistant']), content: z.string() })).min(1),
  ...sampling,
  max_completion_tokens: z.number().int().positive().optional(),
});
/** A parsed chat request. */
export type ChatRequest = z.infer<typeof chatSchema>;

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
