import { readFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import type { HostTensor } from '@stageml/ir';
import { SafetensorsFile } from '@stageml/safetensors';
import { type LoraConfig, alphaFor, parseLoraConfig, rankFor, scalingFor } from './config.js';
import { PeftCode, PeftError } from './errors.js';
import { errorMessage } from '@stageml/ir';

/** LoRA factors of one module: Δy = scale · (x·Aᵀ)·Bᵀ (+ biasB). */
export interface LoraModule {
  /** Dotted module path in the base model, e.g. `model.layers.0.self_attn.q_proj`. */
  readonly module: string;
  /** Rank r (rows of A). */
  readonly rank: number;
  /** α of this module. */
  readonly alpha: number;
  /** Scale s = α/r (or α/√r with rsLoRA). */
  readonly scale: number;
  /** Down projection A [r, in]. */
  readonly A: HostTensor;
  /** Up projection B [out, r]. */
  readonly B: HostTensor;
  /** Bias of B [out], when the adapter has `lora_bias`. */
  readonly biasB?: HostTensor;
  /**
   * DoRA magnitude m [out] (`use_dora`): the module computes m / ‖W + s·B·A‖_row ⊙ (x·Wᵀ + s·(x·Aᵀ)·Bᵀ)
   * plus the base bias (PEFT's `DoraLinearLayer`, dropout off).
   */
  readonly magnitude?: HostTensor;
}

/** Embedding rows an adapter replaces (PEFT trainable tokens); on a tied model the head's rows too. */
export interface TokenRows {
  /** The embedding module, e.g. `model.embed_tokens`. */
  readonly module: string;
  /** Token ids whose rows are replaced. */
  readonly indices: readonly number[];
  /** The new rows [indices.length, hidden] (values, not deltas, despite PEFT's key name). */
  readonly rows: HostTensor;
}

/**
 * LoRA factors on a parameter rather than a module (PEFT `target_parameters`, e.g. fused MoE expert
 * tensors): `A` [r·E, in], `B` [out, r·E]. Several targeted parameters of one module nest; `depth`
 * counts the `base_layer` hops of the key (0 = outermost wrapper).
 */
export interface LoraParameterFactors {
  /** Module path owning the parameter, e.g. `model.layers.0.mlp.experts`. */
  readonly module: string;
  /** Nesting depth of the wrapper the factors belong to. */
  readonly depth: number;
  readonly A: HostTensor;
  readonly B: HostTensor;
}

/** A PEFT LoRA adapter loaded from disk. */
export interface LoraAdapter {
  /** Adapter name (the directory name unless given). */
  readonly name: string;
  /** Directory it was loaded from. */
  readonly dir: string;
  /** Parsed configuration. */
  readonly config: LoraConfig;
  /** LoRA factors per module path. */
  readonly modules: ReadonlyMap<string, LoraModule>;
  /** Factors on targeted parameters (MoE experts). */
  readonly parameterFactors: readonly LoraParameterFactors[];
  /** Whole tensors the adapter replaces (`modules_to_save`, retrained biases), by base parameter name. */
  readonly overrides: ReadonlyMap<string, HostTensor>;
  /** Embedding rows the adapter replaces (`trainable_token_indices`); empty for others. */
  readonly tokenRows: readonly TokenRows[];
  /** Bytes of all tensors held. */
  readonly bytes: number;
}

const PREFIX = 'base_model.model.';

/** Largest |value| an adapter tensor may hold (the f16 maximum); beyond it outputs overflow. */
export const MAX_ADAPTER_VALUE = 65504;

/**
 * An adapter tensor as f32, validated: float dtypes (f16, bf16, f64) are converted at load so that
 * every request runs the same f32 programs, other dtypes are `PEFT_BAD_TENSORS`, and a NaN, an
 * infinity or a value beyond ±{@link MAX_ADAPTER_VALUE} is `PEFT_BAD_TENSORS` naming the key and
 * the first bad index — refused at load rather than failing or corrupting every later request.
 */
export function checkedAdapterTensor(t: HostTensor, key: string): HostTensor {
  if (t.dtype !== 'f32' && t.dtype !== 'f16' && t.dtype !== 'bf16' && t.dtype !== 'f64') {
    throw new PeftError(PeftCode.BAD_TENSORS, `tensor '${key}' has dtype ${t.dtype}; adapter tensors must be floating point`);
  }
  const data = t.data instanceof Float32Array ? t.data : Float32Array.from(t.data as ArrayLike<number>);
  for (let i = 0; i < data.length; i++) {
    const v = data[i]!;
    if (!(Math.abs(v) <= MAX_ADAPTER_VALUE)) {
      throw new PeftError(PeftCode.BAD_TENSORS, `tensor '${key}' holds ${String(v)} at index ${String(i)}; adapter values must be finite and within ±${String(MAX_ADAPTER_VALUE)}`);
    }
  }
  return t.dtype === 'f32' && data === t.data ? t : { dtype: 'f32', shape: t.shape, data };
}

function shapeText(s: readonly number[]): string {
  return `[${s.join(', ')}]`;
}

/** Options of {@link loadLoraAdapter}. */
export interface LoadLoraOptions {
  /** Adapter name (default: the directory name). */
  readonly name?: string;
  /**
   * The base model's parameter shapes. When given, every tensor's header (dtype, shape) is checked
   * against the model before any tensor data is read or allocated: an override must have its base
   * parameter's shape, a module's factors must fit its base weight, and no tensor may hold more
   * elements than the largest base parameter. A crafted file declaring a huge tensor is refused
   * from its header alone.
   */
  readonly shapeOf?: (param: string) => readonly number[] | undefined;
  /** With `shapeOf`: most elements any one tensor may hold (the base model's largest parameter). */
  readonly maxElements?: number;
  /**
   * Adapter kinds beyond plain LoRA the caller serves: DoRA (`use_dora`) and trainable tokens
   * (`trainable_token_indices`). Others are `PEFT_UNSUPPORTED` naming the field, never loaded as plain LoRA.
   */
  readonly kinds?: { readonly dora?: boolean; readonly trainableTokens?: boolean };
}

/** Checks every tensor header of `st` against the base model before anything is read (see `LoadLoraOptions.shapeOf`). */
function checkHeaderAgainstBase(st: SafetensorsFile, file: string, config: LoraConfig, shapeOf: (param: string) => readonly number[] | undefined, largest: number): void {
  for (const key of st.names()) {
    const { shape } = st.info(key);
    const elements = shape.reduce((a, d) => a * d, 1);
    if (elements > largest) {
      throw new PeftError(PeftCode.SHAPE_MISMATCH, `${file}: tensor '${key}' ${shapeText(shape)} holds ${String(elements)} elements, more than any parameter of the base model (${String(largest)}); nothing was read`);
    }
    const k = key.startsWith(PREFIX) ? key.slice(PREFIX.length) : key;
    const m = /^(.*)\.lora_([AB])\.weight$/.exec(k);
    if (m === null) {
      if (/\.lora_[AB]\.bias$|\.lora_embedding_|\.lora_magnitude_vector|\.token_adapter\.trainable_tokens_delta$/.test(k)) continue;
      const name = k.replace(/\.modules_to_save(\.[^.]+)?\./, '.');
      const want = shapeOf(name);
      if (want === undefined) throw new PeftError(PeftCode.UNKNOWN_MODULE, `${file}: tensor '${key}' replaces no base parameter`);
      if (want.length !== shape.length || want.some((d, i) => d !== shape[i])) throw new PeftError(PeftCode.SHAPE_MISMATCH, `${file}: '${key}' is ${shapeText(shape)} but the base parameter is ${shapeText(want)}`);
      continue;
    }
    const [, path, which] = m as unknown as [string, string, 'A' | 'B'];
    if (path.includes('.base_layer') || config.targetParameters.some((p) => path.endsWith(p.split('.').slice(0, -1).join('.')))) continue;
    const w = shapeOf(`${path}.weight`);
    if (w === undefined) throw new PeftError(PeftCode.UNKNOWN_MODULE, `${file}: module '${path}' has no base parameter '${path}.weight'`, { hint: 'was the adapter made for another base model?' });
    if (w.length !== 2) continue;
    const [out, inDim] = config.fanInFanOut ? [w[1]!, w[0]!] : [w[0]!, w[1]!];
    const rank = rankFor(config, path);
    const want = which === 'A' ? [rank, inDim] : [out, rank];
    if (shape.length !== 2 || shape[0] !== want[0] || shape[1] !== want[1]) {
      throw new PeftError(PeftCode.SHAPE_MISMATCH, `${file}: '${key}' is ${shapeText(shape)}; base '${path}.weight' ${shapeText(w)} at rank ${String(rank)} needs ${shapeText(want)}`);
    }
  }
}

/**
 * Loads a PEFT LoRA adapter directory (`adapter_config.json` + `adapter_model.safetensors`). Every
 * tensor key is mapped: `base_model.model.<module>.lora_A.weight` / `lora_B.weight` / `lora_B.bias`
 * to module factors, `…base_layer….lora_A.weight` to parameter factors, anything else to an
 * override of a base parameter. Ranks are checked against `r`/`rank_pattern`; a module with only one
 * factor is `PEFT_BAD_TENSORS`; embedding LoRA is `PEFT_UNSUPPORTED`. With `opts.shapeOf`, every tensor
 * header is checked against the base model before any tensor data is read.
 */
export async function loadLoraAdapter(dir: string, opts: LoadLoraOptions = {}): Promise<LoraAdapter> {
  const cfgPath = join(dir, 'adapter_config.json');
  let cfgText: string;
  try {
    cfgText = await readFile(cfgPath, 'utf8');
  } catch (e) {
    throw new PeftError(PeftCode.IO, `cannot read ${cfgPath}: ${errorMessage(e)}`, { cause: e });
  }
  const config = parseLoraConfig(cfgText, cfgPath);
  if (config.useDora && opts.kinds?.dora !== true) throw new PeftError(PeftCode.UNSUPPORTED, `${cfgPath}: use_dora is true; DoRA adapters are not supported here and are never loaded as plain LoRA`);
  const tokenModules = Object.keys(config.trainableTokenIndices);
  if (tokenModules.length > 0 && opts.kinds?.trainableTokens !== true) throw new PeftError(PeftCode.UNSUPPORTED, `${cfgPath}: trainable_token_indices is set; trainable tokens are not supported here`);
  const file = join(dir, 'adapter_model.safetensors');
  let st: SafetensorsFile;
  try {
    st = await SafetensorsFile.open(file);
  } catch (e) {
    if (e instanceof PeftError) throw e;
    const code = (e as { code?: unknown }).code;
    throw code === 'ST_IO'
      ? new PeftError(PeftCode.IO, `cannot read ${file}: ${errorMessage(e)}`, { cause: e })
      : new PeftError(PeftCode.BAD_TENSORS, `${file}: ${errorMessage(e)}`, { cause: e });
  }
  try {
    if (opts.shapeOf !== undefined) checkHeaderAgainstBase(st, file, config, opts.shapeOf, opts.maxElements ?? Infinity);
    const factors = new Map<string, { A?: HostTensor; B?: HostTensor; biasB?: HostTensor }>();
    const paramFactors = new Map<string, { module: string; depth: number; A?: HostTensor; B?: HostTensor }>();
    const overrides = new Map<string, HostTensor>();
    const magnitudes = new Map<string, HostTensor>();
    const tokenRows: TokenRows[] = [];
    let bytes = 0;
    const keys = st.names();
    // One read of the file's tensors (an adapter is small: its header was checked against the model above).
    const read = await st.readTensors(keys);
    for (const [i, key] of keys.entries()) {
      const t = checkedAdapterTensor(read[i]!, key);
      bytes += t.data.byteLength;
      const k = key.startsWith(PREFIX) ? key.slice(PREFIX.length) : key;
      if (/\.lora_embedding_[AB]$|\.lora_embedding_[AB]\./.test(k)) {
        throw new PeftError(PeftCode.UNSUPPORTED, `${file}: tensor '${key}' belongs to an embedding-LoRA layer, which is not supported`);
      }
      const mag = /^(.*)\.lora_magnitude_vector(\.weight)?$/.exec(k);
      if (mag !== null) {
        if (!config.useDora) throw new PeftError(PeftCode.BAD_TENSORS, `${file}: tensor '${key}' is a DoRA magnitude but use_dora is false`);
        magnitudes.set(mag[1]!, t);
        continue;
      }
      const tok = /^(.*)\.token_adapter\.trainable_tokens_delta$/.exec(k);
      if (tok !== null) {
        const module = tok[1]!;
        const short = tokenModules.find((n) => module === n || module.endsWith(`.${n}`));
        if (short === undefined) throw new PeftError(PeftCode.BAD_TENSORS, `${file}: tensor '${key}' holds trainable tokens of '${module}', which trainable_token_indices does not name`);
        const indices = config.trainableTokenIndices[short]!;
        if (t.shape.length !== 2 || t.shape[0] !== indices.length) throw new PeftError(PeftCode.SHAPE_MISMATCH, `${file}: '${key}' is ${shapeText(t.shape)}; trainable_token_indices names ${String(indices.length)} tokens`);
        tokenRows.push({ module, indices, rows: t });
        continue;
      }
      const m = /^(.*)\.lora_([AB])\.(weight|bias)$/.exec(k);
      if (m === null) {
        overrides.set(k.replace(/\.modules_to_save(\.[^.]+)?\./, '.'), t);
        continue;
      }
      const [, path, which, kind] = m as unknown as [string, string, 'A' | 'B', 'weight' | 'bias'];
      // A targeted parameter's module is the path before its name; a bare name (PEFT writes
      // `down_proj` beside `mlp.experts.down_proj` for MoE experts) names no module, so it matches none.
      if (path.includes('.base_layer') || config.targetParameters.some((p) => p.includes('.') && path.endsWith(p.split('.').slice(0, -1).join('.')))) {
        if (kind === 'bias') throw new PeftError(PeftCode.BAD_TENSORS, `${file}: unexpected bias '${key}' on a parameter-targeted LoRA`);
        const depth = (path.match(/\.base_layer/g) ?? []).length;
        const module = path.replace(/(\.base_layer)+$/, '');
        const entry = paramFactors.get(path) ?? { module, depth };
        entry[which] = t;
        paramFactors.set(path, entry);
        continue;
      }
      const entry = factors.get(path) ?? {};
      if (kind === 'bias') {
        if (which !== 'B') throw new PeftError(PeftCode.BAD_TENSORS, `${file}: unexpected tensor '${key}'`);
        entry.biasB = t;
      } else entry[which] = t;
      factors.set(path, entry);
    }
    const modules = new Map<string, LoraModule>();
    for (const [module, f] of factors) {
      if (f.A === undefined || f.B === undefined) {
        throw new PeftError(PeftCode.BAD_TENSORS, `${file}: module '${module}' has lora_${f.A === undefined ? 'B' : 'A'} but no lora_${f.A === undefined ? 'A' : 'B'}`);
      }
      const rank = rankFor(config, module);
      if (f.A.shape.length !== 2 || f.B.shape.length !== 2 || f.A.shape[0] !== rank || f.B.shape[1] !== rank) {
        throw new PeftError(
          PeftCode.SHAPE_MISMATCH,
          `${file}: module '${module}' has lora_A ${shapeText(f.A.shape)} and lora_B ${shapeText(f.B.shape)}, expected rank ${String(rank)} (A [r, in], B [out, r])`,
        );
      }
      const magnitude = magnitudes.get(module);
      if (config.useDora && magnitude === undefined) throw new PeftError(PeftCode.BAD_TENSORS, `${file}: module '${module}' has no lora_magnitude_vector but use_dora is true`);
      if (magnitude !== undefined && (magnitude.shape.length !== 1 || magnitude.shape[0] !== f.B.shape[0])) throw new PeftError(PeftCode.SHAPE_MISMATCH, `${file}: '${module}.lora_magnitude_vector' is ${shapeText(magnitude.shape)}; lora_B has ${String(f.B.shape[0])} outputs`);
      modules.set(module, { module, rank, alpha: alphaFor(config, module), scale: scalingFor(config, module), A: f.A, B: f.B, ...(f.biasB === undefined ? {} : { biasB: f.biasB }), ...(magnitude === undefined ? {} : { magnitude }) });
    }
    for (const m of magnitudes.keys()) if (!factors.has(m)) throw new PeftError(PeftCode.BAD_TENSORS, `${file}: '${m}.lora_magnitude_vector' belongs to no LoRA module`);
    for (const n of tokenModules) if (!tokenRows.some((r) => r.module === n || r.module.endsWith(`.${n}`))) throw new PeftError(PeftCode.BAD_TENSORS, `${file}: trainable_token_indices names '${n}' but no trainable_tokens_delta of it is saved`);
    const parameterFactors: LoraParameterFactors[] = [];
    for (const [path, f] of paramFactors) {
      if (f.A === undefined || f.B === undefined) throw new PeftError(PeftCode.BAD_TENSORS, `${file}: '${path}' has only one of lora_A/lora_B`);
      parameterFactors.push({ module: f.module, depth: f.depth, A: f.A, B: f.B });
    }
    return { name: opts.name ?? basename(dir), dir, config, modules, parameterFactors, overrides, tokenRows, bytes };
  } catch (e) {
    if (e instanceof PeftError) throw e;
    throw new PeftError(PeftCode.BAD_TENSORS, `${file}: ${errorMessage(e)}`, { cause: e });
  } finally {
    await st.close();
  }
}

/**
 * Checks an adapter against a base model's parameter shapes: every LoRA module must have a base
 * `<module>.weight` [out, in] (or [in, out] with `fan_in_fan_out`) with A [r, in] and B [out, r];
 * every override must replace a parameter of the same shape. Errors name the key and both shapes
 * (`PEFT_SHAPE_MISMATCH`) or the missing module (`PEFT_UNKNOWN_MODULE`): an adapter made for another
 * base model fails here.
 */
export function checkAdapterAgainstBase(adapter: LoraAdapter, shapeOf: (param: string) => readonly number[] | undefined): void {
  for (const m of adapter.modules.values()) {
    const key = `${m.module}.weight`;
    const w = shapeOf(key);
    if (w === undefined) {
      throw new PeftError(PeftCode.UNKNOWN_MODULE, `adapter '${adapter.name}': module '${m.module}' has no base parameter '${key}'`, { hint: 'was the adapter made for another base model?' });
    }
    if (w.length !== 2) throw new PeftError(PeftCode.SHAPE_MISMATCH, `adapter '${adapter.name}': base '${key}' is ${shapeText(w)}, not a matrix`);
    const [out, inDim] = adapter.config.fanInFanOut ? [w[1]!, w[0]!] : [w[0]!, w[1]!];
    if (m.A.shape[1] !== inDim) {
      throw new PeftError(PeftCode.SHAPE_MISMATCH, `adapter '${adapter.name}': '${m.module}.lora_A.weight' is ${shapeText(m.A.shape)} but base '${key}' is ${shapeText(w)} (input dim ${String(inDim)})`);
    }
    if (m.B.shape[0] !== out) {
      throw new PeftError(PeftCode.SHAPE_MISMATCH, `adapter '${adapter.name}': '${m.module}.lora_B.weight' is ${shapeText(m.B.shape)} but base '${key}' is ${shapeText(w)} (output dim ${String(out)})`);
    }
  }
  for (const [name, t] of adapter.overrides) {
    const w = shapeOf(name);
    if (w === undefined) throw new PeftError(PeftCode.UNKNOWN_MODULE, `adapter '${adapter.name}': tensor '${name}' replaces no base parameter`);
    if (w.length !== t.shape.length || w.some((d, i) => d !== t.shape[i])) {
      throw new PeftError(PeftCode.SHAPE_MISMATCH, `adapter '${adapter.name}': '${name}' is ${shapeText(t.shape)} but the base parameter is ${shapeText(w)}`);
    }
  }
}
