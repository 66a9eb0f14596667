/**
 * The torch executor of `@stageml/runtime`: `createTorchExecutor` runs IR graphs in a Python
 * worker with PyTorch (CUDA or CPU) over a framed stdio protocol (docs/gpu.md).
 */
export { TORCH_DEVICE_ENV, TORCH_PATH_ENV, TORCH_PYTHON_ENV, TORCH_TENSOR_PARALLEL_ENV, TORCH_WORKER_COMPOSITES, createTorchExecutor, isTorchAvailable, torchCapabilities } from './executor.js';
export type { DeviceWrite, FileTensorRef, TorchDeviceTensors, TorchExecutor, TorchExecutorOptions, TorchFusion, TorchPreparedGraph, TorchWorkerInfo } from './executor.js';
export { FrameDecoder, TORCH_PROTOCOL_VERSION, encodeFrame } from './protocol.js';
export type { Frame, WireTensor } from './protocol.js';
