import { randomBytes } from 'node:crypto';

/** One parsed tool call: the function's name and its arguments as JSON text (OpenAI's shape). */
export interface ParsedToolCall {
  readonly name: string;
  readonly arguments: string;
}

/** What a parser finds in a model's output: the text outside the calls (null when none), and the calls. */
export interface ParsedOutput {
  readonly content: string | null;
  readonly calls: readonly ParsedToolCall[];
}

/** The tool-call formats of `--tool-call-parser` (vLLM's names). */
export const TOOL_PARSERS = ['hermes', 'llama3_json', 'mistral'] as const;
/** A `--tool-call-parser` name. */
export type ToolParserName = (typeof TOOL_PARSERS)[number];

const noContent = (text: string): string | null => (text.trim() === '' ? null : text);

/** A call object `{name, arguments|parameters}` as arguments JSON text, or undefined. */
function callOf(v: unknown): ParsedToolCall | undefined {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return undefined;
  const o = v as { name?: unknown; arguments?: unknown; parameters?: unknown };
  if (typeof o.name !== 'string' || o.name === '') return undefined;
  const args = o.arguments ?? o.parameters ?? {};
  return { name: o.name, arguments: typeof args === 'string' ? args : JSON.stringify(args) };
}

/**
 * The JSON values at the start of `text` one after another, separated by `sep` (and whitespace):
 * the values and the index after the last, or undefined when the first does not parse.
 */
function jsonValues(text: string, sep: string): unknown[] | undefined {
  const out: unknown[] = [];
  let i = 0;
  for (;;) {
    while (i < text.length && /\s/.test(text[i]!)) i++;
    const end = jsonEnd(text, i);
    if (end === undefined) return out.length === 0 ? undefined : out;
    try {
      out.push(JSON.parse(text.slice(i, end)));
    } catch {
      return out.length === 0 ? undefined : out;
    }
    i = end;
    while (i < text.length && /\s/.test(text[i]!)) i++;
    if (i >= text.length) return out;
    if (sep === '' || !text.startsWith(sep, i)) return undefined;
    i += sep.length;
  }
}

/** The end of the JSON object or array starting at `from` (brackets balanced outside strings), or undefined. */
function jsonEnd(text: string, from: number): number | undefined {
  if (text[from] !== '{' && text[from] !== '[') return undefined;
  let depth = 0;
  let inString = false;
  for (let i = from; i < text.length; i++) {
    const c = text[i]!;
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === '{' || c === '[') depth++;
    else if (c === '}' || c === ']') {
      depth--;
      if (depth === 0) return i + 1;
    }
  }
  return undefined;
}

/**
 * Hermes / Qwen 2.5 / Qwen 3 format: each call is `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
 * (the closing tag may be missing at the end of the output); the text before the first call is
 * the content. A call whose JSON does not parse leaves the whole output as content.
 */
export function parseHermes(text: string): ParsedOutput {
  const at = text.indexOf('<tool_call>');
  if (at < 0) return { content: noContent(text), calls: [] };
  const calls: ParsedToolCall[] = [];
  const re = /<tool_call>\s*([\s\S]*?)\s*(?:<\/tool_call>|$)/g;
  for (const m of text.slice(at).matchAll(re)) {
    let v: unknown;
    try {
      v = JSON.parse(m[1]!);
    } catch {
      return { content: noContent(text), calls: [] };
    }
    const c = callOf(v);
    if (c === undefined) return { content: noContent(text), calls: [] };
    calls.push(c);
  }
  return { content: noContent(text.slice(0, at)), calls };
}

/**
 * Llama 3.1 / 3.2 JSON format: the output is one or more `{"name": …, "parameters": {…}}` objects
 * (`arguments` also read) separated by `;`, optionally after `<|python_tag|>`. Anything else is content.
 */
export function parseLlama3Json(text: string): ParsedOutput {
  let body = text.trimStart();
  if (body.startsWith('<|python_tag|>')) body = body.slice('<|python_tag|>'.length).trimStart();
  if (!body.startsWith('{')) return { content: noContent(text), calls: [] };
  const values = jsonValues(body, ';');
  const calls = values?.map(callOf);
  if (calls === undefined || calls.some((c) => c === undefined)) return { content: noContent(text), calls: [] };
  return { content: null, calls: calls as ParsedToolCall[] };
}

/**
 * Mistral format: `[TOOL_CALLS]` then a JSON list of `{"name": …, "arguments": {…}}` (tokenizer
 * v3), or one or more `name[ARGS]{…}` (tokenizer v11+, `name[CALL_ID]id[ARGS]{…}` too); the text
 * before the marker is the content. Where the marker was dropped with special tokens, an output
 * that is exactly such a JSON list is read as calls as well.
 */
export function parseMistral(text: string): ParsedOutput {
  const at = text.indexOf('[TOOL_CALLS]');
  const head = at < 0 ? '' : text.slice(0, at);
  const rest = (at < 0 ? text : text.slice(at + '[TOOL_CALLS]'.length)).trim();
  if (rest.startsWith('[')) {
    const values = jsonValues(rest, '');
    const list = values?.length === 1 && Array.isArray(values[0]) ? (values[0] as unknown[]) : undefined;
    const calls = list?.map(callOf);
    if (calls !== undefined && calls.length > 0 && calls.every((c) => c !== undefined)) return { content: noContent(head), calls: calls };
    return { content: noContent(text), calls: [] };
  }
  if (at < 0) return { content: noContent(text), calls: [] };
  const calls: ParsedToolCall[] = [];
  let s = rest;
  while (s.length > 0) {
    const m = /^([A-Za-z0-9_.-]+)(?:\[CALL_ID\][A-Za-z0-9]+)?\[ARGS\]/.exec(s);
    if (m === null) return { content: noContent(text), calls: [] };
    const from = m[0].length;
    const end = jsonEnd(s, from);
    if (end === undefined) return { content: noContent(text), calls: [] };
    calls.push({ name: m[1]!, arguments: s.slice(from, end) });
    s = s.slice(end).replace(/^\s*(\[TOOL_CALLS\])?\s*/, '');
  }
  return { content: noContent(head), calls };
}

/** The parser of a `--tool-call-parser` name. */
export const toolParsers: Readonly<Record<ToolParserName, (text: string) => ParsedOutput>> = {
  hermes: parseHermes,
  llama3_json: parseLlama3Json,
  mistral: parseMistral,
};

/** The strings after which a format's output is a tool call (the stream holds text back from there). */
const START: Readonly<Record<ToolParserName, readonly string[]>> = {
  hermes: ['<tool_call>'],
  llama3_json: ['<|python_tag|>'],
  mistral: ['[TOOL_CALLS]'],
};

/**
 * Splits a streamed output into content deltas and, at the end, tool calls: text is passed on
 * until a call could start (a start marker, or its prefix at the end of the text so far, or — for
 * llama3_json and mistral, whose calls may be bare JSON — a first non-blank character `{` or `[`),
 * then held back; `finish` parses the whole output and returns the held text as content when it
 * holds no call.
 */
export class ToolCallStream {
  readonly #parser: ToolParserName;
  #text = '';
  #sent = 0;
  #holding = false;

  /** A splitter for `parser`'s format. */
  constructor(parser: ToolParserName) {
    this.#parser = parser;
  }

  /** Adds `delta`; returns the content that may be sent now ('' while holding). */
  push(delta: string): string {
    this.#text += delta;
    if (this.#holding) return '';
    const text = this.#text;
    const lead = text.trimStart();
    if (this.#sent === 0 && this.#parser !== 'hermes' && (lead.startsWith('{') || lead.startsWith('['))) {
      this.#holding = true;
      return '';
    }
    let safe = text.length;
    for (const marker of START[this.#parser]) {
      const at = text.indexOf(marker, Math.max(0, this.#sent - marker.length));
      if (at >= 0) {
        this.#holding = true;
        safe = Math.min(safe, at);
        continue;
      }
      // A marker's prefix at the end may still become the marker.
      for (let k = Math.min(marker.length - 1, text.length); k > 0; k--) {
        if (text.endsWith(marker.slice(0, k))) {
          safe = Math.min(safe, text.length - k);
          break;
        }
      }
    }
    if (this.#sent === 0 && lead === '' && this.#parser !== 'hermes') safe = 0;
    const out = text.slice(this.#sent, Math.max(this.#sent, safe));
    this.#sent = Math.max(this.#sent, safe);
    return out;
  }

  /** The whole output parsed, with the content not yet sent (when it holds no call). */
  finish(): { readonly calls: readonly ParsedToolCall[]; readonly content: string } {
    const parsed = toolParsers[this.#parser](this.#text);
    if (parsed.calls.length === 0) return { calls: [], content: this.#text.slice(this.#sent) };
    return { calls: parsed.calls, content: '' };
  }
}

/** A tool call id: vLLM's `chatcmpl-tool-<hex>`, or nine letters and digits for Mistral (its templates require them). */
export function toolCallId(parser?: ToolParserName): string {
  if (parser === 'mistral') {
    const abc = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
    return Array.from(randomBytes(9), (b) => abc[b % abc.length]).join('');
  }
  return `chatcmpl-tool-${randomBytes(16).toString('hex')}`;
}
