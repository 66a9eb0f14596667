import { fileURLToPath } from 'node:url';
import { GraphBuilder, type HostTensor, hostTensor, interpret } from '@stageml/ir';
import { SafetensorsFile } from '@stageml/safetensors';
import { beforeAll, describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import { bankLinearGathered, bankLinearGrouped, loadLoraAdapter, loraLinear, type LoraAdapter } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as {
  linear: Record<string, { r: number; alpha: number; scaling: number }> & { mixed_adapter_names: string[] };
};
const NAMES = ['t0', 't1', 't2', 't3'] as const;
const t: Record<string, HostTensor> = {};
const adapters: Record<string, LoraAdapter> = {};

beforeAll(async () => {
  const f = await SafetensorsFile.open(`${root}golden.safetensors`);
  for (const k of f.names()) if (k.startsWith('linear.')) t[k] = await f.readTensor(k);
  await f.close();
  for (const n of NAMES) adapters[n] = await loadLoraAdapter(`${root}linear/adapters/${n}`);
});

function rowsOf(y: HostTensor, rows: readonly number[]): HostTensor {
  const cols = y.shape[1]!;
  const out: number[] = [];
  for (const r of rows) out.push(...Array.from(y.data.subarray(r * cols, (r + 1) * cols)));
  return hostTensor('f32', [rows.length, cols], out);
}

describe('PEFT linear fixtures', () => {
  it('loads every adapter with the scaling golden.json lists', () => {
    for (const n of NAMES) {
      const m = adapters[n]!.modules.get('proj')!;
      expect(m.rank).toBe(golden.linear[n]!.r);
      expect(m.scale).toBe(golden.linear[n]!.scaling);
      expect(Array.from(m.A.data)).toEqual(Array.from(t[`linear.${n}.A`]!.data));
      expect(Array.from(m.B.data)).toEqual(Array.from(t[`linear.${n}.B`]!.data));
    }
  });

  for (const form of ['residual', 'merged'] as const) {
    it(`applies each adapter alone (${form}) equal to PEFT on its rows`, () => {
      const names = golden.linear.mixed_adapter_names;
      for (const n of [...NAMES, '__base__']) {
        const rows = names.flatMap((m, i) => (m === n ? [i] : []));
        const b = new GraphBuilder('proj');
        const x = b.input('x', ['f32', ['rows', 64]]);
        const w = b.param('w', ['f32', [96, 64]]);
        const bias = b.param('bias', ['f32', [96]]);
        const lora = n === '__base__' ? undefined : { A: b.param('A', ['f32', [golden.linear[n]!.r, 64]]), B: b.param('B', ['f32', [96, golden.linear[n]!.r]]), scale: adapters[n]!.modules.get('proj')!.scale };
        b.output('y', loraLinear(b, x, w, bias, lora, form));
        const m = adapters[n]?.modules.get('proj');
        const out = interpret(b.build(), {
          inputs: { x: rowsOf(t['linear.mixed.x']!, rows) },
          weights: { w: t['linear.base.weight']!, bias: t['linear.base.bias']!, ...(m === undefined ? {} : { A: m.A, B: m.B }) },
        })['y']!;
        expect(out).toBeAllclose(rowsOf(t['linear.mixed.y']!, rows), { rtol: 1e-5, atol: 1e-5 });
      }
    });
  }

  it('runs the mixed batch grouped by adapter (SGMV) equal to PEFT, base-only row included', () => {
    const names = golden.linear.mixed_adapter_names;
    const b = new GraphBuilder('bank');
    const x = b.input('x', ['f32', ['rows', 64]]);
    const w = b.param('w', ['f32', [96, 64]]);
    const bias = b.param('bias', ['f32', [96]]);
    const inputs: Record<string, HostTensor> = { x: t['linear.mixed.x']! };
    const weights: Record<string, HostTensor> = { w: t['linear.base.weight']!, bias: t['linear.base.bias']! };
    const groups = NAMES.map((n) => {
      const m = adapters[n]!.modules.get('proj')!;
      const rows = names.flatMap((a, i) => (a === n ? [i] : []));
      inputs[`rows.${n}`] = hostTensor('i64', [rows.length], rows);
      weights[`${n}.A`] = m.A;
      weights[`${n}.B`] = m.B;
      return { rows: b.input(`rows.${n}`, ['i64', [`n_${n}`]]), lora: { A: b.param(`${n}.A`, ['f32', [m.rank, 64]]), B: b.param(`${n}.B`, ['f32', [96, m.rank]]), scale: m.scale } };
    });
    b.output('y', bankLinearGrouped(b, x, w, bias, groups));
    expect(interpret(b.build(), { inputs, weights })['y']!).toBeAllclose(t['linear.mixed.y']!, { rtol: 1e-5, atol: 1e-5 });
  });

  it('runs the mixed batch gathered per row (BGMV) equal to PEFT', () => {
    const names = golden.linear.mixed_adapter_names;
    const r = 16;
    const slots = ['__base__', ...NAMES];
    const A = new Float32Array(slots.length * r * 64);
    const B = new Float32Array(slots.length * 96 * r);
    const scales: number[] = [0];
    NAMES.forEach((n, k) => {
      const m = adapters[n]!.modules.get('proj')!;
      const slot = k + 1;
      for (let i = 0; i < m.rank; i++) for (let j = 0; j < 64; j++) A[(slot * r + i) * 64 + j] = m.A.data[i * 64 + j]!;
      for (let o = 0; o < 96; o++) for (let i = 0; i < m.rank; i++) B[(slot * 96 + o) * r + i] = m.B.data[o * m.rank + i]!;
      scales.push(m.scale);
    });
    const b = new GraphBuilder('bgmv');
    const x = b.input('x', ['f32', ['rows', 1, 64]]);
    const y = bankLinearGathered(
      b,
      x,
      b.param('w', ['f32', [96, 64]]),
      b.param('bias', ['f32', [96]]),
      { A: b.param('A', ['f32', [slots.length, r, 64]]), B: b.param('B', ['f32', [slots.length, 96, r]]), scales: b.param('scales', ['f32', [slots.length]]) },
      b.input('slot', ['i64', ['rows']]),
    );
    b.output('y', b.reshape(y, ['rows', 96]));
    const xs = t['linear.mixed.x']!;
    const out = interpret(b.build(), {
      inputs: { x: { ...xs, shape: [10, 1, 64] }, slot: hostTensor('i64', [10], names.map((n) => slots.indexOf(n))) },
      weights: { w: t['linear.base.weight']!, bias: t['linear.base.bias']!, A: hostTensor('f32', [slots.length, r, 64], A), B: hostTensor('f32', [slots.length, 96, r], B), scales: hostTensor('f32', [slots.length], scales) },
    })['y']!;
    expect(out).toBeAllclose(t['linear.mixed.y']!, { rtol: 1e-5, atol: 1e-5 });
  });
});
