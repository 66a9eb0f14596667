import { z } from 'zod';
import { PeftCode, PeftError } from './errors.js';
import { errorMessage } from '@stageml/ir';

const intRecord = z.record(z.string(), z.number().int().positive());
const numRecord = z.record(z.string(), z.number());

/** The fields of PEFT's `adapter_config.json` StageML reads (others are ignored). */
const schema = z.looseObject({
  peft_type: z.string().optional(),
  r: z.number().int().positive(),
  lora_alpha: z.number(),
  use_rslora: z.boolean().optional().default(false),
  rank_pattern: intRecord.nullish().transform((v) => v ?? {}),
  alpha_pattern: numRecord.nullish().transform((v) => v ?? {}),
  target_modules: z.union([z.array(z.string()), z.string()]).nullish(),
  target_parameters: z.array(z.string()).nullish(),
  exclude_modules: z.union([z.array(z.string()), z.string()]).nullish(),
  fan_in_fan_out: z.boolean().optional().default(false),
  bias: z.enum(['none', 'all', 'lora_only']).optional().default('none'),
  lora_bias: z.boolean().optional().default(false),
  modules_to_save: z.array(z.string()).nullish(),
  layers_to_transform: z.union([z.array(z.number().int().nonnegative()), z.number().int().nonnegative()]).nullish(),
  layers_pattern: z.union([z.array(z.string()), z.string()]).nullish(),
  use_dora: z.boolean().optional().default(false),
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
}

/**
 * Parses `adapter_config.json` text. Non-LoRA PEFT types and DoRA (`use_dora: true`) are refused
 * with `PEFT_UNSUPPORTED` naming the field — DoRA is never loaded as plain LoRA. Malformed
 * configs are `PEFT_BAD_CONFIG` naming the field.
 */
export function parseLoraConfig(text: string, file = 'adapter_config.json'): LoraConfig {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new PeftError(PeftCode.BAD_CONFIG, `${file} is not JSON: ${errorMessage(e)}`, { cause: e });
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
  if (c.use_dora) {
    throw new PeftError(PeftCode.UNSUPPORTED, `${file}: use_dora is true; DoRA adapters are not supported and are never loaded as plain LoRA`);
  }
  if ((c.target_modules === null || c.target_modules === undefined || (Array.isArray(c.target_modules) && c.target_modules.length === 0)) && (c.target_parameters ?? []).length === 0) {
    throw new PeftError(PeftCode.BAD_CONFIG, `${file}: neither target_modules nor target_parameters names anything to adapt`);
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
  };
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/**
 * The pattern key PEFT would use for `module` among `keys`: an exact match, else the first key `k`
 * such that the module name matches `(.*\.)?k$` as a regex (PEFT's `get_pattern_key`).
 */
export function matchPatternKey(keys: readonly string[], module: string): string | undefined {
  if (keys.includes(module)) return module;
  for (const k of keys) {
    let re: RegExp;
    try {
      re = new RegExp(`^(.*\\.)?(${k})$`);
    } catch {
      re = new RegExp(`^(.*\\.)?(${escapeRegExp(k)})$`);
    }
    if (re.test(module)) return k;
  }
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
    if (typeof spec === 'string') return new RegExp(`^(?:${spec})$`).test(module);
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
