import { errorMessage, jsonDepth } from '@stageml/ir';
import { RE2JS } from 're2js';
import { z } from 'zod';
import { PeftCode, PeftError } from './errors.js';

/** Largest |α| (`lora_alpha`, `alpha_pattern` values) an adapter may declare; beyond it the scale is absurd. */
export const MAX_LORA_ALPHA = 65536;
/** Longest regex (`target_modules`, pattern keys) a config may hold, in characters. */
export const MAX_PATTERN_LENGTH = 1024;
/** Deepest JSON nesting `adapter_config.json` may have. */
export const MAX_CONFIG_DEPTH = 32;

const alpha = z.number().refine((a) => Number.isFinite(a) && Math.abs(a) <= MAX_LORA_ALPHA, `must be a finite number with |alpha| <= ${String(MAX_LORA_ALPHA)}`);
const intRecord = z.record(z.string().max(MAX_PATTERN_LENGTH), z.number().int().positive().max(1 << 20));
const numRecord = z.record(z.string().max(MAX_PATTERN_LENGTH), alpha);

/** The fields of PEFT's `adapter_config.json` StageML reads (others are ignored). */
const schema = z.looseObject({
  peft_type: z.string().optional(),
  r: z.number().int().positive().max(1 << 20),
  lora_alpha: alpha,
  use_rslora: z.boolean().optional().default(false),
  rank_pattern: intRecord.nullish().transform((v) => v ?? {}),
  alpha_pattern: numRecord.nullish().transform((v) => v ?? {}),
  target_modules: z.union([z.array(z.string()), z.string().max(MAX_PATTERN_LENGTH)]).nullish(),
  target_parameters: z.array(z.string()).nullish(),
  exclude_modules: z.union([z.array(z.string()), z.string().max(MAX_PATTERN_LENGTH)]).nullish(),
  fan_in_fan_out: z.boolean().optional().default(false),
  bias: z.enum(['none', 'all', 'lora_only']).optional().default('none'),
  lora_bias: z.boolean().optional().default(false),
  modules_to_save: z.array(z.string()).nullish(),
  layers_to_transform: z.union([z.array(z.number().int().nonnegative()), z.number().int().nonnegative()]).nullish(),
  layers_pattern: z.union([z.array(z.string()), z.string()]).nullish(),
  use_dora: z.boolean().optional().default(false),
  trainable_token_indices: z.union([z.array(z.number().int().nonnegative()), z.record(z.string(), z.array(z.number().int().nonnegative()))]).nullish(),
  base_model_name_or_path: z.string().nullish(),
  task_type: z.string().nullish(),
});

/** A parsed, validated LoRA adapter configuration. */
export interface LoraConfig {
  /** Default rank r. */
  readonly r: number;
  /** Default α. */
  readonly loraAlpha: number;
  /** Scale α/√r instead of α/r (rsLoRA). */
  readonly useRslora: boolean;
  /** Per-module rank overrides (PEFT key-matching rules). */
  readonly rankPattern: Readonly<Record<string, number>>;
  /** Per-module α overrides. */
  readonly alphaPattern: Readonly<Record<string, number>>;
  /** Module names or a regex (full match) of modules LoRA targets. */
  readonly targetModules: readonly string[] | string | undefined;
  /** Parameters (not modules) LoRA targets, e.g. fused MoE expert tensors. */
  readonly targetParameters: readonly string[];
  /** Modules excluded from targeting. */
  readonly excludeModules: readonly string[] | string | undefined;
  /** Whether base weights are stored [in, out] (GPT-2 Conv1D). */
  readonly fanInFanOut: boolean;
  /** Which base biases the adapter retrains (`all`, `lora_only`) and saves. */
  readonly bias: 'none' | 'all' | 'lora_only';
  /** Whether `lora_B` carries a bias. */
  readonly loraBias: boolean;
  /** Modules whose full weights the adapter replaces. */
  readonly modulesToSave: readonly string[];
  /** Layer indices LoRA applies to (all when undefined). */
  readonly layersToTransform: readonly number[] | undefined;
  /** Name of the layer container(s) for `layersToTransform`. */
  readonly layersPattern: readonly string[] | undefined;
  /** The base model the adapter was trained on, when recorded. */
  readonly baseModel: string | undefined;
  /** DoRA (`use_dora`): each adapted module carries a magnitude vector (loaded only where asked for, `LoadLoraOptions.kinds`). */
  readonly useDora: boolean;
  /** Trainable tokens (`trainable_token_indices`): embedding rows the adapter replaces, per embedding module. */
  readonly trainableTokenIndices: Readonly<Record<string, readonly number[]>>;
}

/**
 * Parses `adapter_config.json` text. Non-LoRA PEFT types are refused with `PEFT_UNSUPPORTED`; DoRA
 * (`use_dora`) and trainable tokens are parsed here and refused by `loadLoraAdapter` unless its
 * caller serves them (`LoadLoraOptions.kinds`) — never loaded as plain LoRA. Malformed
 * configs are `PEFT_BAD_CONFIG` naming the field.
 */
export function parseLoraConfig(text: string, file = 'adapter_config.json'): LoraConfig {
  let raw: unknown;
  const depth = jsonDepth(text);
  if (depth > MAX_CONFIG_DEPTH) throw new PeftError(PeftCode.BAD_CONFIG, `${file} nests ${String(depth)} levels deep; the limit is ${String(MAX_CONFIG_DEPTH)}`);
  try {
    raw = JSON.parse(text);
  } catch (e) {
    // NOTE: the parser's message quotes the text; it is left out so that a config pointed at
    // another file never echoes that file's contents.
    throw new PeftError(PeftCode.BAD_CONFIG, `${file} is not valid JSON`, { cause: e });
  }
  const peftType = (raw as { peft_type?: unknown } | null)?.peft_type;
  if (peftType !== undefined && peftType !== 'LORA') {
    throw new PeftError(PeftCode.UNSUPPORTED, `${file}: peft_type ${JSON.stringify(peftType)} is not supported (only LORA)`);
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new PeftError(PeftCode.BAD_CONFIG, `${file}: field '${issue.path.join('.') || '(root)'}': ${issue.message}`);
  }
  const c = parsed.data;
  if (c.use_dora && c.lora_bias) throw new PeftError(PeftCode.BAD_CONFIG, `${file}: field 'lora_bias': not allowed with use_dora (PEFT refuses the pair too)`);
  if ((c.target_modules === null || c.target_modules === undefined || (Array.isArray(c.target_modules) && c.target_modules.length === 0)) && (c.target_parameters ?? []).length === 0) {
    throw new PeftError(PeftCode.BAD_CONFIG, `${file}: neither target_modules nor target_parameters names anything to adapt`);
  }
  for (const [field, v] of [['target_modules', c.target_modules], ['exclude_modules', c.exclude_modules]] as const) {
    if (typeof v === 'string') fullMatcher(v, `${file}: field '${field}'`);
  }
  for (const [field, rec] of [['rank_pattern', c.rank_pattern], ['alpha_pattern', c.alpha_pattern]] as const) {
    for (const k of Object.keys(rec)) {
      const where = `${file}: field '${field}.${k.slice(0, 64)}'`;
      // PEFT compiles every key as a regex (`re.fullmatch`): a key that is no regex fails there, so
      // it is refused at load rather than silently matched as text.
      const problem = regexProblem(k);
      if (problem !== undefined) throw new PeftError(PeftCode.BAD_CONFIG, `${where}: not a valid regular expression (${problem.slice(0, 120)})`);
      patternMatcher(k, where);
    }
  }
  const toList = (v: string | string[] | null | undefined): string[] | undefined => (v === null || v === undefined ? undefined : Array.isArray(v) ? v : [v]);
  return {
    r: c.r,
    loraAlpha: c.lora_alpha,
    useRslora: c.use_rslora,
    rankPattern: c.rank_pattern,
    alphaPattern: c.alpha_pattern,
    targetModules: c.target_modules ?? undefined,
    targetParameters: c.target_parameters ?? [],
    excludeModules: c.exclude_modules ?? undefined,
    fanInFanOut: c.fan_in_fan_out,
    bias: c.bias,
    loraBias: c.lora_bias,
    modulesToSave: c.modules_to_save ?? [],
    // NOTE: PEFT treats an empty list like no list: every layer (`is_using_layer_indexes`).
    layersToTransform: c.layers_to_transform === null || c.layers_to_transform === undefined ? undefined : Array.isArray(c.layers_to_transform) ? (c.layers_to_transform.length === 0 ? undefined : c.layers_to_transform) : [c.layers_to_transform],
    layersPattern: toList(c.layers_pattern),
    baseModel: c.base_model_name_or_path ?? undefined,
    useDora: c.use_dora,
    // PEFT: a list means the input embedding (`embed_tokens`); a dict maps embedding module names to lists.
    trainableTokenIndices: c.trainable_token_indices === null || c.trainable_token_indices === undefined ? {} : Array.isArray(c.trainable_token_indices) ? { embed_tokens: c.trainable_token_indices } : c.trainable_token_indices,
  };
}

/** Why `source` is no regular expression (in both RE2 and JavaScript syntax), or undefined when it is one. */
function regexProblem(source: string): string | undefined {
  try {
    RE2JS.compile(source);
    return undefined;
  } catch (e) {
    try {
      new RegExp(source);
      return undefined;
    } catch {
      return errorMessage(e);
    }
  }
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** A compiled linear-time matcher: whether a whole module name matches. */
type FullMatch = (name: string) => boolean;
const compiled = new Map<string, FullMatch>();

function cached(key: string, make: () => FullMatch): FullMatch {
  let m = compiled.get(key);
  if (m === undefined) {
    m = make();
    if (compiled.size >= 4096) compiled.clear();
    compiled.set(key, m);
  }
  return m;
}

/**
 * Compiles `source` for a full match (Python's `re.fullmatch`) with RE2 semantics: matching is
 * linear in the name's length whatever the pattern, so a hostile config cannot freeze the server
 * with catastrophic backtracking. Features RE2 lacks (backreferences, lookaround) are
 * `PEFT_UNSUPPORTED` naming `where`; so is a syntax error.
 */
function fullMatcher(source: string, where: string): FullMatch {
  return cached(`f\u0000${source}`, () => {
    let re: RE2JS;
    try {
      re = RE2JS.compile(source);
    } catch (e) {
      throw new PeftError(PeftCode.UNSUPPORTED, `${where}: regex is not supported (${errorMessage(e).slice(0, 120)}); only linear-time (RE2) syntax is accepted`, { cause: e });
    }
    return (name) => re.matches(name);
  });
}

/**
 * PEFT's pattern-key matcher for `key`: `re.fullmatch(rf"(.*\.)?({key})", name)`, linear time.
 * A key that is no regex at all (invalid in both RE2 and JavaScript) matches literally, as before;
 * a key needing a backtracking feature is `PEFT_UNSUPPORTED`.
 */
function patternMatcher(key: string, where: string): FullMatch {
  return cached(`p\u0000${key}`, () => {
    try {
      const re = RE2JS.compile(`(.*\\.)?(${key})`);
      return (name) => re.matches(name);
    } catch (e) {
      let jsValid = true;
      try {
        new RegExp(key);
      } catch {
        jsValid = false;
      }
      if (jsValid) throw new PeftError(PeftCode.UNSUPPORTED, `${where}: regex is not supported (${errorMessage(e).slice(0, 120)}); only linear-time (RE2) syntax is accepted`, { cause: e });
      const re = RE2JS.compile(`(.*\\.)?(${escapeRegExp(key)})`);
      return (name) => re.matches(name);
    }
  });
}

/**
 * The pattern key PEFT would use for `module` among `keys`: an exact match, else the first key `k`
 * such that the module name fully matches `(.*\.)?k` as a regex (PEFT's `get_pattern_key`),
 * matched by RE2 in linear time.
 */
export function matchPatternKey(keys: readonly string[], module: string): string | undefined {
  if (keys.includes(module)) return module;
  for (const k of keys) if (patternMatcher(k, `pattern key '${k.slice(0, 64)}'`)(module)) return k;
  return undefined;
}

/** Rank of `module` under `rank_pattern`. */
export function rankFor(cfg: LoraConfig, module: string): number {
  const k = matchPatternKey(Object.keys(cfg.rankPattern), module);
  return k === undefined ? cfg.r : cfg.rankPattern[k]!;
}

/** α of `module` under `alpha_pattern`. */
export function alphaFor(cfg: LoraConfig, module: string): number {
  const k = matchPatternKey(Object.keys(cfg.alphaPattern), module);
  return k === undefined ? cfg.loraAlpha : cfg.alphaPattern[k]!;
}

/** The LoRA scale of `module`: α/r, or α/√r with rsLoRA. */
export function scalingFor(cfg: LoraConfig, module: string): number {
  const r = rankFor(cfg, module);
  const a = alphaFor(cfg, module);
  return cfg.useRslora ? a / Math.sqrt(r) : a / r;
}

function layerIndex(module: string, patterns: readonly string[] | undefined): number | undefined {
  const names = patterns ?? ['layers', 'h', 'blocks', 'layer'];
  for (const p of names) {
    const m = new RegExp(`(?:^|\\.)${escapeRegExp(p)}\\.(\\d+)(?:\\.|$)`).exec(module);
    if (m !== null) return Number(m[1]);
  }
  return undefined;
}

/**
 * Whether LoRA targets `module` (a dotted module path such as `model.layers.0.self_attn.q_proj`):
 * a list entry matches the whole name or its last components (`q_proj`, `self_attn.q_proj`); a
 * string is a regex that must match the whole name; `exclude_modules` and `modules_to_save`
 * exclude; `layers_to_transform` narrows list entries matched by suffix (PEFT's
 * `check_target_module_exists`: a full-name list entry or a regex ignores the layer filter).
 */
export function targetsModule(cfg: LoraConfig, module: string): boolean {
  const matches = (spec: readonly string[] | string | undefined): boolean => {
    if (spec === undefined) return false;
    if (typeof spec === 'string') return fullMatcher(spec, 'target_modules')(module);
    return spec.some((t) => module === t || module.endsWith(`.${t}`));
  };
  if (matches(cfg.excludeModules)) return false;
  if (cfg.modulesToSave.some((m) => new RegExp(`(?:^|\\.)${escapeRegExp(m)}(?:$|\\.)`).test(module))) return false;
  if (!matches(cfg.targetModules)) return false;
  if (typeof cfg.targetModules === 'string' || cfg.targetModules?.includes(module) === true) return true;
  if (cfg.layersToTransform !== undefined) {
    const idx = layerIndex(module, cfg.layersPattern);
    if (idx === undefined || !cfg.layersToTransform.includes(idx)) return false;
  }
  return true;
}
