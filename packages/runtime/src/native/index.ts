/**
 * The `cpu-native` executor of `@stageml/runtime`: IR graphs on this package's own C++ kernels
 * (a Node-API addon, prebuilt for linux-x64 in AVX2 / AVX-512 / VNNI variants, else built once per machine), for CPU serving where onnxruntime's per-node cost and
 * quantized GEMV bound decode speed.
 */
export { CPU_ADDON_ABI, NATIVE_ADDON_ENV, NATIVE_BUILD_ENV, NATIVE_CACHE_ENV, addonAbiProblem, cpuAddonOrigin, cpuFlagSet, loadCpuAddon, pickPrebuiltVariant, prebuiltDir, readPrebuiltManifest } from './addon.js';
export type { CpuAddon, PrebuiltManifest, PrebuiltVariant } from './addon.js';
export { measureFmaPeak, measureMemoryBandwidth } from './bandwidth.js';
export type { BandwidthProbeOptions, FmaPeak, FmaPeakOptions, MemoryBandwidth } from './bandwidth.js';
export { encodeProgram } from './compile.js';
export type { NativeProgram } from './compile.js';
export { CPU_NATIVE_CAPABILITIES, CPU_NATIVE_OPS, CPU_NATIVE_RULES, createCpuNativeExecutor } from './executor.js';
export type { CpuNativeExecutor, CpuNativeExecutorOptions, CpuNativeRule } from './executor.js';
