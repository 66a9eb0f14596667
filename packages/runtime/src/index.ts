/**
 * @packageDocumentation
 * `@stageml/runtime`: partial evaluation and execution.
 *
 * - `specialize(graph, { annotations, cutoff, values })` computes everything known at or before
 *   the cutoff once and returns a residual graph (inputs: only later values), a constant table of
 *   the frontier values it reads (dead work removed) and a report. It never mutates its input;
 *   evaluation failures are errors naming the node. Specializing at stage a then at b equals
 *   specializing once at b.
 * - Residual bundles (`writeBundle`/`loadBundle`): `manifest.json`, `residual.ir`,
 *   `constants.safetensors`, optional `plan.json`, loadable without the original graph.
 * - Executors behind one interface (`prepare` once, `run` many times, `dispose`): the reference
 *   interpreter, tfjs (node-gpu, node, wasm, cpu backends), onnxruntime, torch (a Python worker,
 *   CUDA or CPU) and cpu-native (this package's own C++ kernels, built once per machine).
 * - `compileStaged(fn, annotations, options)`: trace, analyse, specialize and prepare in one call.
 */
export { CacheLostError, RuntimeCode, RuntimeError } from './errors.js';
export type { RuntimeErrorCode } from './errors.js';
export { chainStores, toStore } from './values.js';
export type { ValueSource } from './values.js';
export { specialize } from './specialize.js';
export { formatWeightQuantSpec, isLoraParamName, parseWeightQuantSpec, quantizeLinears, quantizeStaged } from './quantize.js';
export type { QuantizeLinearsOptions, QuantizeLinearsResult, QuantizedWeightInfo, WeightQuantSpec } from './quantize.js';
export type { SpecializeOptions, SpecializeReport, SpecializeResult } from './specialize.js';
export { PreparedGraphs, argmaxRows, capabilitiesOfTable, checkInputs, checkRowSamples, expandFor, firstMaxIndex, fusedComposites, inputChanged, inputGeneration, resolveWeights } from './executor.js';
export type { CacheRow, CacheRun, CacheStore, CacheStream, Executor, PreparedGraph, RowProcessing, RowSample, RunOptions } from './executor.js';
export { checkRowsInput, joinRows } from './row-inputs.js';
export type { RowsInput } from './row-inputs.js';
export { INTERPRETER_CAPABILITIES, interpreterExecutor } from './interpreter-executor.js';
export { BUNDLE_FORMAT, BUNDLE_VERSION, loadBundle, writeBundle } from './bundle.js';
export type { BundleManifest, LoadedBundle, WriteBundleOptions } from './bundle.js';
export { BundleCode, BundleError } from '@stageml/bundle';
export type { BundleContents, BundleData, BundleErrorCode } from '@stageml/bundle';
export { CPU_SCHEDULING, GPU_SCHEDULING, capabilitiesFromRules, executorCapabilities, registerExecutorCapabilities, schedulingHints } from './capabilities.js';
export type { ExecutorCapabilities, RuleKinds, SchedulingHints } from './capabilities.js';
export { compileStaged } from './compile.js';
export type { CompileStagedOptions, StagedAnnotations, StagedProgram } from './compile.js';
export {
  TFJS_BACKENDS,
  TFJS_RULES,
  availableTfjsBackends,
  createTfjsExecutor,
  exactLowering,
  isTfjsBackend,
  lowering,
  unsupported,
} from './tfjs/index.js';
export type { Kernel, LowerContext, Lowering, TfDType, TfRule, TfRuleTable, TfjsBackend, TfjsExecutorOptions, Unsupported } from './tfjs/index.js';
export { DEFAULT_CANDIDATES, DEFAULT_FALLBACKS, DEFAULT_PROBE_SHAPE, EXECUTOR_ENV, EXECUTOR_NAMES, createExecutorByName, createOrtExecutor, isExecutorName, isOrtAvailable, ortCapabilities, selectExecutor } from './ort/index.js';
export type { CreateExecutorOptions, ExecutorName, ExecutorProbeMoe, ExecutorProbeShape, ExecutorSelection, OrtExecutorOptions, SelectExecutorOptions } from './ort/index.js';
export { CPU_ADDON_ABI, CPU_NATIVE_CAPABILITIES, CPU_NATIVE_OPS, CPU_NATIVE_RULES, NATIVE_ADDON_ENV, addonAbiProblem, NATIVE_BUILD_ENV, NATIVE_CACHE_ENV, createCpuNativeExecutor, encodeProgram, loadCpuAddon, measureFmaPeak, measureMemoryBandwidth } from './native/index.js';
export type { BandwidthProbeOptions, CpuAddon, CpuNativeExecutor, CpuNativeExecutorOptions, CpuNativeRule, FmaPeak, FmaPeakOptions, MemoryBandwidth, NativeProgram } from './native/index.js';
export { FrameDecoder, TORCH_DEVICE_ENV, TORCH_PATH_ENV, TORCH_PROTOCOL_VERSION, TORCH_PYTHON_ENV, TORCH_TENSOR_PARALLEL_ENV, TORCH_WORKER_COMPOSITES, createTorchExecutor, encodeFrame, isTorchAvailable, torchCapabilities } from './torch/index.js';
export type { DeviceWrite, FileTensorRef, Frame, TorchDeviceTensors, TorchExecutor, TorchExecutorOptions, TorchFusion, TorchPreparedGraph, TorchWorkerInfo, WireTensor } from './torch/index.js';
