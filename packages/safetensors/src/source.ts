import { type FileHandle, open } from 'node:fs/promises';

import { SafetensorsCode, SafetensorsError } from './errors.js';
import { errorMessage } from '@stageml/ir';

/**
 * Random-access bytes the lazy reader pulls from. `SafetensorsFile` reads the 8-byte prefix, the
 * header, and then only the byte range of each tensor asked for; wrapping a source is how tests
 * observe (and tools limit) what gets read.
 */
export interface ByteSource {
  /** Path or label used in error messages. */
  readonly label: string;
  /** Total size in bytes. */
  readonly byteLength: number;
  /**
   * Reads `length` bytes at `offset` into a fresh buffer. Returns fewer bytes only at end of
   * input; the reader turns a short read into `ST_TRUNCATED`.
   */
  read(offset: number, length: number): Promise<Uint8Array>;
  /** Releases the underlying handle; later reads fail. */
  close(): Promise<void>;
}

function ioError(action: string, label: string, cause: unknown): SafetensorsError {
  const reason = errorMessage(cause);
  return new SafetensorsError(SafetensorsCode.IO, `cannot ${action}: ${reason}`, { file: label, cause });
}

/** Whether `e` is a Node system error with the given `code` (ENOENT, EISDIR, …). */
export function hasErrno(e: unknown, code: string): boolean {
  return typeof e === 'object' && e !== null && (e as { code?: unknown }).code === code;
}

/** Most bytes one positioned read asks for (64 MiB). */
export const READ_CHUNK = 64 * 1024 * 1024;

class FileSource implements ByteSource {
  readonly label: string;
  readonly byteLength: number;
  readonly #handle: FileHandle;

  constructor(label: string, handle: FileHandle, byteLength: number) {
    this.label = label;
    this.#handle = handle;
    this.byteLength = byteLength;
  }

  async read(offset: number, length: number): Promise<Uint8Array> {
    const out = new Uint8Array(length);
    let filled = 0;
    try {
      // A positioned read may return less than asked; loop until full or end of file. Each read is
      // at most READ_CHUNK bytes: Node refuses (or aborts on) one read of 2 GiB or more, and a
      // tensor of several gigabytes streams in pieces, the event loop free between them.
      while (filled < length) {
        const { bytesRead } = await this.#handle.read(out, filled, Math.min(READ_CHUNK, length - filled), offset + filled);
        if (bytesRead === 0) break;
        filled += bytesRead;
      }
    } catch (cause) {
      throw ioError(`read ${String(length)} bytes at offset ${String(offset)}`, this.label, cause);
    }
    return filled === length ? out : out.subarray(0, filled);
  }

  async close(): Promise<void> {
    try {
      await this.#handle.close();
    } catch (cause) {
      throw ioError('close', this.label, cause);
    }
  }
}

/**
 * Opens `path` for positioned reads. Throws `ST_IO` (with the system error as `cause`) when the
 * file cannot be opened or is not a regular file.
 */
export async function openFileSource(path: string): Promise<ByteSource> {
  let handle: FileHandle;
  try {
    handle = await open(path, 'r');
  } catch (cause) {
    throw ioError('open', path, cause);
  }
  try {
    const stat = await handle.stat();
    if (!stat.isFile()) throw new SafetensorsError(SafetensorsCode.IO, 'cannot read: not a regular file', { file: path });
    return new FileSource(path, handle, stat.size);
  } catch (cause) {
    await handle.close().catch(() => undefined);
    throw cause instanceof SafetensorsError ? cause : ioError('stat', path, cause);
  }
}

/** A {@link ByteSource} over bytes already in memory (reads return copies). */
export function memorySource(bytes: Uint8Array, label = '<buffer>'): ByteSource {
  return {
    label,
    byteLength: bytes.length,
    read: (offset, length) => Promise.resolve(bytes.slice(offset, offset + length)),
    close: () => Promise.resolve(),
  };
}
