import type { z } from 'zod';
import { ServerCode, ServerError } from './errors.js';
import { describeIssue } from './schemas.js';

/** `body` parsed by `schema`; the first problem is `SERVER_BAD_REQUEST` naming the field. */
export function parseBody<T>(schema: z.ZodType<T>, body: unknown): T {
  const r = schema.safeParse(body);
  if (!r.success) throw new ServerError(ServerCode.BAD_REQUEST, describeIssue(r.error));
  return r.data;
}
