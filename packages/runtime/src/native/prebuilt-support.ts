// Test support for prebuilt.test.ts, run as a child process (the addon is loaded once per
// process): prepares a graph on cpu-native covering the f32 GEMM paths, the fused LoRA layer, an
// int8 quantized linear, SiLU and RMSNorm, runs it at 1, 3 and 9 rows, and prints one JSON line:
// where the addon came from, its ISA, a SHA-256 of every output's bits, and the largest relative
// difference from the interpreter.
import { createHash } from 'node:crypto';
import { GraphBuilder, type HostTensor, interpret, seededRandom } from '@stageml/ir';
import { quantizeLinears } from '../quantize.js';
import { createCpuNativeExecutor } from './executor.js';

const executor = createCpuNativeExecutor({ threads: 2 });
const rnd = seededRandom(3);
const tensor = (shape: number[]): HostTensor => ({ dtype: 'f32', shape, data: Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, () => rnd() * 2 - 1) });
const b = new GraphBuilder('prebuilt_probe');
const x = b.input('x', ['f32', ['m', 96]]);
const h = b.silu(b.linear(x, b.param('w', ['f32', [70, 96]])));
const lora = b.mul(b.linear(b.linear(h, b.param('lora_A', ['f32', [4, 70]])), b.param('lora_B', ['f32', [96, 4]])), b.constant(0.5));
b.output('y', b.rmsNorm(b.add(b.linear(h, b.param('w2', ['f32', [96, 70]])), lora), undefined, 1e-5));
b.output('q', b.linear(x, b.param('wq', ['f32', [64, 96]])));
const f32 = { w: tensor([70, 96]), w2: tensor([96, 70]), lora_A: tensor([4, 70]), lora_B: tensor([96, 4]), wq: tensor([64, 96]) };
const int8 = { bits: 8, blockSize: 32, symmetric: true } as const;
const q = quantizeLinears(b.build(), { wq: f32.wq }, { choose: (name) => (name === 'wq' ? int8 : undefined) });
const weights = { ...f32, ...q.constants };
const prepared = await executor.prepare(q.graph, weights);
const hash = createHash('sha256');
let worst = 0;
for (const m of [1, 3, 9]) {
  const inputs = { x: tensor([m, 96]) };
  const got = await prepared.run(inputs);
  const want = interpret(q.graph, { inputs, weights });
  for (const name of ['y', 'q']) {
    const g = got[name]!.data as Float32Array;
    const w = want[name]!.data as Float32Array;
    hash.update(new Uint8Array(g.buffer, g.byteOffset, g.byteLength));
    // The quantized output rounds activations to int8 (a looser bound than f32's).
    const scale = name === 'q' ? 1 / 20 : 1;
    for (let i = 0; i < g.length; i++) worst = Math.max(worst, (scale * Math.abs(g[i]! - w[i]!)) / (1 + Math.abs(w[i]!)));
  }
}
prepared.dispose();
console.log(JSON.stringify({ build: executor.build, isa: executor.isa, sha256: hash.digest('hex'), worst }));
