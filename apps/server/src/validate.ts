import type { z } from 'zod';
import { ServerCode, ServerError } from './errors.js';
import { describeIssue } from './schemas.js';

/** `body` parsed by `schema`; the first problem is `SERVER_BAD_REQUEST` naming the field. */
export function parseBody<T>(schema: z.ZodType<T>, body: unknown): T {
  const r = schema.safeParse(body);
  if (!r.success) throw new ServerError(ServerCode.BAD_REQUEST, describeIssue(r.error));
  return r.data;
}

/** Smallest and largest `repetition_penalty`: outside, logits divide into overflow and greedy output degenerates. */
export const REPETITION_PENALTY_RANGE = [0.01, 10] as const;
/** Largest value any token-id-like field may carry (the engine's id type is a signed 32-bit integer). */
const MAX_ID = 2 ** 31 - 1;

/** The fields of a generation request whose range depends on the model, after the schema. */
interface RangedFields {
  readonly top_k?: number | null | undefined;
  readonly repetition_penalty?: number | null | undefined;
  readonly logit_bias?: Readonly<Record<string, number>> | null | undefined;
  readonly pad_token_id?: number | undefined;
}

/**
 * Range-checks and normalises the sampling fields the schema cannot check alone, so that a request
 * which passes here cannot fail later inside a batch (issue 39): `top_k` within a 32-bit id and
 * clamped to the vocabulary (`top_k` ≥ vocabulary keeps every token, as -1 and 0 do), `logit_bias` keys
 * as canonical decimal token ids inside the vocabulary (`"01"` and `"1"` are not two spellings of
 * one id), `repetition_penalty` within {@link REPETITION_PENALTY_RANGE}, `pad_token_id` inside the
 * vocabulary. Problems are `SERVER_BAD_REQUEST` naming the field.
 */
export function normaliseSampling<T extends RangedFields>(body: T, vocabSize: number): T {
  const bad = (field: string, why: string): never => {
    throw new ServerError(ServerCode.BAD_REQUEST, `'${field}': ${why}`);
  };
  let topK = body.top_k;
  if (topK != null) {
    if (topK > MAX_ID) bad('top_k', `must be at most ${String(MAX_ID)}, got ${String(topK)}`);
    if (topK >= vocabSize) topK = -1;
  }
  const rp = body.repetition_penalty;
  if (rp != null && !(rp >= REPETITION_PENALTY_RANGE[0] && rp <= REPETITION_PENALTY_RANGE[1])) {
    bad('repetition_penalty', `must be in [${String(REPETITION_PENALTY_RANGE[0])}, ${String(REPETITION_PENALTY_RANGE[1])}], got ${String(rp)}`);
  }
  if (body.pad_token_id !== undefined && body.pad_token_id >= vocabSize) bad('pad_token_id', `token id ${String(body.pad_token_id)} is outside the vocabulary [0, ${String(vocabSize)})`);
  let bias: Record<string, number> | null | undefined = body.logit_bias;
  if (bias != null) {
    const out: Record<string, number> = {};
    for (const [k, v] of Object.entries(bias)) {
      if (!/^(?:0|[1-9]\d{0,9})$/.test(k)) bad('logit_bias', `key '${k.slice(0, 16)}' is not a canonical token id (decimal digits, no leading zero)`);
      if (Number(k) >= vocabSize) bad('logit_bias', `token id ${k} is outside the vocabulary [0, ${String(vocabSize)})`);
      out[k] = v;
    }
    bias = out;
  }
  return { ...body, ...(topK === body.top_k ? {} : { top_k: topK }), ...(bias === body.logit_bias ? {} : { logit_bias: bias }) };
}
