import { open } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { create, toBinary } from '@bufbuild/protobuf';
import { dimToString, errorMessage } from '@stageml/ir';
import { GraphProtoSchema, ModelProtoSchema, OperatorSetIdProtoSchema, type TensorProto } from 'onnx-buf';

import { OnnxCode, OnnxLowerError } from './errors.js';
import { type OnnxModel, type OnnxTensorSpec, ONNX_IR_VERSION } from './lower.js';
import { type DimSpec, externalTensorProto, tensorProto, usesDomain, valueInfoProto } from './proto.js';

/** Options of `encodeOnnx`. */
export interface EncodeOnnxOptions {
  /**
   * Store initializers of at least `threshold` bytes (default 1024) as ONNX external data instead
   * of inline: all in one file named `location` (relative to the model file, page-aligned), or each
   * in the file a `location` function names. Without this option every initializer is inline (the
   * protobuf must then stay under 2 GiB).
   */
  readonly externalData?: { readonly location: string | ((tensor: string, index: number) => string); readonly threshold?: number };
}

/** An initializer stored as external data: where it goes and its bytes. */
export interface ExternalTensor {
  /** Initializer name. */
  readonly name: string;
  /** External data file (relative to the model file). */
  readonly location: string;
  /** Byte offset in that file. */
  readonly offset: number;
  /** The tensor's bytes (a view of the lowered model's data, not a copy). */
  readonly data: Uint8Array;
}

/** An encoded model: the ModelProto bytes and the initializers stored externally. */
export interface EncodedOnnx {
  /** Serialized ModelProto. */
  readonly model: Uint8Array;
  /** External tensors in model order (empty without `externalData`). */
  readonly external: readonly ExternalTensor[];
  /** Bytes of initializer data kept inline and stored externally. */
  readonly bytes: { readonly inline: number; readonly external: number };
}

/** External tensors start at multiples of this (page size), so runtimes may map them in place. */
const ALIGN = 4096;

/** The declared dims of a tensor: sizes, plain symbols as `dim_param`, other symbolic dims unknown. */
function dimSpecs(t: OnnxTensorSpec): DimSpec[] {
  return t.shape.map((d) => {
    if (typeof d === 'number') return d;
    const s = dimToString(d);
    return /^[A-Za-z_][A-Za-z0-9_]*$/.test(s) ? s : undefined;
  });
}

/**
 * Serializes a lowered model to ONNX protobuf (ModelProto, IR version `ONNX_IR_VERSION`, producer
 * `stageml`), optionally moving large initializers to an external data file.
 */
export function encodeOnnx(model: OnnxModel, opts: EncodeOnnxOptions = {}): EncodedOnnx {
  const ext = opts.externalData;
  const threshold = ext?.threshold ?? 1024;
  const ends = new Map<string, number>();
  const external: ExternalTensor[] = [];
  let inline = 0;
  let outside = 0;
  const initializer: TensorProto[] = model.initializers.map((t, i) => {
    if (ext === undefined || t.raw.byteLength < threshold) {
      inline += t.raw.byteLength;
      return tensorProto(t.name, t.elemType, t.dims, t.raw);
    }
    const location = typeof ext.location === 'string' ? ext.location : ext.location(t.name, i);
    const end = ends.get(location) ?? 0;
    const offset = Math.ceil(end / ALIGN) * ALIGN;
    ends.set(location, offset + t.raw.byteLength);
    external.push({ name: t.name, location, offset, data: t.raw });
    outside += t.raw.byteLength;
    return externalTensorProto(t.name, t.elemType, t.dims, location, offset, t.raw.byteLength);
  });
  const graph = create(GraphProtoSchema, {
    name: model.name,
    node: [...model.nodes],
    initializer,
    input: model.inputs.map((i) => valueInfoProto(i.name, i.elemType, dimSpecs(i))),
    output: model.outputs.map((o) => valueInfoProto(o.name, o.elemType, dimSpecs(o))),
  });
  const proto = create(ModelProtoSchema, {
    irVersion: BigInt(ONNX_IR_VERSION),
    opsetImport: [
      create(OperatorSetIdProtoSchema, { domain: '', version: BigInt(model.opset) }),
      ...(usesDomain(model.nodes, 'com.microsoft') ? [create(OperatorSetIdProtoSchema, { domain: 'com.microsoft', version: 1n })] : []),
    ],
    producerName: 'stageml',
    producerVersion: '0.1.0',
    graph,
  });
  return { model: toBinary(ModelProtoSchema, proto), external, bytes: { inline, external: outside } };
}

/**
 * Writes a lowered model to `path` (ONNX protobuf); with `externalData`, initializers of at least
 * `threshold` bytes go to `<file name>.data` beside it. Returns the files written. Errors:
 * `ONNX_IO` naming the file.
 */
export async function writeOnnx(path: string, model: OnnxModel, opts: { readonly externalData?: boolean; readonly threshold?: number } = {}): Promise<{ readonly model: string; readonly data: string | undefined }> {
  const location = `${basename(path)}.data`;
  const encoded = encodeOnnx(model, opts.externalData === true ? { externalData: { location, ...(opts.threshold === undefined ? {} : { threshold: opts.threshold }) } } : {});
  const dataPath = encoded.external.length === 0 ? undefined : join(dirname(path), location);
  const write = async (file: string, parts: readonly { readonly offset: number; readonly data: Uint8Array }[]): Promise<void> => {
    let fh;
    try {
      fh = await open(file, 'w');
      for (const p of parts) {
        for (let done = 0; done < p.data.byteLength; ) done += (await fh.write(p.data, done, p.data.byteLength - done, p.offset + done)).bytesWritten;
      }
    } catch (e) {
      throw new OnnxLowerError(OnnxCode.IO, `cannot write ${file}: ${errorMessage(e)}`, { cause: e });
    } finally {
      await fh?.close();
    }
  };
  await write(path, [{ offset: 0, data: encoded.model }]);
  if (dataPath !== undefined) await write(dataPath, encoded.external);
  return { model: path, data: dataPath };
}
