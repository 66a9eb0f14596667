import { readFile, stat } from 'node:fs/promises';
import { dirname, isAbsolute, join } from 'node:path';

import { type HostTensor, type WeightStore, recordWeightStore, errorMessage } from '@stageml/ir';

import type { SafetensorsDType } from './dtype.js';
import { SafetensorsCode, SafetensorsError } from './errors.js';
import { SafetensorsFile } from './file.js';
import { MAX_HEADER_BYTES, type TensorInfo, isPlainObject } from './header.js';
import { findDuplicateKey } from './json-keys.js';
import { hasErrno } from './source.js';

/** Options of {@link openCheckpoint}. */
export interface CheckpointOptions {
  /**
   * Weights file name to look for in a directory (default `model.safetensors`; PEFT adapters use
   * `adapter_model.safetensors`). The sharded index is this name plus `.index.json`.
   */
  readonly fileName?: string;
}

/**
 * Read access to named tensors, whatever their storage: the lazy weight-store shape the rest of
 * StageML consumes. All reads are lazy; `close` releases file handles.
 */
export interface WeightReader {
  /** Tensor names (index order for sharded checkpoints, data order for single files). */
  names(): string[];
  /** Whether a tensor called `name` exists. */
  has(name: string): boolean;
  /** Dtype, shape and byte length of `name`; throws `ST_MISSING_TENSOR` if absent. */
  info(name: string): TensorInfo;
  /** Raw little-endian bytes of `name`. */
  readRaw(name: string): Promise<Uint8Array>;
  /** `name` decoded to a host tensor. */
  readTensor(name: string): Promise<HostTensor>;
  /** `name` converted to f32. */
  readFloat32(name: string): Promise<Float32Array>;
  /** Releases every open file. */
  close(): Promise<void>;
}

/** A checkpoint directory: one `model.safetensors`, or shards listed by `model.safetensors.index.json`. */
export class Checkpoint implements WeightReader {
  /** The file opened first: the single weights file or the index. */
  readonly path: string;
  /** `'single'` for one weights file, `'sharded'` for an index plus shards. */
  readonly layout: 'single' | 'sharded';
  /** The index's `metadata` object (sharded) or the file's `__metadata__` (single), if any. */
  readonly metadata: Readonly<Record<string, unknown>> | undefined;
  readonly #where: ReadonlyMap<string, SafetensorsFile>;
  readonly #files: readonly SafetensorsFile[];

  /** Assembles an opened checkpoint; use {@link openCheckpoint}. */
  private constructor(
    path: string,
    layout: 'single' | 'sharded',
    metadata: Readonly<Record<string, unknown>> | undefined,
    where: ReadonlyMap<string, SafetensorsFile>,
    files: readonly SafetensorsFile[],
  ) {
    this.path = path;
    this.layout = layout;
    this.metadata = metadata;
    this.#where = where;
    this.#files = files;
  }

  /** Opens a single weights file as a one-shard checkpoint. */
  static async single(path: string): Promise<Checkpoint> {
    const file = await SafetensorsFile.open(path);
    const where = new Map(file.names().map((n) => [n, file]));
    return new Checkpoint(path, 'single', file.metadata, where, [file]);
  }

  /** Opens an index and every shard it names, checking that each key is present in its shard. */
  static async sharded(indexPath: string): Promise<Checkpoint> {
    const { metadata, weightMap } = await readIndex(indexPath);
    const base = dirname(indexPath);
    const opened = new Map<string, SafetensorsFile>();
    try {
      const where = new Map<string, SafetensorsFile>();
      for (const [name, shard] of weightMap) {
        let file = opened.get(shard);
        if (file === undefined) {
          file = await openShard(join(base, shard), indexPath, shard, name);
          opened.set(shard, file);
        }
        if (!file.has(name)) {
          throw new SafetensorsError(SafetensorsCode.MISSING_TENSOR, `index maps '${name}' to shard '${shard}', which has no such tensor`, {
            file: indexPath,
            tensor: name,
          });
        }
        where.set(name, file);
      }
      return new Checkpoint(indexPath, 'sharded', metadata, where, [...opened.values()]);
    } catch (e) {
      await Promise.all([...opened.values()].map((f) => f.close().catch(() => undefined)));
      throw e;
    }
  }

  /** Tensor names (index order for sharded checkpoints, data order for single files). */
  names(): string[] {
    return [...this.#where.keys()];
  }

  /** Whether a tensor called `name` exists. */
  has(name: string): boolean {
    return this.#where.has(name);
  }

  /** Path of the file holding `name`; throws `ST_MISSING_TENSOR` if absent. */
  fileOf(name: string): string {
    return this.#file(name).label;
  }

  /** Dtype, shape and byte length of `name`; throws `ST_MISSING_TENSOR` if absent. */
  info(name: string): TensorInfo {
    return this.#file(name).info(name);
  }

  /**
   * The float dtype holding most of the checkpoint's float elements (F64, F32, BF16, F16, F8_…, by
   * element count), or undefined with no float tensor: the dtype a model "is stored in".
   */
  storedFloatDType(): SafetensorsDType | undefined {
    const count = new Map<SafetensorsDType, number>();
    for (const n of this.names()) {
      const info = this.info(n);
      if (info.dtype.startsWith('F') || info.dtype === 'BF16') count.set(info.dtype, (count.get(info.dtype) ?? 0) + info.shape.reduce((a, b) => a * b, 1));
    }
    return [...count.entries()].sort((a, b) => b[1] - a[1])[0]?.[0];
  }

  /** Raw little-endian bytes of `name` (reads only that range of its shard). */
  readRaw(name: string): Promise<Uint8Array> {
    return this.#file(name).readRaw(name);
  }

  /** `name` decoded to a host tensor. */
  readTensor(name: string): Promise<HostTensor> {
    return this.#file(name).readTensor(name);
  }

  /** `name` converted to f32. */
  readFloat32(name: string): Promise<Float32Array> {
    return this.#file(name).readFloat32(name);
  }

  /** Closes every shard. Idempotent. */
  async close(): Promise<void> {
    await Promise.all(this.#files.map((f) => f.close()));
  }

  #file(name: string): SafetensorsFile {
    const file = this.#where.get(name);
    if (file === undefined) {
      throw new SafetensorsError(SafetensorsCode.MISSING_TENSOR, `no tensor named '${name}' in the checkpoint (${String(this.#where.size)} tensors)`, {
        file: this.path,
        tensor: name,
      });
    }
    return file;
  }
}

async function openShard(path: string, indexPath: string, shard: string, name: string): Promise<SafetensorsFile> {
  try {
    return await SafetensorsFile.open(path);
  } catch (e) {
    if (e instanceof SafetensorsError && e.code === SafetensorsCode.IO && hasErrno(e.cause, 'ENOENT')) {
      throw new SafetensorsError(SafetensorsCode.MISSING_SHARD, `shard '${shard}' (holding '${name}') does not exist at ${path}`, {
        file: indexPath,
        tensor: name,
        cause: e,
      });
    }
    throw e;
  }
}

function badIndex(file: string, message: string, cause?: unknown): SafetensorsError {
  return new SafetensorsError(SafetensorsCode.BAD_INDEX, message, { file, cause });
}

/** A shard path must stay inside the checkpoint directory. */
function isSafeShardPath(p: string): boolean {
  return p.length > 0 && !isAbsolute(p) && !p.split(/[\\/]/).includes('..');
}

interface IndexFile {
  readonly metadata: Readonly<Record<string, unknown>> | undefined;
  readonly weightMap: ReadonlyMap<string, string>;
}

/** Reads and validates `{"metadata": {...}, "weight_map": {tensor: shardFile}}`. */
async function readIndex(path: string): Promise<IndexFile> {
  let text: string;
  try {
    const bytes = await readFile(path);
    if (bytes.length > MAX_HEADER_BYTES) throw badIndex(path, `index is ${String(bytes.length)} bytes, over the ${String(MAX_HEADER_BYTES)}-byte limit`);
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch (e) {
    if (e instanceof SafetensorsError) throw e;
    if (e instanceof TypeError) throw badIndex(path, 'index is not valid UTF-8', e);
    throw new SafetensorsError(SafetensorsCode.IO, `cannot read index: ${errorMessage(e)}`, { file: path, cause: e });
  }
  let root: unknown;
  try {
    root = JSON.parse(text);
  } catch (cause) {
    throw badIndex(path, `index is not well-formed JSON${cause instanceof SyntaxError ? `: ${cause.message}` : ''}`, cause);
  }
  if (!isPlainObject(root)) throw badIndex(path, 'index is not a JSON object');
  const dup = findDuplicateKey(text);
  if (dup !== undefined) {
    throw new SafetensorsError(SafetensorsCode.DUPLICATE_KEY, `key '${dup.key}' occurs twice in ${dup.path.length === 0 ? 'the index' : `'${dup.path.join('.')}'`}`, {
      file: path,
    });
  }
  const metadata = root['metadata'];
  if (metadata !== undefined && !isPlainObject(metadata)) throw badIndex(path, `'metadata' must be an object, got ${JSON.stringify(metadata)}`);
  const map = root['weight_map'];
  if (!isPlainObject(map)) throw badIndex(path, `'weight_map' must be an object of tensor name → shard file, got ${JSON.stringify(map)}`);
  const weightMap = new Map<string, string>();
  for (const [name, shard] of Object.entries(map)) {
    if (typeof shard !== 'string' || !isSafeShardPath(shard)) {
      throw new SafetensorsError(SafetensorsCode.BAD_INDEX, `weight_map['${name}'] is ${JSON.stringify(shard)}, not a relative shard file name inside the checkpoint`, {
        file: path,
        tensor: name,
      });
    }
    weightMap.set(name, shard);
  }
  return { metadata, weightMap };
}

async function isFile(path: string): Promise<boolean> {
  try {
    return (await stat(path)).isFile();
  } catch {
    return false;
  }
}

/**
 * Opens a checkpoint lazily: a directory holding `model.safetensors` (preferred, as transformers
 * does) or `model.safetensors.index.json` plus its shards, or a path to either file itself. Every
 * shard's header is read and checked against the index up front; tensor data is read on demand.
 * Throws `ST_NO_CHECKPOINT`, `ST_BAD_INDEX`, `ST_MISSING_SHARD` or `ST_MISSING_TENSOR` (naming the
 * file and key) as well as any header error of a shard.
 */
export async function openCheckpoint(path: string, options: CheckpointOptions = {}): Promise<Checkpoint> {
  const fileName = options.fileName ?? 'model.safetensors';
  if (await isFile(path)) return path.endsWith('.index.json') ? Checkpoint.sharded(path) : Checkpoint.single(path);
  const single = join(path, fileName);
  if (await isFile(single)) return Checkpoint.single(single);
  const index = `${single}.index.json`;
  if (await isFile(index)) return Checkpoint.sharded(index);
  throw new SafetensorsError(SafetensorsCode.NO_CHECKPOINT, `found neither ${fileName} nor ${fileName}.index.json`, { file: path });
}

/**
 * Reads `names` (default: all) from `reader` into memory and returns the synchronous
 * `WeightStore` the IR interpreter takes. Throws `ST_MISSING_TENSOR` for a name the reader lacks.
 */
export async function loadWeightStore(reader: WeightReader, names: readonly string[] = reader.names()): Promise<WeightStore> {
  const record: Record<string, HostTensor> = Object.create(null) as Record<string, HostTensor>;
  for (const name of names) record[name] = await reader.readTensor(name);
  return recordWeightStore(record);
}
