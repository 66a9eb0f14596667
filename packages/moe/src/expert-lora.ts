import { type HostTensor, hostTensor } from '@stageml/ir';
import type { LoraAdapter, LoraParameterFactors } from '@stageml/peft';
import type { ExpertProjection } from './block.js';
import { MoeCode, MoeError } from './errors.js';

/** Per-expert LoRA factors of one projection of one layer, stacked by expert. */
export interface ExpertLora {
  /** The projection. */
  readonly projection: ExpertProjection;
  /** A of every expert [E, r, in]. */
  readonly A: HostTensor;
  /** B of every expert [E, out, r]. */
  readonly B: HostTensor;
  /** Rank r per expert. */
  readonly rank: number;
  /** Scale s. */
  readonly scale: number;
}

/** Shapes of a layer's fused expert tensors, to match factors against. */
export interface ExpertShapes {
  readonly numExperts: number;
  readonly hidden: number;
  readonly intermediate: number;
}

/**
 * Unpacks PEFT `target_parameters` factors of one fused expert tensor into per-expert stacks.
 * PEFT's ParamWrapper stores `lora_A` [r·E, in] with expert e in rows e·r … e·r + r − 1, and
 * `lora_B` [out, r·E] with column j·E + e holding rank component j of expert e; the delta of expert
 * e is s·B_e·A_e.
 */
export function unpackParameterFactors(f: LoraParameterFactors, numExperts: number): { A: HostTensor; B: HostTensor; rank: number } {
  const [rE, inDim] = f.A.shape as [number, number];
  const [outDim, rE2] = f.B.shape as [number, number];
  if (f.A.shape.length !== 2 || f.B.shape.length !== 2 || rE !== rE2 || rE % numExperts !== 0) {
    throw new MoeError(MoeCode.SHAPE_MISMATCH, `'${f.module}': lora_A [${f.A.shape.join(', ')}] and lora_B [${f.B.shape.join(', ')}] are not r·E factors for ${String(numExperts)} experts`);
  }
  const r = rE / numExperts;
  const A = new Float32Array(numExperts * r * inDim);
  A.set(f.A.data.subarray(0, A.length));
  const B = new Float32Array(numExperts * outDim * r);
  for (let e = 0; e < numExperts; e++) {
    for (let o = 0; o < outDim; o++) {
      for (let j = 0; j < r; j++) B[(e * outDim + o) * r + j] = f.B.data[o * rE + j * numExperts + e]!;
    }
  }
  return { A: hostTensor('f32', [numExperts, r, inDim], A), B: hostTensor('f32', [numExperts, outDim, r], B), rank: r };
}

/**
 * The expert LoRA factors an adapter holds for the MoE layer at `modulePath`
 * (`model.layers.0.mlp.experts`), each matched to `gate_up_proj` ([2I, H] per expert) or
 * `down_proj` ([H, I]) by its in/out dims. Factors that fit neither are `MOE_BAD_ADAPTER`.
 */
export function expertLoraFor(adapter: LoraAdapter, modulePath: string, shapes: ExpertShapes, scale: number): ExpertLora[] {
  const out: ExpertLora[] = [];
  for (const f of adapter.parameterFactors) {
    if (f.module !== modulePath) continue;
    const { A, B, rank } = unpackParameterFactors(f, shapes.numExperts);
    const inDim = A.shape[2]!;
    const outDim = B.shape[1]!;
    let projection: ExpertProjection;
    if (inDim === shapes.hidden && outDim === 2 * shapes.intermediate) projection = 'gate_up_proj';
    else if (inDim === shapes.intermediate && outDim === shapes.hidden) projection = 'down_proj';
    else {
      throw new MoeError(MoeCode.BAD_ADAPTER, `adapter '${adapter.name}': factors at '${modulePath}' map ${String(inDim)} → ${String(outDim)}, which fits neither gate_up_proj (${String(shapes.hidden)} → ${String(2 * shapes.intermediate)}) nor down_proj (${String(shapes.intermediate)} → ${String(shapes.hidden)})`);
    }
    if (out.some((x) => x.projection === projection)) throw new MoeError(MoeCode.BAD_ADAPTER, `adapter '${adapter.name}': two factor sets for ${projection} at '${modulePath}'`);
    out.push({ projection, A, B, rank, scale });
  }
  return out;
}
