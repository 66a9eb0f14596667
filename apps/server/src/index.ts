/**
 * @packageDocumentation
 * `@stageml/server`: StageML's reference server. An OpenAI-compatible HTTP API
 * (`/v1/completions`, `/v1/chat/completions` with SSE streaming, `/v1/models`), vLLM-compatible
 * LoRA management (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`) and Prometheus metrics
 * with vLLM's names, `/health` and `/ready`, per-tenant API keys, validation, limits, 429 with
 * Retry-After on a full queue, and graceful drain on shutdown. Requests are served by the
 * router's continuous-batching scheduler.
 */
export { createServer } from './app.js';
export type { ServerOptions, StageServer } from './app.js';
export { ServerCode, ServerError, httpStatusOf, statusOf } from './errors.js';
export type { ServerErrorCode } from './errors.js';
export { renderChat } from './chat-template.js';
