import { type BankGatheredKernel, type BankGroupedKernel, type LoraLinearKernel, type MoeLoraKernel, type ResidualKernel, byKernelFamily } from '@stageml/kernel-patterns';

/** Element types the tensor-core kernels take. */
export type Sm90DType = 'f16' | 'bf16';

/** A residual kernel the sm90 backend takes (f16/bf16, checked shapes). */
export type Sm90Kernel = ResidualKernel & { readonly dtype: Sm90DType };

/** One tile configuration of the GEMM template. */
export interface GemmConfig {
  /** Largest row count (inclusive) the config is used for; undefined: all larger. */
  readonly maxRows: number | undefined;
  readonly blockM: number;
  readonly blockN: number;
  readonly warpsM: number;
  readonly warpsN: number;
  readonly stages: number;
}

/**
 * GEMM tile configs by row count. Up to 64 rows the GEMM streams W (memory-bound): 32-column
 * tiles give 128 CTAs for a 4096-wide output, one per SM, each with many K tiles in flight (the
 * emitted stage count is capped so a CTA's pipeline fits in 200 KB of shared memory). Larger
 * batches use wider warp tiles to raise tensor-core reuse.
 */
export const GEMM_TILES: readonly GemmConfig[] = [
  { maxRows: 16, blockM: 16, blockN: 32, warpsM: 1, warpsN: 2, stages: 12 },
  { maxRows: 64, blockM: 64, blockN: 32, warpsM: 4, warpsN: 1, stages: 10 },
  { maxRows: 256, blockM: 64, blockN: 64, warpsM: 2, warpsN: 2, stages: 5 },
  { maxRows: undefined, blockM: 128, blockN: 128, warpsM: 2, warpsN: 4, stages: 4 },
];

/** MoE expert GEMM tile: 64-row expert blocks (the row metadata's block_m) by 128 columns. */
export const MOE_TILE: GemmConfig = { maxRows: undefined, blockM: 64, blockN: 128, warpsM: 2, warpsN: 2, stages: 4 };

/** Rows per block of the grouped shrink/expand kernels (the row metadata's block_m). */
export const GROUPED_BLOCK_M = 16;

/** A registry entry the generated file adds (mirrors `StagemlKernel` in stageml_abi.h). */
export interface RegistryEntry {
  readonly name: string;
  readonly kind: 'linear' | 'shrink' | 'expand' | 'moe';
  readonly dtype: Sm90DType;
  readonly k: number;
  readonly n: number;
  readonly rank: number;
  readonly rankPad: number;
  readonly experts: number;
  readonly blockM: number;
}

/** The kernels' rank tile: a multiple of 16 (the mma k step of the expand). */
export function cudaRankPad(rank: number): number {
  return Math.max(16, Math.ceil(rank / 16) * 16);
}

/** Pipeline stages of a config whose K tiles also carry `extraRows` rank rows: at most 200 KB. */
export function fitStages(c: GemmConfig, extraRows: number): number {
  const perStage = (c.blockM + c.blockN + extraRows) * 64 * 2;
  return Math.max(2, Math.min(c.stages, Math.floor((200 * 1024) / perStage)));
}

function tileArgs(c: GemmConfig, extraRows = 0): string {
  return `${String(c.blockM)}, ${String(c.blockN)}, ${String(c.warpsM)}, ${String(c.warpsN)}, ${String(fitStages(c, extraRows))}`;
}

const CALL = 'a.x, a.w, a.a, a.b, a.t_work, a.split, a.bias, a.y, a.m, a.scale, none, s';

function gemmDispatch(rankPad: number): string {
  const lines = GEMM_TILES.map((c) => {
    const call = `stageml::run_gemm<T, K, N, R, RPAD, ${tileArgs(c, rankPad)}, LORA, false>(${CALL})`;
    return c.maxRows === undefined ? `  return ${call};` : `  if (a.m <= ${String(c.maxRows)}) return ${call};`;
  });
  return `// Tile config by row count: (BM, BN, warps along M, warps along N, pipeline stages).
template <int LORA>
cudaError_t gemm(const StagemlLinearArgs& a, cudaStream_t s) {
  const StagemlRows none{};
${lines.join('\n')}
}`;
}

const DTYPE_ENUM: Readonly<Record<Sm90DType, string>> = { f16: 'STAGEML_F16', bf16: 'STAGEML_BF16' };
const KIND_ENUM: Readonly<Record<RegistryEntry['kind'], string>> = { linear: 'STAGEML_LINEAR', shrink: 'STAGEML_SHRINK', expand: 'STAGEML_EXPAND', moe: 'STAGEML_MOE' };

/** FNV-1a (32-bit) of a text, as 8 hex digits: names a unit's exported entry function. */
export function unitHash(text: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, '0');
}

function registry(entries: readonly RegistryEntry[], launchers: readonly string[]): string {
  const rows = entries.map(
    (e, i) =>
      `    {"${e.name}", ${KIND_ENUM[e.kind]}, ${DTYPE_ENUM[e.dtype]}, ${String(e.k)}, ${String(e.n)}, ${String(e.rank)}, ${String(e.rankPad)}, ${String(e.experts)}, ${String(e.blockM)}, &${launchers[i]!}},`,
  );
  return `const StagemlKernel kEntries[] = {
${rows.join('\n')}
};`;
}

/** The unit's exported entry function (named by the hash of everything above it). */
function exportEntries(body: string): string {
  return `${body}
// Exported for hosts (see StagemlKernelsFn in stageml_abi.h); the name hashes the unit's text, so
// units generated from different residuals never clash when linked into one library.
extern "C" int32_t stageml_kernels_${unitHash(body)}(const StagemlKernel** out, int32_t capacity) {
  const int32_t n = static_cast<int32_t>(sizeof(kEntries) / sizeof(kEntries[0]));
  for (int32_t i = 0; i < n && i < capacity; ++i) out[i] = &kEntries[i];
  return n;
}
`;
}

function fileHead(k: Sm90Kernel, summary: string, consts: string): string {
  return `// Generated by @stageml/sm90-native from residual value %${k.output}. Do not edit by hand.
// ${summary}
#include "stageml_sm90.cuh"

namespace {
using T = ${k.dtype === 'bf16' ? '__nv_bfloat16' : '__half'};
${consts}
`;
}

function linear(k: LoraLinearKernel & Sm90Kernel): { text: string; entries: RegistryEntry[] } {
  const r = k.lora?.rank ?? 0;
  const rp = cudaRankPad(r);
  const lora = k.lora !== undefined;
  const entry: RegistryEntry = { name: k.name, kind: 'linear', dtype: k.dtype, k: k.inDim, n: k.outDim, rank: r, rankPad: rp, experts: 0, blockM: 0 };
  const modes = lora
    ? `    case 1:
      return gemm<1>(a, s);
    case 2:
      // The shrink/expand pair: t partials [split, M, RPAD] first, then the GEMM reads them.
      STAGEML_CHECK((stageml::run_shrink<T, K, RPAD, true>(a.x, a.a, nullptr, nullptr, R, StagemlRows{}, a.t_work, a.m, a.split, s)));
      return gemm<2>(a, s);
`
    : '';
  const text = `${fileHead(
    k,
    lora ? `y = x·Wᵀ (+ b) + s·(x·Aᵀ)·Bᵀ on tensor cores: mode 1 fuses the shrink into the K loop, mode 2 runs the shrink/expand pair.` : 'y = x·Wᵀ (+ b) on tensor cores.',
    `constexpr int K = ${String(k.inDim)}, N = ${String(k.outDim)}, R = ${String(r)}, RPAD = ${String(rp)};`,
  )}
${gemmDispatch(lora ? rp : 0)}

cudaError_t launch(const void* p, cudaStream_t s) {
  const auto& a = *static_cast<const StagemlLinearArgs*>(p);
  if (a.m == 0) return cudaSuccess;
  switch (a.mode) {
    case 0:
      return gemm<0>(a, s);
${modes}    default:
      return cudaErrorInvalidValue;
  }
}

${registry([entry], ['launch'])}
}  // namespace
`;
  return { text: exportEntries(text), entries: [entry] };
}

function bank(k: (BankGroupedKernel | BankGatheredKernel) & Sm90Kernel): { text: string; entries: RegistryEntry[] } {
  const ranks = k.kind === 'bankGrouped' ? k.groups.map((g) => g.rank) : [k.rank];
  const maxRank = Math.max(...ranks);
  const rp = cudaRankPad(maxRank);
  const base = { dtype: k.dtype, k: k.inDim, n: k.outDim, experts: 0 };
  const entries: RegistryEntry[] = [
    { ...base, name: `${k.name}.base`, kind: 'linear', rank: 0, rankPad: 16, blockM: 0 },
    { ...base, name: `${k.name}.shrink`, kind: 'shrink', rank: maxRank, rankPad: rp, blockM: GROUPED_BLOCK_M },
    { ...base, name: `${k.name}.expand`, kind: 'expand', rank: maxRank, rankPad: rp, blockM: GROUPED_BLOCK_M },
  ];
  const text = `${fileHead(
    k,
    `${k.kind === 'bankGrouped' ? 'SGMV' : 'BGMV'} multi-adapter LoRA on tensor cores: base GEMM, grouped shrink (fp32 partials) and in-place expand; ranks ≤ ${String(maxRank)}.`,
    `constexpr int K = ${String(k.inDim)}, N = ${String(k.outDim)}, R = 0, RPAD = 16, RANK_PAD = ${String(rp)};`,
  )}
${gemmDispatch(0)}

cudaError_t launch_base(const void* p, cudaStream_t s) {
  const auto& a = *static_cast<const StagemlLinearArgs*>(p);
  if (a.mode != 0) return cudaErrorInvalidValue;
  return a.m == 0 ? cudaSuccess : gemm<0>(a, s);
}

cudaError_t launch_shrink(const void* p, cudaStream_t s) {
  const auto& a = *static_cast<const StagemlShrinkArgs*>(p);
  if (a.rows.block_m != ${String(GROUPED_BLOCK_M)} || a.split < 1) return cudaErrorInvalidValue;
  if (a.m == 0 || a.rows.num_blocks == 0) return cudaSuccess;
  return stageml::run_shrink<T, K, RANK_PAD, false>(a.x, a.a, a.offset, a.rank, 0, a.rows, a.t, a.m, a.split, s);
}

cudaError_t launch_expand(const void* p, cudaStream_t s) {
  const auto& a = *static_cast<const StagemlExpandArgs*>(p);
  if (a.rows.block_m != ${String(GROUPED_BLOCK_M)} || a.split < 1) return cudaErrorInvalidValue;
  if (a.m == 0 || a.rows.num_blocks == 0) return cudaSuccess;
  return stageml::run_expand<T, N, RANK_PAD>(a.t, a.b, a.offset, a.rank, a.scale, a.rows, a.y, a.m, a.split, s);
}

${registry(entries, ['launch_base', 'launch_shrink', 'launch_expand'])}
}  // namespace
`;
  return { text: exportEntries(text), entries };
}

function moe(k: MoeLoraKernel & Sm90Kernel): { text: string; entries: RegistryEntry[] } {
  const r = k.lora?.rank ?? 0;
  const rp = cudaRankPad(r);
  const entry: RegistryEntry = { name: k.name, kind: 'moe', dtype: k.dtype, k: k.inDim, n: k.outDim, rank: r, rankPad: rp, experts: k.numExperts, blockM: MOE_TILE.blockM };
  const text = `${fileHead(
    k,
    `Routed expert GEMM${k.lora === undefined ? '' : ' with expert LoRA fused (in-loop shrink, expand in the epilogue)'} on tensor cores, E = ${String(k.numExperts)}.`,
    `constexpr int K = ${String(k.inDim)}, N = ${String(k.outDim)}, R = ${String(r)}, RPAD = ${String(rp)};`,
  )}
cudaError_t launch(const void* p, cudaStream_t s) {
  const auto& a = *static_cast<const StagemlMoeArgs*>(p);
  if (a.rows.block_m != ${String(MOE_TILE.blockM)}) return cudaErrorInvalidValue;
  if (a.m == 0 || a.rows.num_blocks == 0) return cudaSuccess;
  return stageml::run_gemm<T, K, N, R, RPAD, ${tileArgs(MOE_TILE, k.lora === undefined ? 0 : rp)}, ${k.lora === undefined ? '0' : '1'}, true>(a.x, a.w, a.a, a.b, nullptr, 1, nullptr, a.y, a.m,
                                                                            a.scale, a.rows, s);
}

${registry([entry], ['launch'])}
}  // namespace
`;
  return { text: exportEntries(text), entries: [entry] };
}

/** The CUDA translation unit (`<name>.cu`) of one kernel and the registry entries it adds. */
export function emitCudaUnit(k: Sm90Kernel): { text: string; entries: RegistryEntry[] } {
  return byKernelFamily(k, { loraLinear: linear, bank, moe });
}
