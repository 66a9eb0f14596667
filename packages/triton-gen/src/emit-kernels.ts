import { CONFIG_HELPERS, DENSE_SHRINK_KERNEL, GEMM_KERNEL, GROUPED_KERNELS, MOE_KERNEL } from './kernels-src.js';
import { type ConfigTable, type TritonKernel, halveK, pyBool, pyConfigTable, pyFloat, pyHeader, rankPad } from './python.js';

/**
 * Base GEMM configs (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) by row bucket. Small buckets use
 * narrow N tiles so a 4096-wide output still spreads over all 132 SMs of an H100/H200 while the
 * GEMM is bound by reading W; large buckets use the wide tiles that keep wgmma busy.
 */
export const GEMM_CONFIGS: ConfigTable = {
  16: [
    [16, 32, 128, 4, 6],
    [16, 64, 128, 4, 5],
    [16, 64, 256, 4, 4],
  ],
  32: [
    [32, 32, 128, 4, 6],
    [32, 64, 128, 4, 5],
  ],
  64: [
    [64, 32, 128, 4, 5],
    [64, 64, 128, 4, 4],
    [32, 64, 128, 4, 5],
  ],
  128: [
    [64, 64, 128, 4, 4],
    [128, 32, 128, 4, 4],
    [128, 64, 64, 4, 4],
  ],
  256: [
    [128, 64, 64, 4, 4],
    [64, 128, 64, 4, 4],
    [128, 128, 64, 8, 4],
  ],
  512: [
    [128, 128, 64, 8, 4],
    [128, 64, 64, 4, 4],
  ],
  1024: [
    [128, 256, 64, 8, 3],
    [128, 256, 64, 8, 4],
    [256, 128, 64, 8, 4],
    [128, 128, 64, 8, 4],
  ],
};

/** Grouped shrink configs (BLOCK_K, warps, stages). */
export const SHRINK_CONFIGS: ConfigTable = {
  256: [
    [128, 4, 4],
    [256, 4, 3],
  ],
  8192: [
    [128, 4, 4],
    [64, 4, 4],
  ],
};

/** Grouped expand configs (BLOCK_N, warps, stages). */
export const EXPAND_CONFIGS: ConfigTable = {
  256: [
    [64, 4, 2],
    [128, 4, 2],
    [256, 4, 2],
  ],
  8192: [
    [128, 4, 2],
    [256, 8, 2],
  ],
};

/** MoE expert GEMM configs (BLOCK_N, BLOCK_K, warps, stages); BLOCK_M comes from the row metadata. */
export const MOE_CONFIGS: ConfigTable = {
  256: [
    [64, 128, 4, 4],
    [128, 128, 4, 3],
  ],
  8192: [
    [128, 64, 4, 4],
    [128, 128, 8, 3],
    [256, 64, 8, 3],
  ],
};

function constants(entries: Record<string, string>, k: TritonKernel): string {
  // NOTE: f32 dots run as 3xTF32 (about fp32 accuracy on tensor cores); 16-bit dots ignore it.
  return Object.entries({ ...entries, DOT_PRECISION: k.dtype === 'f32' ? '"tf32x3"' : '"tf32"' })
    .map(([k, v]) => `${k} = tl.constexpr(${v})`)
    .join('\n');
}

function forDType(k: TritonKernel, t: ConfigTable, kIndex: number | undefined): ConfigTable {
  return k.dtype === 'f32' && kIndex !== undefined ? halveK(t, kIndex) : t;
}

function gemmPart(k: TritonKernel): string {
  return `GEMM_CONFIGS = ${pyConfigTable(forDType(k, GEMM_CONFIGS, 2))}
GEMM_NAMES = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
${GEMM_KERNEL}

gemm_tuned = triton.autotune(configs=_configs(GEMM_CONFIGS, GEMM_NAMES), key=["M_BUCKET", "LORA_MODE", "T_SPLIT"],
                             prune_configs_by={"early_config_prune": _prune(GEMM_CONFIGS, GEMM_NAMES)})(gemm_kernel)
GEMM_DEFAULT = triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}, num_warps=4, num_stages=2)
`;
}

function groupedPart(k: TritonKernel): string {
  return `SHRINK_CONFIGS = ${pyConfigTable(forDType(k, SHRINK_CONFIGS, 0))}
EXPAND_CONFIGS = ${pyConfigTable(EXPAND_CONFIGS)}
${GROUPED_KERNELS}

grouped_shrink_tuned = triton.autotune(configs=_configs(SHRINK_CONFIGS, ("BLOCK_K",)), key=["M_BUCKET", "SPLIT_K", "BLOCK_M"],
                                       prune_configs_by={"early_config_prune": _prune(SHRINK_CONFIGS, ("BLOCK_K",))})(grouped_shrink_kernel)
# NOTE: the expand adds into y in place, so tuning restores y after every trial run.
grouped_expand_tuned = triton.autotune(configs=_configs(EXPAND_CONFIGS, ("BLOCK_N",)), key=["M_BUCKET", "SPLIT_K", "BLOCK_M"],
                                       prune_configs_by={"early_config_prune": _prune(EXPAND_CONFIGS, ("BLOCK_N",))},
                                       restore_value=["y_ptr"])(grouped_expand_kernel)
SHRINK_DEFAULT = triton.Config({"BLOCK_K": 32}, num_warps=4, num_stages=2)
EXPAND_DEFAULT = triton.Config({"BLOCK_N": 32}, num_warps=4, num_stages=2)
`;
}

function describe(k: TritonKernel): { doc: string; consts: Record<string, string>; body: string } {
  const base = { K: String(k.inDim), N: String(k.outDim) };
  const dims = `K = ${String(k.inDim)}, N = ${String(k.outDim)}, ${k.dtype}`;
  switch (k.kind) {
    case 'loraLinear': {
      const r = k.lora?.rank ?? 0;
      return {
        doc: `${k.lora === undefined ? 'y = x·Wᵀ (+ b)' : 'y = x·Wᵀ + b + s·((x·Aᵀ)·Bᵀ + b_B)'} from %${k.output}, specialized to ${dims}${k.lora === undefined ? '' : `, r = ${String(r)}`}.

- gemm_kernel: the base GEMM with the LoRA fused in. LORA_MODE 1 computes t = x·Aᵀ inside the K
  loop from the x tiles already loaded (one launch; r/BLOCK_N extra tensor-core work); LORA_MODE 2
  reads t from shrink_kernel's partials (the shrink/expand pair: two launches); LORA_MODE 0 is
  the plain GEMM. Either way the expand (s·t)·Bᵀ is one more dot in the epilogue.
- shrink_kernel: t = x·Aᵀ as SPLIT_K fp32 partials.
Autotuned per row bucket (M_BUCKET), never per batch size.`,
        consts: {
          ...base,
          R: String(r),
          R_PAD: String(rankPad(r)),
          SCALE: pyFloat(k.lora?.scale ?? 1),
          HAS_BIAS: pyBool(k.bias !== undefined),
          HAS_BIAS_B: pyBool(k.lora?.biasB !== undefined),
          GROUP_M: '8',
        },
        body: `${gemmPart(k)}${DENSE_SHRINK_KERNEL}`,
      };
    }
    case 'bankGrouped':
    case 'bankGathered': {
      const ranks = k.kind === 'bankGrouped' ? k.groups.map((g) => g.rank) : [k.rank];
      const maxRank = Math.max(...ranks);
      const biasB = k.kind === 'bankGrouped' && k.groups.some((g) => g.biasB !== undefined);
      return {
        doc: `Multi-adapter LoRA (${k.kind === 'bankGrouped' ? 'SGMV' : 'BGMV'}) from %${k.output}, specialized to ${dims}, ranks ≤ ${String(maxRank)}.

- gemm_kernel (LORA_MODE 0): the base y = x·Wᵀ + b.
- grouped_shrink_kernel: t[row] = x[row]·A_aᵀ for the rows of each block (one adapter a per
  block) as SPLIT_K fp32 partials. Ranks may differ: rank tiles past r_a are masked and move no
  bytes, and rows with no adapter are in no block, so they cost nothing.
- grouped_expand_kernel: y[row] += s_a·t[row]·B_aᵀ in place, one BLOCK_N slice per program.`,
        consts: {
          ...base,
          R: String(maxRank),
          R_PAD: String(rankPad(maxRank)),
          SCALE: '1.0',
          HAS_BIAS: pyBool(k.bias !== undefined),
          HAS_BIAS_B: pyBool(biasB),
          GROUP_M: '8',
        },
        body: `${gemmPart(k)}\n${groupedPart(k)}`,
      };
    }
    case 'moeLora': {
      const r = k.lora?.rank ?? 0;
      const [se, sn, sk] = k.transposeW ? [k.outDim * k.inDim, k.inDim, 1] : [k.outDim * k.inDim, 1, k.outDim];
      return {
        doc: `Routed expert GEMM${k.lora === undefined ? '' : ' with expert LoRA'} from %${k.output}, specialized to ${dims}, E = ${String(k.numExperts)}${k.lora === undefined ? '' : `, r = ${String(r)}`}.

moe_kernel: rows are grouped by expert into blocks (RowMeta); each program computes one block's
rows for one BLOCK_N slice: x·W_eᵀ, with t = x·A_eᵀ accumulated from the same x tiles and
(s·t)·B_eᵀ added in the epilogue, then stores to the rows' own positions (no scatter pass).`,
        consts: {
          ...base,
          E: String(k.numExperts),
          R: String(r),
          R_PAD: String(rankPad(r)),
          SCALE: pyFloat(k.lora?.scale ?? 1),
          HAS_LORA: pyBool(k.lora !== undefined),
          W_SE: String(se),
          W_SN: String(sn),
          W_SK: String(sk),
        },
        body: `MOE_CONFIGS = ${pyConfigTable(forDType(k, MOE_CONFIGS, 1))}
MOE_NAMES = ("BLOCK_N", "BLOCK_K")
${MOE_KERNEL}

moe_tuned = triton.autotune(configs=_configs(MOE_CONFIGS, MOE_NAMES), key=["M_BUCKET", "BLOCK_M"],
                            prune_configs_by={"early_config_prune": _prune(MOE_CONFIGS, MOE_NAMES)})(moe_kernel)
MOE_DEFAULT = triton.Config({"BLOCK_N": 32, "BLOCK_K": 32}, num_warps=4, num_stages=2)
`,
      };
    }
  }
}

/** The kernel module (`<name>.py`) of one residual kernel. */
export function emitKernelModule(k: TritonKernel): string {
  const d = describe(k);
  return `${pyHeader(d.doc)}import triton
import triton.language as tl

${constants(d.consts, k)}
${CONFIG_HELPERS}

${d.body}`;
}
