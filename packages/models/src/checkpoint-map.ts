import { type HostTensor, hostTensor } from '@stageml/ir';
import type { Checkpoint } from '@stageml/safetensors';
import { ModelCode, ModelError } from './errors.js';

function same(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

async function readExact(ckpt: Checkpoint, key: string, shape: readonly number[]): Promise<HostTensor> {
  const info = ckpt.info(key);
  if (!same(info.shape, shape)) {
    throw new ModelError(ModelCode.BAD_WEIGHT, `${ckpt.fileOf(key)}: tensor '${key}' is [${info.shape.join(', ')}], the config needs [${shape.join(', ')}]`);
  }
  return hostTensor('f32', info.shape, await ckpt.readFloat32(key));
}

/** [E, a, b] → [E, b, a]. */
function transposeLast(t: Float32Array, e: number, a: number, b: number): Float32Array {
  const out = new Float32Array(t.length);
  for (let x = 0; x < e; x++) for (let i = 0; i < a; i++) for (let j = 0; j < b; j++) out[(x * b + j) * a + i] = t[(x * a + i) * b + j]!;
  return out;
}

/**
 * Reads the graph parameter `name` of shape `shape` from a checkpoint, as f32. Besides exact
 * names, Mixtral layouts are mapped: the router `…mlp.gate.weight` from
 * `…block_sparse_moe.gate.weight`; the fused `…mlp.experts.gate_up_proj` [E, 2I, H] from per-expert
 * `…block_sparse_moe.experts.<e>.w1.weight` (gate rows) and `w3` (up rows), or from a fused tensor
 * stored [E, H, 2I]; `…mlp.experts.down_proj` [E, H, I] from `w2` likewise; Qwen3-MoE's per-expert
 * `…mlp.experts.<e>.gate_proj` / `up_proj` / `down_proj` likewise; Gemma 3's multimodal layout
 * (`model.language_model.…`, `language_model.model.…`) for the text model's tensors. Missing or misshapen
 * tensors are `MODEL_BAD_WEIGHT` naming the file and key.
 */
export async function readParam(ckpt: Checkpoint, dir: string, name: string, shape: readonly number[]): Promise<HostTensor> {
  if (ckpt.has(name)) {
    const info = ckpt.info(name);
    if (shape.length === 3 && info.shape.length === 3 && info.shape[0] === shape[0] && info.shape[1] === shape[2] && info.shape[2] === shape[1] && !same(info.shape, shape)) {
      const data = transposeLast(await ckpt.readFloat32(name), shape[0]!, shape[2]!, shape[1]!);
      return hostTensor('f32', shape, data);
    }
    return readExact(ckpt, name, shape);
  }
  const moe = /^(.*)\.mlp\.(gate\.weight|experts\.gate_up_proj|experts\.down_proj)$/.exec(name);
  if (moe !== null) {
    const [, layer, what] = moe as unknown as [string, string, string];
    const legacy = `${layer}.block_sparse_moe`;
    if (what === 'gate.weight' && ckpt.has(`${legacy}.gate.weight`)) return readExact(ckpt, `${legacy}.gate.weight`, shape);
    const [e, rows, cols] = shape as [number, number, number];
    // Qwen3-MoE (and transformers' per-expert save): `<layer>.mlp.experts.<e>.gate_proj|up_proj|down_proj.weight`.
    if (what !== 'gate.weight' && ckpt.has(`${layer}.mlp.experts.0.down_proj.weight`)) {
      const data = new Float32Array(e * rows * cols);
      const parts = what === 'experts.gate_up_proj' ? ['gate_proj', 'up_proj'] : ['down_proj'];
      const partRows = rows / parts.length;
      for (let x = 0; x < e; x++) {
        for (const [k, part] of parts.entries()) {
          const key = `${layer}.mlp.experts.${String(x)}.${part}.weight`;
          if (!ckpt.has(key)) throw new ModelError(ModelCode.BAD_WEIGHT, `${dir}: the checkpoint has no tensor '${key}'`);
          const t = await readExact(ckpt, key, [partRows, cols]);
          data.set(t.data, (x * rows + k * partRows) * cols);
        }
      }
      return hostTensor('f32', shape, data);
    }
    if (what !== 'gate.weight' && ckpt.has(`${legacy}.experts.0.w1.weight`)) {
      const data = new Float32Array(e * rows * cols);
      for (let x = 0; x < e; x++) {
        const parts = what === 'experts.gate_up_proj' ? ['w1', 'w3'] : ['w2'];
        const partRows = rows / parts.length;
        for (const [k, part] of parts.entries()) {
          const key = `${legacy}.experts.${String(x)}.${part}.weight`;
          if (!ckpt.has(key)) throw new ModelError(ModelCode.BAD_WEIGHT, `${dir}: the checkpoint has no tensor '${key}'`);
          const t = await readExact(ckpt, key, [partRows, cols]);
          data.set(t.data, (x * rows + k * partRows) * cols);
        }
      }
      return hostTensor('f32', shape, data);
    }
  }
  // Gemma 3's multimodal checkpoints keep the text model under `model.language_model.` (transformers 5)
  // or `language_model.model.` (earlier saves).
  if (name.startsWith('model.')) {
    for (const alt of [`model.language_model.${name.slice(6)}`, `language_model.${name}`]) if (ckpt.has(alt)) return readExact(ckpt, alt, shape);
  }
  throw new ModelError(ModelCode.BAD_WEIGHT, `${dir}: the checkpoint has no tensor '${name}' ([${shape.join(', ')}])`);
}
