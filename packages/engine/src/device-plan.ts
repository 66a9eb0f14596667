import { dtypeBytes } from '@stageml/ir';
import type { Engine } from './engine.js';
import { EngineCode, EngineError } from './errors.js';

/** What the engine is planned to hold on its device (`planDeviceMemory`), in bytes. */
export interface DeviceMemoryPlan {
  /** The device's memory (as the executor reported it). */
  readonly device: number;
  /** The share the engine may use (`--gpu-memory-utilization`, vLLM's meaning). */
  readonly utilization: number;
  /** `utilization × device`: what everything below must fit in. */
  readonly limit: number;
  /** Base weights at the compute dtype. */
  readonly weights: number;
  /** Slot tables (every slot at the slot rank, at the factor dtype). */
  readonly slots: number;
  /** KV of every batch row at the full length (keys and values at the compute dtype, the f32 key mask). */
  readonly kv: number;
  /** One step's working memory (an estimate: the step's f32 logits and four f32 activations of the hidden and two of the intermediate width per token). */
  readonly workspace: number;
  /** weights + slots + kv + workspace. */
  readonly total: number;
  /** Whether `total ≤ limit`. */
  readonly fits: boolean;
}

/** What a plan needs besides the engine: the device, the share of it, the batch and the lengths. */
export interface DeviceMemoryRequest {
  /** Bytes of device memory (e.g. `TorchWorkerInfo.memory.total`). */
  readonly deviceBytes: number;
  /** The share in (0, 1]. */
  readonly utilization: number;
  /** Most sequences in a batch. */
  readonly maxBatch: number;
  /** Prompt + completion tokens of one sequence. */
  readonly maxModelLen: number;
  /** Most tokens one step runs (decode rows and prefill chunks together). */
  readonly stepTokens: number;
}

/**
 * Plans the engine's device memory as vLLM's `--gpu-memory-utilization` does: the weights, the
 * slot tables, the KV of `maxBatch` sequences at `maxModelLen` and a step's workspace must fit
 * within `utilization × deviceBytes`. Bad numbers are `ENGINE_BAD_OPTIONS`.
 */
export function planDeviceMemory(engine: Engine, req: DeviceMemoryRequest): DeviceMemoryPlan {
  const { deviceBytes, utilization, maxBatch, maxModelLen, stepTokens } = req;
  if (!(Number.isFinite(utilization) && utilization > 0 && utilization <= 1)) throw new EngineError(EngineCode.BAD_OPTIONS, `the memory utilization must be in (0, 1], got ${String(utilization)}`);
  if (!(Number.isFinite(deviceBytes) && deviceBytes > 0)) throw new EngineError(EngineCode.BAD_OPTIONS, `the device's memory must be a positive number of bytes, got ${String(deviceBytes)}`);
  for (const [k, v] of Object.entries({ maxBatch, maxModelLen, stepTokens })) {
    if (!(Number.isSafeInteger(v) && v > 0)) throw new EngineError(EngineCode.BAD_OPTIONS, `${k} must be a positive integer, got ${String(v)}`);
  }
  const c = engine.config;
  const m = engine.memory();
  const perPosition = 2 * c.numLayers * c.numKvHeads * c.headDim * dtypeBytes(engine.dtype) + 4;
  const kv = maxBatch * maxModelLen * perPosition;
  const tokens = Math.max(maxBatch, stepTokens);
  const workspace = tokens * (c.vocabSize + 4 * c.hiddenSize + 2 * c.intermediateSize) * 4;
  const limit = Math.floor(utilization * deviceBytes);
  const total = m.weights + m.slots + kv + workspace;
  return { device: deviceBytes, utilization, limit, weights: m.weights, slots: m.slots, kv, workspace, total, fits: total <= limit };
}

const gib = (n: number): string => `${(n / 2 ** 30).toFixed(2)} GiB`;

/** `planDeviceMemory`, failing with `ENGINE_DEVICE_MEMORY` (every size named) when the plan does not fit. */
export function checkDeviceMemory(engine: Engine, req: DeviceMemoryRequest): DeviceMemoryPlan {
  const p = planDeviceMemory(engine, req);
  if (!p.fits) {
    throw new EngineError(EngineCode.DEVICE_MEMORY, `the engine needs ${gib(p.total)} on the device — weights ${gib(p.weights)}, slot tables ${gib(p.slots)}, KV ${gib(p.kv)} (${String(req.maxBatch)} sequences × ${String(req.maxModelLen)} tokens), workspace ${gib(p.workspace)} — but may use ${gib(p.limit)} (${String(p.utilization)} × ${gib(p.device)})`, {
      hint: 'raise --gpu-memory-utilization, or lower --max-batch, --max-model-len, --max-loras or --max-lora-rank',
    });
  }
  return p;
}
