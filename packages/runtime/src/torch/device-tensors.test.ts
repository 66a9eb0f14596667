import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { GraphBuilder, type HostTensor, hostTensor, roundFloat32InPlace } from '@stageml/ir';
import { expect, it } from 'vitest';

import { RuntimeCode } from '../errors.js';
import { type TorchExecutor, createTorchExecutor } from './executor.js';
import { describeWithTorch } from './test-support.js';

/** A .safetensors file of bf16 and f32 tensors (bf16: the upper half of each f32 word, values pre-rounded). */
function writeSafetensors(path: string, tensors: Record<string, { dtype: 'BF16' | 'F32'; shape: number[]; values: Float32Array }>): void {
  const header: Record<string, unknown> = {};
  const parts: Uint8Array[] = [];
  let offset = 0;
  for (const [name, t] of Object.entries(tensors)) {
    const words = new Uint32Array(t.values.buffer, t.values.byteOffset, t.values.length);
    const bytes = t.dtype === 'F32' ? new Uint8Array(t.values.buffer.slice(0)) : new Uint8Array(Uint16Array.from(words, (w) => w >>> 16).buffer);
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes.length] };
    parts.push(bytes);
    offset += bytes.length;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const len = new Uint8Array(8);
  new DataView(len.buffer).setBigUint64(0, BigInt(json.length), true);
  writeFileSync(path, Buffer.concat([len, Buffer.from(json), ...parts]));
}

const values = (n: number, k: number): Float32Array => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.7 + k) * 3.3);

describeWithTorch('torch device tensors (weights read by the worker, tables written by ranges)', () => {
  it('loads weights from a file, converts them on the device as the host would, takes row writes, and restores both on a new worker', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'stageml-devt-'));
    const file = join(dir, 'model.safetensors');
    const w = values(4 * 6, 1);
    roundFloat32InPlace(w, 'bf16');
    const v = values(4, 2);
    writeSafetensors(file, { w: { dtype: 'BF16', shape: [4, 6], values: w }, v: { dtype: 'F32', shape: [4], values: v } });
    // y = linear(x, W) + linear(x, T[0]) + v: W read from the file (bf16 → f32 exact), T a zeros table written by ranges.
    const b = new GraphBuilder('dev');
    const x = b.input('x', ['f32', ['n', 6]]);
    const W = b.input('W', ['f32', [4, 6]]);
    const T = b.input('T', ['f32', [4, 6]]);
    const V = b.input('V', ['f32', [4]]);
    b.output('y', b.add(b.add(b.linear(x, W), b.linear(x, T)), V));
    const g = b.build();
    const ex: TorchExecutor = await createTorchExecutor({ device: 'cpu' });
    try {
      const [wd, vd] = await ex.device.load([
        { file, tensor: 'w', dtype: 'f32', shape: [4, 6] },
        { file, tensor: 'v', dtype: 'f32', shape: [4] },
      ]);
      const [vb] = await ex.device.load([{ file, tensor: 'v', dtype: 'bf16', shape: [4] }]);
      const [td] = await ex.device.zeros([{ dtype: 'f32', shape: [4, 6] }]);
      expect(ex.device.holds(wd!) && ex.device.holds(td!) && !ex.device.holds(hostTensor('f32', [1], [1]))).toBe(true);
      expect(ex.device.bytes()).toBe(4 * 6 * 4 + 4 * 4 + 4 * 2 + 4 * 6 * 4);
      const tRows = new Float32Array(24);
      const row1 = Float32Array.from([0.5, -1, 2, 0, 0.25, 1]);
      tRows.set(row1, 6);
      let table: Float32Array = new Float32Array(24);
      ex.device.onRestore(() => Promise.resolve([{ target: td!, start: 0, data: table }]));
      table = tRows;
      await ex.device.write([{ target: td!, start: 6, data: row1 }]);
      const p = await ex.prepare(g);
      const xs = hostTensor('f32', [2, 6], Array.from(values(12, 3)));
      const expected = (xv: HostTensor): number[] => {
        const out: number[] = [];
        for (let r = 0; r < 2; r++) {
          for (let o = 0; o < 4; o++) {
            let acc = 0;
            for (let k = 0; k < 6; k++) acc += xv.data[r * 6 + k]! * (w[o * 6 + k]! + tRows[o * 6 + k]!);
            out.push(acc + v[o]!);
          }
        }
        return out;
      };
      const y1 = (await p.run({ x: xs, W: wd!, T: td!, V: vd! }))['y']!;
      expect(Array.from(y1.data).every((a, i) => Math.abs(a - expected(xs)[i]!) < 1e-4)).toBe(true);
      // Nothing of the weights crossed in the run: only x (2×6 f32) as tensor payload.
      const before = ex.traffic().sentTensorBytes;
      await p.run({ x: xs, W: wd!, T: td!, V: vd! });
      expect(ex.traffic().sentTensorBytes - before).toBe(2 * 6 * 4);
      // The worker dies: the next run re-reads the file, re-makes the table and restores its rows.
      process.kill(ex.pid!, 'SIGKILL');
      await expect(p.run({ x: xs, W: wd!, T: td!, V: vd! })).rejects.toMatchObject({ code: RuntimeCode.WORKER_FAILED });
      const y2 = (await p.run({ x: xs, W: wd!, T: td!, V: vd! }))['y']!;
      expect(Array.from(y2.data)).toEqual(Array.from(y1.data));
      expect(ex.traffic().restarts).toBe(1);
      // bf16 from f32 storage: rounded to nearest even on the device, as roundFloat32InPlace.
      const vr = v.slice();
      roundFloat32InPlace(vr, 'bf16');
      const gb = new GraphBuilder('cast');
      gb.output('o', gb.cast(gb.input('V', ['bf16', [4]]), 'f32'));
      const o = (await (await ex.prepare(gb.build())).run({ V: vb! }))['o']!;
      expect(Array.from(o.data)).toEqual(Array.from(vr));
      // Bad requests are coded and keep nothing.
      await expect(ex.device.load([{ file, tensor: 'nope', dtype: 'f32', shape: [4] }])).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE });
      await expect(ex.device.load([{ file, tensor: 'w', dtype: 'f32', shape: [6, 4] }])).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE });
      await expect(ex.device.load([{ file: join(dir, 'missing.safetensors'), tensor: 'w', dtype: 'f32', shape: [4, 6] }])).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE });
      await expect(ex.device.load([{ file, tensor: 'w', dtype: 'i64', shape: [4, 6] }])).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE });
      await expect(ex.device.write([{ target: td!, start: 20, data: row1 }])).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE });
      await expect(ex.device.write([{ target: xs, start: 0, data: row1 }])).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE });
      expect(ex.info.memory === undefined || ex.info.memory.total > 0).toBe(true);
      // A device tensor is an input, never a parameter (its data is not on the host to send).
      const pb = new GraphBuilder('param');
      pb.output('y', pb.mul(pb.param('W', ['f32', [4, 6]]), pb.constant([2], 'f32', [])));
      await expect(ex.prepare(pb.build(), { get: () => wd })).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE });
    } finally {
      await ex.close();
    }
  }, 120_000);

  it('rounds, scales and transposes a write on the worker exactly as the host would, and refuses malformed ones', async () => {
    // T [3, 5] bf16: row 0 from unrounded f32 values (the worker rounds them), rows 1-2 a [5, 2]
    // matrix B written transposed and scaled (a LoRA B as the slot tables hold it).
    const b = new GraphBuilder('readback');
    const T = b.input('T', ['bf16', [3, 5]]);
    const Z = b.input('Z', ['bf16', [3, 5]]);
    b.output('y', b.add(T, Z));
    const g = b.build();
    const ex: TorchExecutor = await createTorchExecutor({ device: 'cpu' });
    try {
      const [td, ti] = await ex.device.zeros([{ dtype: 'bf16', shape: [3, 5] }, { dtype: 'i8', shape: [4] }]);
      // Values whose bf16 rounding is a tie, a carry into the exponent, and a tiny one.
      const row0 = Float32Array.from([1.00390625, 1.01171875, -3.999999, 1e-30, 0.1]);
      const B = Float32Array.from([0.3, -1.7, 2.2, 0.05, -0.9, 1e-3, 7.77, -2.5, 0.333, 4.1]);
      const scale = 1 / 3;
      await ex.device.write([
        { target: td!, start: 0, data: row0, exact: false },
        { target: td!, start: 5, data: B, scale, transpose: [5, 2] },
      ]);
      const want = new Float32Array(15);
      want.set(row0, 0);
      for (let j = 0; j < 2; j++) for (let o = 0; o < 5; o++) want[5 + j * 5 + o] = scale * B[o * 2 + j]!;
      roundFloat32InPlace(want, 'bf16');
      const p = await ex.prepare(g);
      const y = (await p.run({ T: td!, Z: hostTensor('bf16', [3, 5], new Array(15).fill(0)) }))['y']!;
      expect(Array.from(y.data)).toEqual(Array.from(want));
      await expect(ex.device.write([{ target: td!, start: 0, data: B, transpose: [3, 3] }])).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining('transpose [3, 3]') });
      await expect(ex.device.write([{ target: td!, start: 0, data: B, scale: Number.NaN }])).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining('scale NaN') });
      await expect(ex.device.write([{ target: ti!, start: 0, data: Float32Array.from([1, 2]), exact: false }])).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining('float target') });
      // A refused write changed nothing.
      expect(Array.from((await p.run({ T: td!, Z: hostTensor('bf16', [3, 5], new Array(15).fill(0)) }))['y']!.data)).toEqual(Array.from(want));
    } finally {
      await ex.close();
    }
  }, 120_000);
});
