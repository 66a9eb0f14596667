import { create } from '@bufbuild/protobuf';
import {
  AttributeProtoSchema,
  type GraphProto,
  GraphProtoSchema,
  AttributeProto_AttributeType,
  type AttributeProto,
  type NodeProto,
  NodeProtoSchema,
  StringStringEntryProtoSchema,
  type TensorProto,
  TensorProtoSchema,
  TensorProto_DataLocation,
  type TensorProto_DataType,
  TensorShapeProtoSchema,
  TensorShapeProto_DimensionSchema,
  TypeProtoSchema,
  TypeProto_TensorSchema,
  type ValueInfoProto,
  ValueInfoProtoSchema,
} from 'onnx-buf';

// NOTE: the message schemas come from `onnx-buf`, the official onnx.proto (ONNX 1.20, Apache-2.0)
// compiled with protoc-gen-es for `@bufbuild/protobuf`; see https://github.com/onnx/onnx/blob/main/onnx/onnx.proto.

/**
 * An attribute value of an emitted node: a JS number is an INT, a number array INTS, a string a
 * STRING; floats are tagged (`{ float: 1e-5 }`) because ONNX types INT and FLOAT differently.
 */
export type OnnxAttr = number | readonly number[] | string | { readonly float: number } | { readonly floats: readonly number[] } | { readonly graph: GraphProto };

/** Builds an AttributeProto (ints are written as int64). */
export function attributeProto(name: string, v: OnnxAttr): AttributeProto {
  if (typeof v === 'number') return create(AttributeProtoSchema, { name, type: AttributeProto_AttributeType.INT, i: BigInt(v) });
  if (typeof v === 'string') return create(AttributeProtoSchema, { name, type: AttributeProto_AttributeType.STRING, s: new TextEncoder().encode(v) });
  if (Array.isArray(v)) return create(AttributeProtoSchema, { name, type: AttributeProto_AttributeType.INTS, ints: (v as readonly number[]).map((x) => BigInt(x)) });
  if ('float' in v) return create(AttributeProtoSchema, { name, type: AttributeProto_AttributeType.FLOAT, f: v.float });
  if ('graph' in v) return create(AttributeProtoSchema, { name, type: AttributeProto_AttributeType.GRAPH, g: v.graph });
  return create(AttributeProtoSchema, { name, type: AttributeProto_AttributeType.FLOATS, floats: [...(v as { readonly floats: readonly number[] }).floats] });
}

/** Builds a NodeProto of the default (ai.onnx) domain, or of `domain` (`com.microsoft`). */
export function nodeProto(opType: string, inputs: readonly string[], outputs: readonly string[], name: string, attrs: Readonly<Record<string, OnnxAttr>>, domain = ''): NodeProto {
  return create(NodeProtoSchema, {
    opType,
    domain,
    name,
    input: [...inputs],
    output: [...outputs],
    attribute: Object.entries(attrs).map(([k, v]) => attributeProto(k, v)),
  });
}

/** One dimension of a declared tensor type: a size, a symbol name (`dim_param`) or unknown. */
export type DimSpec = number | string | undefined;

/** Builds a ValueInfoProto of a tensor (graph inputs and outputs). */
export function valueInfoProto(name: string, elemType: TensorProto_DataType, dims: readonly DimSpec[]): ValueInfoProto {
  const dim = dims.map((d) =>
    create(TensorShapeProto_DimensionSchema, {
      value: typeof d === 'number' ? { case: 'dimValue', value: BigInt(d) } : typeof d === 'string' ? { case: 'dimParam', value: d } : { case: undefined },
    }),
  );
  const tensorType = create(TypeProto_TensorSchema, { elemType, shape: create(TensorShapeProtoSchema, { dim }) });
  return create(ValueInfoProtoSchema, { name, type: create(TypeProtoSchema, { value: { case: 'tensorType', value: tensorType } }) });
}

/** Builds a TensorProto holding its little-endian bytes in `raw_data`. */
export function tensorProto(name: string, elemType: TensorProto_DataType, dims: readonly number[], raw: Uint8Array<ArrayBuffer>): TensorProto {
  return create(TensorProtoSchema, { name, dataType: elemType, dims: dims.map((d) => BigInt(d)), rawData: raw });
}

/** Builds a TensorProto whose bytes live in an external data file at `offset` (ONNX external data). */
export function externalTensorProto(name: string, elemType: TensorProto_DataType, dims: readonly number[], location: string, offset: number, length: number): TensorProto {
  const entry = (key: string, value: string) => create(StringStringEntryProtoSchema, { key, value });
  return create(TensorProtoSchema, {
    name,
    dataType: elemType,
    dims: dims.map((d) => BigInt(d)),
    dataLocation: TensorProto_DataLocation.EXTERNAL,
    externalData: [entry('location', location), entry('offset', String(offset)), entry('length', String(length))],
  });
}

/**
 * A subgraph (an If branch): `nodes`, reading outer-scope tensors by name, and one output of
 * element type `elemType` and unspecified shape.
 */
export function subgraphProto(name: string, nodes: readonly NodeProto[], output: string, elemType: TensorProto_DataType): GraphProto {
  const type = create(TypeProtoSchema, { value: { case: 'tensorType', value: create(TypeProto_TensorSchema, { elemType }) } });
  return create(GraphProtoSchema, { name, node: [...nodes], output: [create(ValueInfoProtoSchema, { name: output, type })] });
}

/** Every input a node reads, its subgraphs' (If branches') outer-scope reads included. */
export function nodeReads(n: NodeProto): string[] {
  const out = [...n.input];
  for (const a of n.attribute) if (a.g !== undefined) for (const m of a.g.node) out.push(...nodeReads(m));
  return out;
}

/** Whether any node, or any node of a subgraph, is of `domain`. */
export function usesDomain(nodes: readonly NodeProto[], domain: string): boolean {
  return nodes.some((n) => n.domain === domain || n.attribute.some((a) => a.g !== undefined && usesDomain(a.g.node, domain)));
}
