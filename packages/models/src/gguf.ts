import { open } from 'node:fs/promises';
import { type HostTensor, errorMessage, f16Bits, f16FromBits } from '@stageml/ir';
import { ModelCode, ModelError } from './errors.js';
import type { LlamaConfig } from './hf-config.js';

// GGUF v3 (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): "GGUF", version, tensor
// count, metadata count; metadata key/values; tensor infos (name, dims fastest first, type,
// offset); tensor data, each aligned to `general.alignment` (32).

/** GGUF metadata value types. */
const VT = { U8: 0, I8: 1, U16: 2, I16: 3, U32: 4, I32: 5, F32: 6, BOOL: 7, STRING: 8, ARRAY: 9, U64: 10, I64: 11, F64: 12 } as const;

/** ggml tensor types the writer emits. */
export const GGML_TYPE = { F32: 0, F16: 1, Q4_0: 2, Q8_0: 8 } as const;

/** One of `GGML_TYPE`'s names. */
export type GgmlTypeName = keyof typeof GGML_TYPE;

/** A metadata value: typed explicitly where JSON types are ambiguous. */
export type GgufValue =
  | string
  | boolean
  | { readonly u32: number }
  | { readonly i32: number }
  | { readonly f32: number }
  | { readonly u64: number }
  | { readonly strings: readonly string[] }
  | { readonly f32s: ArrayLike<number> }
  | { readonly i32s: ArrayLike<number> };

/** A tensor to write: row-major data of `shape` (PyTorch order), stored as `type`. */
export interface GgufTensor {
  readonly name: string;
  /** Row-major shape [.., rows, cols]; GGUF stores dims reversed (cols first). */
  readonly shape: readonly number[];
  /** Row-major f32 values. */
  readonly data: Float32Array;
  readonly type: GgmlTypeName;
}

const ALIGN = 32;
const QK = 32;

/** float16 bits → number (`f16FromBits` of `@stageml/ir`, kept under this name for the package's API). */
export const fromF16: (h: number) => number = f16FromBits;

/** Bytes of a tensor of `n` elements (a multiple of 32 for the block types). */
function typeBytes(type: GgmlTypeName, n: number): number {
  switch (type) {
    case 'F32':
      return 4 * n;
    case 'F16':
      return 2 * n;
    case 'Q8_0':
      return (n / QK) * 34;
    case 'Q4_0':
      return (n / QK) * 18;
  }
}

/** Encodes row-major values as `type` (llama.cpp's reference quantizers `quantize_row_q8_0/q4_0_ref`). */
export function encodeGgml(type: GgmlTypeName, x: Float32Array): Uint8Array {
  const n = x.length;
  if ((type === 'Q8_0' || type === 'Q4_0') && n % QK !== 0) throw new ModelError(ModelCode.BAD_OPTIONS, `${type} needs a multiple of ${String(QK)} values, got ${String(n)}`);
  const out = new Uint8Array(typeBytes(type, n));
  const dv = new DataView(out.buffer);
  if (type === 'F32') {
    new Float32Array(out.buffer).set(x);
    return out;
  }
  if (type === 'F16') {
    for (let i = 0; i < n; i++) dv.setUint16(2 * i, f16Bits(x[i]!), true);
    return out;
  }
  const bb = type === 'Q8_0' ? 34 : 18;
  for (let b = 0; b < n / QK; b++) {
    const o = b * bb;
    const lo = b * QK;
    if (type === 'Q8_0') {
      let amax = 0;
      for (let j = 0; j < QK; j++) amax = Math.max(amax, Math.abs(x[lo + j]!));
      const d = amax / 127;
      const id = d !== 0 ? 1 / d : 0;
      dv.setUint16(o, f16Bits(d), true);
      for (let j = 0; j < QK; j++) dv.setInt8(o + 2 + j, Math.round(Math.fround(x[lo + j]! * id)));
    } else {
      let amax = 0;
      let max = 0;
      for (let j = 0; j < QK; j++) {
        const v = x[lo + j]!;
        if (amax < Math.abs(v)) {
          amax = Math.abs(v);
          max = v;
        }
      }
      const d = Math.fround(max / -8);
      const id = d !== 0 ? Math.fround(1 / d) : 0;
      dv.setUint16(o, f16Bits(d), true);
      for (let j = 0; j < QK / 2; j++) {
        const x0 = Math.min(15, Math.trunc(Math.fround(Math.fround(x[lo + j]! * id) + 8.5)));
        const x1 = Math.min(15, Math.trunc(Math.fround(Math.fround(x[lo + QK / 2 + j]! * id) + 8.5)));
        out[o + 2 + j] = x0 | (x1 << 4);
      }
    }
  }
  return out;
}

/** Decodes `type` bytes of `n` elements back to f32 (dequantization for the block types). */
export function decodeGgml(type: number, bytes: Uint8Array, n: number): Float32Array {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(n);
  if (type === GGML_TYPE.F32) {
    for (let i = 0; i < n; i++) out[i] = dv.getFloat32(4 * i, true);
  } else if (type === GGML_TYPE.F16) {
    for (let i = 0; i < n; i++) out[i] = fromF16(dv.getUint16(2 * i, true));
  } else if (type === GGML_TYPE.Q8_0) {
    for (let b = 0; b < n / QK; b++) {
      const d = fromF16(dv.getUint16(b * 34, true));
      for (let j = 0; j < QK; j++) out[b * QK + j] = d * dv.getInt8(b * 34 + 2 + j);
    }
  } else if (type === GGML_TYPE.Q4_0) {
    for (let b = 0; b < n / QK; b++) {
      const d = fromF16(dv.getUint16(b * 18, true));
      for (let j = 0; j < QK / 2; j++) {
        const q = bytes[b * 18 + 2 + j]!;
        out[b * QK + j] = ((q & 0x0f) - 8) * d;
        out[b * QK + QK / 2 + j] = ((q >> 4) - 8) * d;
      }
    }
  } else {
    throw new ModelError(ModelCode.BAD_OPTIONS, `ggml type ${String(type)} is not supported`);
  }
  return out;
}

class Bytes {
  #chunks: Uint8Array[] = [];
  length = 0;
  push(b: Uint8Array): void {
    this.#chunks.push(b);
    this.length += b.byteLength;
  }
  u32(v: number): void {
    const b = new Uint8Array(4);
    new DataView(b.buffer).setUint32(0, v, true);
    this.push(b);
  }
  u64(v: number): void {
    const b = new Uint8Array(8);
    new DataView(b.buffer).setBigUint64(0, BigInt(v), true);
    this.push(b);
  }
  str(s: string): void {
    const e = new TextEncoder().encode(s);
    this.u64(e.byteLength);
    this.push(e);
  }
  concat(): Uint8Array {
    const out = new Uint8Array(this.length);
    let o = 0;
    for (const c of this.#chunks) {
      out.set(c, o);
      o += c.byteLength;
    }
    return out;
  }
}

function writeValue(w: Bytes, v: GgufValue): void {
  const typed = (t: number, f: (dv: DataView) => void, bytes: number): void => {
    w.u32(t);
    const b = new Uint8Array(bytes);
    f(new DataView(b.buffer));
    w.push(b);
  };
  if (typeof v === 'string') {
    w.u32(VT.STRING);
    w.str(v);
  } else if (typeof v === 'boolean') {
    w.u32(VT.BOOL);
    w.push(Uint8Array.of(v ? 1 : 0));
  } else if ('u32' in v) typed(VT.U32, (d) => { d.setUint32(0, v.u32, true); }, 4);
  else if ('i32' in v) typed(VT.I32, (d) => { d.setInt32(0, v.i32, true); }, 4);
  else if ('f32' in v) typed(VT.F32, (d) => { d.setFloat32(0, v.f32, true); }, 4);
  else if ('u64' in v) typed(VT.U64, (d) => { d.setBigUint64(0, BigInt(v.u64), true); }, 8);
  else if ('strings' in v) {
    w.u32(VT.ARRAY);
    w.u32(VT.STRING);
    w.u64(v.strings.length);
    for (const s of v.strings) w.str(s);
  } else {
    const arr = 'f32s' in v ? v.f32s : v.i32s;
    w.u32(VT.ARRAY);
    w.u32('f32s' in v ? VT.F32 : VT.I32);
    w.u64(arr.length);
    const b = new Uint8Array(4 * arr.length);
    const dv = new DataView(b.buffer);
    for (let i = 0; i < arr.length; i++) {
      if ('f32s' in v) dv.setFloat32(4 * i, arr[i]!, true);
      else dv.setInt32(4 * i, arr[i]!, true);
    }
    w.push(b);
  }
}

/**
 * Writes a GGUF v3 file: `metadata` in insertion order, then `tensors` (encoded as their types,
 * each aligned to 32 bytes). Tensors are encoded one at a time, so peak memory is one encoded
 * tensor beyond the inputs. Errors: `MODEL_IO` naming the file.
 */
export async function writeGguf(path: string, metadata: Readonly<Record<string, GgufValue>>, tensors: readonly GgufTensor[]): Promise<void> {
  const head = new Bytes();
  head.push(new TextEncoder().encode('GGUF'));
  head.u32(3);
  head.u64(tensors.length);
  head.u64(Object.keys(metadata).length);
  for (const [k, v] of Object.entries(metadata)) {
    head.str(k);
    writeValue(head, v);
  }
  let offset = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    const n = t.shape.reduce((a, b) => a * b, 1);
    if (n !== t.data.length) throw new ModelError(ModelCode.BAD_OPTIONS, `tensor '${t.name}' has ${String(t.data.length)} values for shape [${t.shape.join(', ')}]`);
    head.str(t.name);
    head.u32(t.shape.length);
    for (const d of [...t.shape].reverse()) head.u64(d);
    head.u32(GGML_TYPE[t.type]);
    head.u64(offset);
    offsets.push(offset);
    offset += Math.ceil(typeBytes(t.type, n) / ALIGN) * ALIGN;
  }
  const header = head.concat();
  const dataStart = Math.ceil(header.byteLength / ALIGN) * ALIGN;
  let fh;
  try {
    fh = await open(path, 'w');
    await fh.write(header, 0, header.byteLength, 0);
    for (let i = 0; i < tensors.length; i++) {
      const bytes = encodeGgml(tensors[i]!.type, tensors[i]!.data);
      await fh.write(bytes, 0, bytes.byteLength, dataStart + offsets[i]!);
    }
    // The file ends after the last tensor's padding.
    await fh.truncate(dataStart + offset);
  } catch (e) {
    if (e instanceof ModelError) throw e;
    throw new ModelError(ModelCode.IO, `cannot write ${path}: ${errorMessage(e)}`, { cause: e });
  } finally {
    await fh?.close();
  }
}

/** A parsed GGUF file: metadata values and tensor infos with their raw bytes. */
export interface GgufFile {
  readonly version: number;
  readonly metadata: Readonly<Record<string, unknown>>;
  readonly tensors: readonly { readonly name: string; readonly dims: readonly number[]; readonly type: number; readonly data: Uint8Array }[];
}

/** Parses a GGUF v3 buffer (for tests and inspection). Malformed input is `MODEL_BAD_WEIGHT`. */
export function parseGguf(buf: Uint8Array): GgufFile {
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  let o = 0;
  const need = (n: number) => {
    if (o + n > buf.byteLength) throw new ModelError(ModelCode.BAD_WEIGHT, `GGUF truncated at byte ${String(o)}`);
  };
  const u32 = () => (need(4), (o += 4), dv.getUint32(o - 4, true));
  const u64 = () => (need(8), (o += 8), Number(dv.getBigUint64(o - 8, true)));
  const str = () => {
    const n = u64();
    need(n);
    o += n;
    return new TextDecoder().decode(buf.subarray(o - n, o));
  };
  const scalar = (t: number): unknown => {
    switch (t) {
      case VT.U8: return (need(1), buf[o++]);
      case VT.I8: return (need(1), dv.getInt8(o++));
      case VT.U16: return (need(2), (o += 2), dv.getUint16(o - 2, true));
      case VT.I16: return (need(2), (o += 2), dv.getInt16(o - 2, true));
      case VT.U32: return u32();
      case VT.I32: return (need(4), (o += 4), dv.getInt32(o - 4, true));
      case VT.F32: return (need(4), (o += 4), dv.getFloat32(o - 4, true));
      case VT.BOOL: return (need(1), buf[o++] !== 0);
      case VT.STRING: return str();
      case VT.U64: return u64();
      case VT.I64: return (need(8), (o += 8), Number(dv.getBigInt64(o - 8, true)));
      case VT.F64: return (need(8), (o += 8), dv.getFloat64(o - 8, true));
      case VT.ARRAY: {
        const et = u32();
        const n = u64();
        return Array.from({ length: n }, () => scalar(et));
      }
      default:
        throw new ModelError(ModelCode.BAD_WEIGHT, `GGUF metadata type ${String(t)} is unknown`);
    }
  };
  need(4);
  if (new TextDecoder().decode(buf.subarray(0, 4)) !== 'GGUF') throw new ModelError(ModelCode.BAD_WEIGHT, 'not a GGUF file (magic)');
  o = 4;
  const version = u32();
  const nt = u64();
  const nkv = u64();
  const metadata: Record<string, unknown> = {};
  for (let i = 0; i < nkv; i++) {
    const k = str();
    metadata[k] = scalar(u32());
  }
  const infos = Array.from({ length: nt }, () => {
    const name = str();
    const nd = u32();
    const dims = Array.from({ length: nd }, () => u64());
    return { name, dims, type: u32(), offset: u64() };
  });
  const align = typeof metadata['general.alignment'] === 'number' ? metadata['general.alignment'] : ALIGN;
  const start = Math.ceil(o / align) * align;
  const tensors = infos.map((t) => {
    const n = t.dims.reduce((a, b) => a * b, 1);
    const bytes = t.type === GGML_TYPE.F32 ? 4 * n : t.type === GGML_TYPE.F16 ? 2 * n : t.type === GGML_TYPE.Q8_0 ? (n / QK) * 34 : t.type === GGML_TYPE.Q4_0 ? (n / QK) * 18 : Number.NaN;
    if (!Number.isFinite(bytes) || start + t.offset + bytes > buf.byteLength) throw new ModelError(ModelCode.BAD_WEIGHT, `GGUF tensor '${t.name}' (type ${String(t.type)}) lies outside the file`);
    return { name: t.name, dims: t.dims, type: t.type, data: buf.subarray(start + t.offset, start + t.offset + bytes) };
  });
  return { version, metadata, tensors };
}

/**
 * HF's rotate-half q/k rows → llama.cpp's interleaved rotary layout (convert_hf_to_gguf.py's
 * `permute`): within each head, row `half·hd/2 + i` moves to `2i + half`.
 */
export function permuteRotaryRows(w: Float32Array, heads: number, cols: number): Float32Array {
  const rows = w.length / cols;
  const hd = rows / heads;
  const out = new Float32Array(w.length);
  for (let h = 0; h < heads; h++) {
    for (let half = 0; half < 2; half++) {
      for (let i = 0; i < hd / 2; i++) {
        const src = (h * hd + half * (hd / 2) + i) * cols;
        const dst = (h * hd + 2 * i + half) * cols;
        out.set(w.subarray(src, src + cols), dst);
      }
    }
  }
  return out;
}

const GGUF_PROJ: Readonly<Record<string, string>> = {
  'self_attn.q_proj': 'attn_q',
  'self_attn.k_proj': 'attn_k',
  'self_attn.v_proj': 'attn_v',
  'self_attn.o_proj': 'attn_output',
  'mlp.gate_proj': 'ffn_gate',
  'mlp.up_proj': 'ffn_up',
  'mlp.down_proj': 'ffn_down',
};

/** The GGUF name of an HF Llama module (`model.layers.3.self_attn.q_proj` → `blk.3.attn_q`). */
export function ggufModuleName(module: string): string {
  const m = /^model\.layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)$/.exec(module);
  if (m === null) throw new ModelError(ModelCode.BAD_OPTIONS, `module '${module}' has no GGUF name`);
  return `blk.${m[1]!}.${GGUF_PROJ[m[2]!]!}`;
}

function vocabToken(i: number): string {
  if (i < 3) return ['<unk>', '<s>', '</s>'][i]!;
  if (i < 259) return `<0x${(i - 3).toString(16).toUpperCase().padStart(2, '0')}>`;
  return `<t${String(i)}>`;
}

function f32Of(t: HostTensor): Float32Array {
  return t.data instanceof Float32Array ? t.data : Float32Array.from(t.data as ArrayLike<number>);
}

/**
 * llama.cpp's architecture for a config: `llama` (Llama, Mistral: interleaved rotary, so q/k rows
 * are permuted) or `qwen3` (NeoX rotary as HF's rotate-half, rows kept; per-head `attn_q_norm` /
 * `attn_k_norm`; `head_dim` as the key/value length). Other families have no writer here.
 */
function ggufArchOf(config: LlamaConfig): 'llama' | 'qwen3' {
  if (config.modelType === 'llama' || config.modelType === 'mistral') return 'llama';
  if (config.modelType === 'qwen3') return 'qwen3';
  throw new ModelError(ModelCode.BAD_OPTIONS, `no GGUF writer for model_type '${config.modelType}' (llama, mistral and qwen3 are written)`);
}

/**
 * Writes a Llama or Qwen3 checkpoint (HF parameter names → tensors) as a GGUF model for
 * llama.cpp's `llama` or `qwen3` architecture (`ggufArchOf`): metadata from `config`, a placeholder
 * vocabulary (`<t0>`, …; the bench feeds token ids directly), for `llama` q/k rows permuted to
 * llama.cpp's rotary layout, for `qwen3` the q/k norms and `head_dim`, 2-D projections as `type`
 * (norms and, below 32 columns, everything stays F32), the embedding as `embedType`.
 */
export async function writeLlamaGguf(
  path: string,
  config: LlamaConfig,
  weights: ReadonlyMap<string, HostTensor> | Readonly<Record<string, HostTensor>>,
  opts: { readonly type: GgmlTypeName; readonly embedType?: GgmlTypeName; readonly name?: string },
): Promise<void> {
  const get = (k: string): HostTensor => {
    const t: HostTensor | undefined = weights instanceof Map ? (weights as ReadonlyMap<string, HostTensor>).get(k) : (weights as Readonly<Record<string, HostTensor | undefined>>)[k];
    if (t === undefined) throw new ModelError(ModelCode.BAD_WEIGHT, `checkpoint has no '${k}'`);
    return t;
  };
  const H = config.hiddenSize;
  const V = config.vocabSize;
  if (V < 259) throw new ModelError(ModelCode.BAD_OPTIONS, `llama.cpp's SPM vocabulary needs at least 259 tokens (3 special + 256 bytes), the model has ${String(V)}`);
  const arch = ggufArchOf(config);
  const meta: Record<string, GgufValue> = {
    'general.architecture': arch,
    'general.name': opts.name ?? 'stageml-export',
    'general.alignment': { u32: ALIGN },
    [`${arch}.context_length`]: { u32: 2048 },
    [`${arch}.embedding_length`]: { u32: H },
    [`${arch}.block_count`]: { u32: config.numLayers },
    [`${arch}.feed_forward_length`]: { u32: config.intermediateSize },
    [`${arch}.attention.head_count`]: { u32: config.numHeads },
    [`${arch}.attention.head_count_kv`]: { u32: config.numKvHeads },
    [`${arch}.rope.freq_base`]: { f32: config.ropeTheta },
    [`${arch}.rope.dimension_count`]: { u32: config.headDim },
    [`${arch}.attention.layer_norm_rms_epsilon`]: { f32: config.rmsNormEps },
    [`${arch}.vocab_size`]: { u32: V },
    ...(arch === 'qwen3' ? { [`${arch}.attention.key_length`]: { u32: config.headDim }, [`${arch}.attention.value_length`]: { u32: config.headDim } } : {}),
    'tokenizer.ggml.model': 'llama',
    // Llama's SPM layout: <unk>, <s>, </s>, then the 256 byte tokens llama.cpp's SPM vocab needs.
    'tokenizer.ggml.tokens': { strings: Array.from({ length: V }, (_, i) => vocabToken(i)) },
    'tokenizer.ggml.scores': { f32s: new Float32Array(V) },
    'tokenizer.ggml.token_type': { i32s: Int32Array.from({ length: V }, (_, i) => (i === 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1)) },
    'tokenizer.ggml.bos_token_id': { u32: 1 },
    'tokenizer.ggml.eos_token_id': { u32: 2 },
    'tokenizer.ggml.unknown_token_id': { u32: 0 },
    'tokenizer.ggml.add_bos_token': false,
  };
  const mat = (t: HostTensor): GgmlTypeName => (t.shape[t.shape.length - 1]! % QK === 0 ? opts.type : 'F32');
  const tensors: GgufTensor[] = [];
  const embed = get('model.embed_tokens.weight');
  tensors.push({ name: 'token_embd.weight', shape: embed.shape, data: f32Of(embed), type: opts.embedType ?? mat(embed) });
  for (let l = 0; l < config.numLayers; l++) {
    const p = `model.layers.${String(l)}`;
    tensors.push({ name: `blk.${String(l)}.attn_norm.weight`, shape: [H], data: f32Of(get(`${p}.input_layernorm.weight`)), type: 'F32' });
    for (const [hf, gg] of Object.entries(GGUF_PROJ)) {
      const w = get(`${p}.${hf}.weight`);
      const cols = w.shape[1]!;
      const permute = arch === 'llama' && (hf === 'self_attn.q_proj' || hf === 'self_attn.k_proj');
      const data = permute ? permuteRotaryRows(f32Of(w), hf === 'self_attn.q_proj' ? config.numHeads : config.numKvHeads, cols) : f32Of(w);
      tensors.push({ name: `blk.${String(l)}.${gg}.weight`, shape: w.shape, data, type: mat(w) });
    }
    if (arch === 'qwen3') {
      for (const n of ['q', 'k']) tensors.push({ name: `blk.${String(l)}.attn_${n}_norm.weight`, shape: [config.headDim], data: f32Of(get(`${p}.self_attn.${n}_norm.weight`)), type: 'F32' });
    }
    tensors.push({ name: `blk.${String(l)}.ffn_norm.weight`, shape: [H], data: f32Of(get(`${p}.post_attention_layernorm.weight`)), type: 'F32' });
  }
  tensors.push({ name: 'output_norm.weight', shape: [H], data: f32Of(get('model.norm.weight')), type: 'F32' });
  if (!config.tieWordEmbeddings) {
    const head = get('lm_head.weight');
    tensors.push({ name: 'output.weight', shape: head.shape, data: f32Of(head), type: mat(head) });
  }
  await writeGguf(path, meta, tensors);
}

/** One module's LoRA factors: A [r, in], B [out, r] (PEFT layout). */
export interface GgufLoraModule {
  /** HF module path (`model.layers.0.self_attn.q_proj`). */
  readonly module: string;
  readonly A: HostTensor;
  readonly B: HostTensor;
}

/**
 * Writes a LoRA adapter as a llama.cpp GGUF adapter (`general.type = adapter`, `adapter.type =
 * lora`, `adapter.lora.alpha`): tensors `blk.N.attn_q.weight.lora_a` [r, in] and `.lora_b`
 * [out, r] in F32, with B's q/k rows permuted like the base weights (`llama` only). llama.cpp scales by
 * alpha / r, as PEFT does without rsLoRA.
 */
export async function writeLoraGguf(path: string, config: LlamaConfig, alpha: number, modules: readonly GgufLoraModule[]): Promise<void> {
  const arch = ggufArchOf(config);
  const meta: Record<string, GgufValue> = {
    'general.architecture': arch,
    'general.type': 'adapter',
    'general.alignment': { u32: ALIGN },
    'adapter.type': 'lora',
    'adapter.lora.alpha': { f32: alpha },
  };
  const tensors: GgufTensor[] = [];
  for (const m of modules) {
    const name = ggufModuleName(m.module);
    const r = m.A.shape[0]!;
    let b = f32Of(m.B);
    if (arch === 'llama' && name.endsWith('attn_q')) b = permuteRotaryRows(b, config.numHeads, r);
    else if (arch === 'llama' && name.endsWith('attn_k')) b = permuteRotaryRows(b, config.numKvHeads, r);
    tensors.push({ name: `${name}.weight.lora_a`, shape: m.A.shape, data: f32Of(m.A), type: 'F32' });
    tensors.push({ name: `${name}.weight.lora_b`, shape: m.B.shape, data: b, type: 'F32' });
  }
  await writeGguf(path, meta, tensors);
}
