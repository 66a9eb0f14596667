import { randomBytes } from 'node:crypto';
import { type FileHandle, open, rename, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';

import { type TensorInputs, planSafetensors } from './encode.js';
import { SafetensorsCode, SafetensorsError } from './errors.js';
import { errorMessage } from '@stageml/ir';

/**
 * Serializes tensors to one in-memory safetensors file (layout in `planSafetensors`). Raw
 * tensors are written verbatim; host tensors are encoded per their dtype. Throws a
 * `SafetensorsError` for malformed input (never a bare TypeError).
 */
export function serializeSafetensors(tensors: TensorInputs, metadata?: Readonly<Record<string, string>>): Uint8Array {
  const plan = planSafetensors(tensors, metadata);
  let out: Uint8Array;
  try {
    out = new Uint8Array(plan.byteLength);
  } catch (cause) {
    throw new SafetensorsError(SafetensorsCode.BAD_TENSOR, `cannot allocate ${String(plan.byteLength)} bytes in one buffer; use writeSafetensors to stream to disk`, {
      cause,
    });
  }
  out.set(plan.head, 0);
  let at = plan.head.length;
  for (const t of plan.tensors) {
    out.set(t.bytes(), at);
    at += t.dataOffsets[1] - t.dataOffsets[0];
  }
  return out;
}

/** Options of {@link writeSafetensors}. */
export interface WriteOptions {
  /** Flush the data to stable storage before the rename (default true). */
  readonly fsync?: boolean;
}

async function writeAll(handle: FileHandle, bytes: Uint8Array, position: number): Promise<void> {
  let done = 0;
  while (done < bytes.length) {
    const { bytesWritten } = await handle.write(bytes, done, bytes.length - done, position + done);
    done += bytesWritten;
  }
}

function ioError(action: string, file: string, cause: unknown): SafetensorsError {
  const reason = errorMessage(cause);
  return new SafetensorsError(SafetensorsCode.IO, `cannot ${action}: ${reason}`, { file, cause });
}

/**
 * Writes tensors to `path` atomically: everything is validated first, then streamed tensor by
 * tensor into a temporary file beside `path`, flushed, and renamed over `path`. On any failure the
 * temporary file is removed, so `path` is either untouched or complete.
 */
export async function writeSafetensors(
  path: string,
  tensors: TensorInputs,
  metadata?: Readonly<Record<string, string>>,
  options: WriteOptions = {},
): Promise<void> {
  const plan = planSafetensors(tensors, metadata);
  const tmp = join(dirname(path), `.${basename(path)}.${String(process.pid)}.${randomBytes(6).toString('hex')}.tmp`);
  let handle: FileHandle;
  try {
    handle = await open(tmp, 'wx');
  } catch (cause) {
    throw ioError('create a temporary file', tmp, cause);
  }
  try {
    try {
      await writeAll(handle, plan.head, 0);
      let at = plan.head.length;
      for (const t of plan.tensors) {
        const bytes = t.bytes();
        await writeAll(handle, bytes, at);
        at += bytes.length;
      }
      if (options.fsync ?? true) await handle.datasync();
    } finally {
      await handle.close();
    }
    await rename(tmp, path);
  } catch (e) {
    await unlink(tmp).catch(() => undefined);
    throw e instanceof SafetensorsError ? e : ioError('write', path, e);
  }
}
