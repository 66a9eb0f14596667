import type { HostTensor } from '@stageml/ir';

import { decodeFloat32, decodeTensor } from './decode.js';
import { SafetensorsCode, SafetensorsError } from './errors.js';
import { type SafetensorsHeader, type TensorInfo, parseHeader, readHeaderLength } from './header.js';
import { type ByteSource, openFileSource } from './source.js';

/** Names, shapes and metadata of a parsed safetensors header; the part both readers share. */
export abstract class SafetensorsTable {
  /** The validated header. */
  readonly header: SafetensorsHeader;
  /** Path or label used in error messages. */
  readonly label: string;

  /** Stores the validated header and the label used in error messages. */
  protected constructor(header: SafetensorsHeader, label: string) {
    this.header = header;
    this.label = label;
  }

  /** The `__metadata__` string map, or undefined when the file has none. */
  get metadata(): Readonly<Record<string, string>> | undefined {
    return this.header.metadata;
  }

  /** Tensor names in data-section order. */
  names(): string[] {
    return [...this.header.tensors.keys()];
  }

  /** Whether the file holds a tensor called `name`. */
  has(name: string): boolean {
    return this.header.tensors.has(name);
  }

  /** Dtype, shape, byte length and offsets of `name`; throws `ST_MISSING_TENSOR` if absent. */
  info(name: string): TensorInfo {
    const info = this.header.tensors.get(name);
    if (info === undefined) {
      throw new SafetensorsError(SafetensorsCode.MISSING_TENSOR, `no tensor named '${name}' (the file holds ${String(this.header.tensors.size)})`, {
        file: this.label,
        tensor: name,
      });
    }
    return info;
  }
}

/** An in-memory safetensors buffer, validated up front; reads are synchronous and copy. */
export class SafetensorsBuffer extends SafetensorsTable {
  readonly #bytes: Uint8Array;

  /** Wraps already-validated bytes; use {@link parseSafetensors}. */
  private constructor(bytes: Uint8Array, header: SafetensorsHeader, label: string) {
    super(header, label);
    this.#bytes = bytes;
  }

  /** Parses and validates `bytes` (see {@link parseSafetensors}). */
  static parse(bytes: Uint8Array, label = '<buffer>'): SafetensorsBuffer {
    if (!(bytes instanceof Uint8Array)) {
      throw new SafetensorsError(SafetensorsCode.BAD_TENSOR, 'parseSafetensors expects a Uint8Array', { file: label });
    }
    const n = readHeaderLength(bytes, bytes.length, label);
    const header = parseHeader(bytes.subarray(8, 8 + n), bytes.length - 8 - n, label);
    return new SafetensorsBuffer(bytes, header, label);
  }

  /** A copy of the raw little-endian bytes of `name`. */
  readRaw(name: string): Uint8Array {
    const { dataOffsets } = this.info(name);
    const start = this.header.dataStart;
    return this.#bytes.slice(start + dataOffsets[0], start + dataOffsets[1]);
  }

  /** `name` decoded to a host tensor (dtype mapping in the package README). */
  readTensor(name: string): HostTensor {
    const info = this.info(name);
    return decodeTensor(info.dtype, info.shape, this.#view(info), { file: this.label, tensor: name });
  }

  /** `name` converted to f32 from any dtype (rounded to nearest even where wider). */
  readFloat32(name: string): Float32Array {
    const info = this.info(name);
    return decodeFloat32(info.dtype, this.#view(info));
  }

  #view(info: TensorInfo): Uint8Array {
    const start = this.header.dataStart;
    return this.#bytes.subarray(start + info.dataOffsets[0], start + info.dataOffsets[1]);
  }
}

/**
 * Parses an in-memory safetensors file, validating the whole header against the buffer. Throws a
 * `SafetensorsError` for any malformed input.
 */
export function parseSafetensors(bytes: Uint8Array, label?: string): SafetensorsBuffer {
  return SafetensorsBuffer.parse(bytes, label);
}

/**
 * A lazily read safetensors file. Opening reads only the length prefix and the header; each read
 * fetches just that tensor's byte range with a positioned read, so a multi-gigabyte checkpoint
 * costs what the caller actually reads.
 */
export class SafetensorsFile extends SafetensorsTable {
  readonly #source: ByteSource;
  #closed = false;

  /** Wraps a source whose header is already validated; use {@link SafetensorsFile.open}. */
  private constructor(source: ByteSource, header: SafetensorsHeader) {
    super(header, source.label);
    this.#source = source;
  }

  /** Opens `path` and validates its header. Throws `ST_IO` when it cannot be read. */
  static async open(path: string): Promise<SafetensorsFile> {
    return SafetensorsFile.fromSource(await openFileSource(path));
  }

  /**
   * Reads and validates the header from `source`; the file takes ownership and closes the
   * source on failure and on {@link SafetensorsFile.close}.
   */
  static async fromSource(source: ByteSource): Promise<SafetensorsFile> {
    try {
      const size = source.byteLength;
      const prefix = await source.read(0, Math.min(8, size));
      const n = readHeaderLength(prefix, size, source.label);
      const headerBytes = await source.read(8, n);
      if (headerBytes.length < n) {
        throw new SafetensorsError(SafetensorsCode.TRUNCATED, `header: read ${String(headerBytes.length)} of ${String(n)} bytes`, {
          file: source.label,
        });
      }
      return new SafetensorsFile(source, parseHeader(headerBytes, size - 8 - n, source.label));
    } catch (e) {
      await source.close().catch(() => undefined);
      throw e;
    }
  }

  /** Reads the raw little-endian bytes of `name` (only that range of the file). */
  async readRaw(name: string): Promise<Uint8Array> {
    this.#open(`tensor '${name}'`, name);
    const { dataOffsets, byteLength } = this.info(name);
    if (byteLength === 0) return new Uint8Array(0);
    return this.#readData(dataOffsets[0], byteLength, `tensor '${name}'`, name);
  }

  /** `ST_CLOSED` once closed (`what`: the read refused). */
  #open(what: string, tensor?: string): void {
    if (this.#closed) throw new SafetensorsError(SafetensorsCode.CLOSED, `cannot read ${what}: file is closed`, { file: this.label, ...(tensor === undefined ? {} : { tensor }) });
  }

  /** `length` bytes at `offset` of the data section; fewer (the file shrank after opening) is `ST_TRUNCATED`. */
  async #readData(offset: number, length: number, what: string, tensor?: string): Promise<Uint8Array> {
    const bytes = await this.#source.read(this.header.dataStart + offset, length);
    if (bytes.length !== length) {
      throw new SafetensorsError(SafetensorsCode.TRUNCATED, `${what}: read ${String(bytes.length)} of ${String(length)} bytes (the file shrank after opening?)`, { file: this.label, ...(tensor === undefined ? {} : { tensor }) });
    }
    return bytes;
  }

  /** Reads `name` and decodes it to a host tensor (dtype mapping in the package README). */
  async readTensor(name: string): Promise<HostTensor> {
    const info = this.info(name);
    return decodeTensor(info.dtype, info.shape, await this.readRaw(name), { file: this.label, tensor: name }, true);
  }

  /**
   * Reads several tensors, decoded as `readTensor` does: where they lie together in the file (the
   * bytes they span at most `maxSpan`, default 256 MiB, and at most twice their own), with one
   * positioned read of that span instead of one per tensor — an adapter of 224 small tensors is one
   * read, not 224 round trips through the thread pool.
   */
  async readTensors(names: readonly string[], maxSpan = 256 * 1024 * 1024): Promise<HostTensor[]> {
    this.#open(`${String(names.length)} tensors`);
    const infos = names.map((n) => this.info(n));
    let lo = Infinity;
    let hi = 0;
    let own = 0;
    for (const info of infos) {
      if (info.byteLength === 0) continue;
      lo = Math.min(lo, info.dataOffsets[0]);
      hi = Math.max(hi, info.dataOffsets[1]);
      own += info.byteLength;
    }
    if (own === 0 || hi - lo > maxSpan || hi - lo > 2 * own) return Promise.all(names.map((n) => this.readTensor(n)));
    const bytes = await this.#readData(lo, hi - lo, `${String(names.length)} tensors`);
    return infos.map((info, i) =>
      decodeTensor(info.dtype, info.shape, info.byteLength === 0 ? new Uint8Array(0) : bytes.subarray(info.dataOffsets[0] - lo, info.dataOffsets[1] - lo), { file: this.label, tensor: names[i]! }, true),
    );
  }

  /** Reads `name` and converts it to f32 from any dtype. */
  async readFloat32(name: string): Promise<Float32Array> {
    const info = this.info(name);
    return decodeFloat32(info.dtype, await this.readRaw(name), true);
  }

  /** Whether {@link SafetensorsFile.close} has been called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Releases the file handle. Idempotent; later reads throw `ST_CLOSED`. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#source.close();
  }
}
