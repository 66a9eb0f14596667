import type { ConstraintSpec } from '@stageml/structured';
import { ServerCode, ServerError } from './errors.js';
import { hoistSchemaRefs } from './tool-schema.js';
import { type ParsedToolCall, ToolCallStream, type ToolParserName, toolCallId, toolParsers } from './tool-parsers.js';

/** How a chat request's `tools` and `tool_choice` are served. */
export interface ToolPlan {
  /** `none` (tools ignored), `auto` (the parser reads calls from free text), `required`, or `named`. */
  readonly mode: 'none' | 'auto' | 'required' | 'named';
  /** The forced function of `named`. */
  readonly name?: string;
  /** The constraint that makes `required` / `named` output always parse. */
  readonly spec?: ConstraintSpec;
  /** The parser of `auto` (`--tool-call-parser`). */
  readonly parser?: ToolParserName;
  /** The tools as the chat template receives them (`tools`), undefined with `none`. */
  readonly templateTools?: readonly unknown[];
}

/** Server settings tool calling depends on (vLLM's `--enable-auto-tool-choice`, `--tool-call-parser`). */
export interface ToolSettings {
  readonly enableAutoToolChoice?: boolean | undefined;
  readonly toolCallParser?: ToolParserName | undefined;
}

interface FunctionTool {
  readonly name: string;
  readonly parameters: unknown;
}

const bad = (field: string, what: string): never => {
  throw new ServerError(ServerCode.BAD_REQUEST, `'${field}': ${what}`);
};

function functionsOf(tools: unknown): FunctionTool[] {
  if (!Array.isArray(tools)) return bad('tools', 'must be a list');
  return tools.map((t: unknown, i) => {
    const f = (t as { type?: unknown; function?: { name?: unknown; parameters?: unknown } } | null) ?? {};
    if (f.type !== 'function') bad(`tools[${String(i)}].type`, "must be 'function'");
    if (typeof f.function?.name !== 'string' || f.function.name === '') bad(`tools[${String(i)}].function.name`, 'must be a non-empty string');
    const parameters: unknown = f.function!.parameters ?? { type: 'object', properties: {} };
    if (typeof parameters !== 'object' || parameters === null) bad(`tools[${String(i)}].function.parameters`, 'must be a JSON schema object');
    return { name: f.function!.name as string, parameters };
  });
}

/**
 * The tool plan of a chat request, as vLLM serves it: `tool_choice` `none` ignores the tools;
 * a named function constrains the output to that function's `parameters` schema (the output is
 * the call's arguments); `required` constrains it to a non-empty JSON list of
 * `{"name", "parameters"}` objects of the given tools (one with `parallel_tool_calls: false`);
 * `auto` (the default with tools) needs `--enable-auto-tool-choice` and `--tool-call-parser`, and
 * reads calls from the free text. Undefined without tools.
 */
export function toolPlanOf(request: object, settings: ToolSettings): ToolPlan | undefined {
  const body = request as { readonly tools?: unknown; readonly tool_choice?: unknown; readonly parallel_tool_calls?: unknown };
  const choice = body.tool_choice ?? (body.tools == null ? undefined : 'auto');
  if (body.tools == null || (Array.isArray(body.tools) && body.tools.length === 0)) {
    if (choice !== undefined && choice !== 'none' && choice !== 'auto') bad('tool_choice', "needs 'tools'");
    return undefined;
  }
  const fns = functionsOf(body.tools);
  if (choice === 'none') return { mode: 'none' };
  const templateTools = body.tools as unknown[];
  if (choice === 'auto') {
    if (settings.enableAutoToolChoice !== true || settings.toolCallParser === undefined) {
      bad('tool_choice', '"auto" tool choice needs the server started with --enable-auto-tool-choice and --tool-call-parser (hermes, llama3_json or mistral)');
    }
    return { mode: 'auto', parser: settings.toolCallParser!, templateTools };
  }
  if (choice === 'required') {
    // Each function's references are rewritten to resolve inside the list schema (tool-schema.ts).
    const hoisted = fns.map((f, i) => hoistSchemaRefs(f.parameters, `tool${String(i)}`));
    const defs = Object.assign({}, ...hoisted.map((h) => h.defs)) as Record<string, unknown>;
    const item = { anyOf: fns.map((f, i) => ({ type: 'object', properties: { name: { const: f.name }, parameters: hoisted[i]!.schema }, required: ['name', 'parameters'], additionalProperties: false })) };
    const schema = { type: 'array', items: item, minItems: 1, ...(body.parallel_tool_calls === false ? { maxItems: 1 } : {}), ...(Object.keys(defs).length > 0 ? { $defs: defs } : {}) };
    return { mode: 'required', spec: { kind: 'json_schema', schema, strict: true }, templateTools };
  }
  const named = (choice as { type?: unknown; function?: { name?: unknown } } | null)?.function?.name;
  if (typeof choice !== 'object' || (choice as { type?: unknown }).type !== 'function' || typeof named !== 'string') {
    return bad('tool_choice', `must be 'none', 'auto', 'required' or {"type": "function", "function": {"name": …}}`);
  }
  const fn = fns.find((f) => f.name === named) ?? bad('tool_choice.function.name', `'${named}' is not one of the given tools`);
  return { mode: 'named', name: named, spec: { kind: 'json_schema', schema: fn.parameters, strict: true }, templateTools };
}

/** An OpenAI `tool_calls` entry. */
export interface OpenAiToolCall {
  readonly id: string;
  readonly type: 'function';
  readonly function: { readonly name: string; readonly arguments: string };
}

/** OpenAI's shape of parsed calls, with fresh ids. */
export function openAiCalls(calls: readonly ParsedToolCall[], parser?: ToolParserName): OpenAiToolCall[] {
  return calls.map((c) => ({ id: toolCallId(parser), type: 'function', function: { name: c.name, arguments: c.arguments } }));
}

/**
 * The calls in a finished output under `plan`: the named call's arguments, the `required` list,
 * or what the `auto` parser finds; with the content left (null when the output is only calls).
 */
export function toolCallsOf(plan: ToolPlan, text: string): { readonly content: string | null; readonly calls: readonly ParsedToolCall[] } {
  switch (plan.mode) {
    case 'none': return { content: text, calls: [] };
    case 'named': return { content: null, calls: [{ name: plan.name!, arguments: text }] };
    case 'required': {
      let list: unknown;
      try {
        list = JSON.parse(text);
      } catch {
        // Cut by max_tokens before the list closed: no call, the text as content.
        return { content: text, calls: [] };
      }
      return { content: null, calls: (list as { name: string; parameters: unknown }[]).map((c) => ({ name: c.name, arguments: JSON.stringify(c.parameters) })) };
    }
    case 'auto': return toolParsers[plan.parser!](text);
  }
}

/**
 * Messages as chat templates expect them: an assistant's `tool_calls` with `arguments` as objects
 * (HF templates iterate over them; OpenAI clients send JSON text), as vLLM passes them.
 */
export function templateMessages<M extends { readonly role: string }>(messages: readonly M[]): M[] {
  return messages.map((m) => {
    const calls = (m as { tool_calls?: unknown }).tool_calls;
    if (!Array.isArray(calls)) return m;
    return {
      ...m,
      tool_calls: calls.map((c: { function?: { arguments?: unknown } }) => {
        const a = c.function?.arguments;
        if (typeof a !== 'string') return c;
        try {
          return { ...c, function: { ...c.function, arguments: JSON.parse(a) as unknown } };
        } catch {
          return c;
        }
      }),
    };
  });
}

/** The assistant message and finish reason of a finished chat choice under `plan`. */
export function toolChoiceOf(plan: ToolPlan, text: string, finishReason: string): { readonly message: Record<string, unknown>; readonly finishReason: string } {
  const { content, calls } = toolCallsOf(plan, text);
  if (calls.length === 0) return { message: { role: 'assistant', content: text }, finishReason };
  return {
    message: { role: 'assistant', content, tool_calls: openAiCalls(calls, plan.parser) },
    // vLLM: a forced named call finishes as the generation did; other calls as `tool_calls`.
    finishReason: plan.mode === 'named' ? finishReason : 'tool_calls',
  };
}

/**
 * Turns a streamed chat choice into OpenAI's deltas under `plan`: a named call streams its
 * arguments as they are generated (the first delta carries the call's id, type and name);
 * `required` and `auto` calls go out whole when the output ends (for `auto`, content before a
 * possible call streams as it comes: `ToolCallStream`).
 */
export class ToolDeltaStream {
  readonly #plan: ToolPlan;
  readonly #auto: ToolCallStream | undefined;
  #text = '';
  #started = false;

  /** A delta stream of one choice. */
  constructor(plan: ToolPlan) {
    this.#plan = plan;
    this.#auto = plan.mode === 'auto' ? new ToolCallStream(plan.parser!) : undefined;
  }

  /** The `delta` objects to send for the generated `text` (none while held). */
  push(text: string): Record<string, unknown>[] {
    this.#text += text;
    switch (this.#plan.mode) {
      case 'none': return text === '' ? [] : [{ content: text }];
      case 'named': {
        if (text === '' && this.#started) return [];
        const fn = this.#started ? { arguments: text } : { name: this.#plan.name!, arguments: text };
        const call = this.#started ? { index: 0, function: fn } : { index: 0, id: toolCallId(), type: 'function', function: fn };
        this.#started = true;
        return [{ tool_calls: [call] }];
      }
      case 'required': return [];
      case 'auto': {
        const c = this.#auto!.push(text);
        return c === '' ? [] : [{ content: c }];
      }
    }
  }

  /** The last deltas when the output ends, and the finish reason to send. */
  finish(finishReason: string): { readonly deltas: Record<string, unknown>[]; readonly finishReason: string } {
    if (this.#plan.mode === 'none' || this.#plan.mode === 'named') return { deltas: [], finishReason };
    let content = '';
    let calls: readonly ParsedToolCall[];
    if (this.#plan.mode === 'auto') ({ content, calls } = this.#auto!.finish());
    else {
      const parsed = toolCallsOf(this.#plan, this.#text);
      calls = parsed.calls;
      if (calls.length === 0) content = this.#text;
    }
    const deltas: Record<string, unknown>[] = content === '' ? [] : [{ content }];
    if (calls.length > 0) deltas.push({ tool_calls: openAiCalls(calls, this.#plan.parser).map((c, index) => ({ index, ...c })) });
    return { deltas, finishReason: calls.length > 0 ? 'tool_calls' : finishReason };
  }
}
