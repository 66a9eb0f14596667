import { GraphBuilder, quantizeWeight, seededRandom } from '@stageml/ir';
import { createCpuNativeExecutor, loadCpuAddon } from '@stageml/runtime';
const ex = createCpuNativeExecutor({ threads: Number(process.env['T'] ?? 2) });
const addon = loadCpuAddon();
console.log('amx', addon.amx?.(true)); addon.amx?.(true);
const rnd = seededRandom(1);
for (const [k, n, bits] of [[1024, 3072, 8], [3072, 1024, 8], [1024, 2048, 8], [1024, 3072, 4]] as const) {
  const w = Float32Array.from({ length: n * k }, () => rnd() * 2 - 1);
  const p = quantizeWeight(w, n, k, { bits, blockSize: 32, symmetric: true });
  const b = new GraphBuilder('q');
  const x = b.input('x', ['f32', ['m', k]]);
  b.output('y', b.quantizedLinear(x, b.param('q', ['u8', p.qweight.shape]), b.param('s', ['f32', p.scales.shape]), undefined, p.attrs));
  const prep = await ex.prepare(b.build(), { q: p.qweight, s: p.scales });
  const m = 128;
  const xs = { dtype: 'f32' as const, shape: [m, k], data: Float32Array.from({ length: m * k }, () => rnd() * 2 - 1) };
  const t: Record<string, number[]> = { vnni: [], amx: [] };
  let same = true;
  let ref: Float32Array | undefined;
  for (let i = 0; i < 3; i++) {
    for (const mode of ['vnni', 'amx']) {
      addon.amx?.(mode === 'amx');
      const t0 = performance.now();
      const y = (await prep.run({ x: xs }))['y']!.data as Float32Array;
      t[mode]!.push(performance.now() - t0);
      if (ref === undefined) ref = y.slice(); else for (let j = 0; j < y.length; j++) if (y[j] !== ref[j]) { same = false; break; }
    }
  }
  const med = (a: number[]) => Math.min(...a);
  const macs = m * k * n;
  console.log(`int${bits} ${m}x${k}->${n}: vnni ${med(t['vnni']!).toFixed(2)} ms (${(macs / med(t['vnni']!) / 1e6).toFixed(0)} GMAC/s) amx ${med(t['amx']!).toFixed(2)} ms (${(macs / med(t['amx']!) / 1e6).toFixed(0)} GMAC/s) ratio ${(med(t['vnni']!) / med(t['amx']!)).toFixed(2)} identical ${same}`);
  prep.dispose();
}
addon.amx?.(false);
