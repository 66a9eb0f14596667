import { fc, test } from '@fast-check/vitest';
import { type HostTensor, hostTensor, seededRandom } from '@stageml/ir';
import { describe, expect, it } from 'vitest';
import { PlanCode, PlanError } from './errors.js';
import {
  type QuantConfig,
  acceptQuantization,
  analyzeQuantization,
  dequantizedAt,
  kindsAfterGate,
  outputErrorBound,
  parseQuantConfig,
  quantizeSymmetric,
  roundHalfEven,
} from './quant.js';

/** Seeded uniform stream (mulberry32, the IR interpreter's), so every run is the same. */
const rng = seededRandom;

function gaussian(r: () => number): number {
  return Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
}

function matrix(r: () => number, rows: number, cols: number, scale: number): HostTensor {
  const d = new Float32Array(rows * cols);
  for (let i = 0; i < d.length; i++) d[i] = gaussian(r) * scale;
  return hostTensor('f32', [rows, cols], d);
}

const CONFIGS: readonly QuantConfig[] = [
  { bits: 8, granularity: 'channel' },
  { bits: 8, granularity: { group: 16 } },
  { bits: 4, granularity: 'channel' },
  { bits: 4, granularity: { group: 16 } },
];
const SHAPES = [
  [16, 32, 2],
  [24, 40, 4],
  [8, 64, 8],
] as const;

const INPUTS = 10_000;

describe('analyzeQuantization', () => {
  for (const cfg of CONFIGS) {
    for (const [out, inDim, rank] of SHAPES) {
      const name = `int${String(cfg.bits)} ${cfg.granularity === 'channel' ? 'per-channel' : `group ${String(cfg.granularity.group)}`} [${String(out)}×${String(inDim)}] r${String(rank)}`;
      test.prop([fc.integer(), fc.double({ min: 0.001, max: 2, noNaN: true })], { numRuns: 1 })(
        `never exceeds its bound on ${String(INPUTS)} random inputs: ${name}`,
        (seed, deltaScale) => {
          const r = rng(seed);
          const weight = matrix(r, out, inDim, 0.05);
          const a = analyzeQuantization(
            {
              weight,
              A: matrix(r, rank, inDim, deltaScale),
              B: matrix(r, out, rank, deltaScale),
              scale: 2 / rank,
            },
            cfg,
          );
          // E = QD(W') − (QD(W) + D), exactly as the two serving paths compute their weights.
          const E = new Float64Array(out * inDim);
          for (let o = 0; o < out; o++) for (let i = 0; i < inDim; i++) E[o * inDim + i] = dequantizedAt(a.merged, o, i) - (dequantizedAt(a.base, o, i) + a.delta[o * inDim + i]!);
          const x = new Float64Array(inDim);
          let worst = 0;
          for (let t = 0; t < INPUTS; t++) {
            const kind = t % 3;
            for (let i = 0; i < inDim; i++) x[i] = kind === 0 ? gaussian(r) : kind === 1 ? (r() < 0.5 ? -1 : 1) : r() < 0.1 ? gaussian(r) * 10 : 0;
            let dy2 = 0;
            let x2 = 0;
            for (let i = 0; i < inDim; i++) x2 += x[i]! * x[i]!;
            for (let o = 0; o < out; o++) {
              let dy = 0;
              for (let i = 0; i < inDim; i++) dy += E[o * inDim + i]! * x[i]!;
              dy2 += dy * dy;
            }
            expect(Math.sqrt(dy2)).toBeLessThanOrEqual(a.gainBound * Math.sqrt(x2));
            expect(Math.sqrt(dy2)).toBeLessThanOrEqual(a.gain * Math.sqrt(x2));
            if (t % 50 === 0) {
              const b = outputErrorBound(a, hostTensor('f64', [1, inDim], x.slice()));
              expect(Math.sqrt(dy2)).toBeLessThanOrEqual(b.bound);
            }
            worst = Math.max(worst, x2 > 0 ? Math.sqrt(dy2 / x2) : 0);
          }
          // The a-posteriori gain bounds every input too, and never exceeds the a-priori one.
          expect(worst).toBeLessThanOrEqual(a.gain);
          expect(a.gain).toBeLessThanOrEqual(a.gainBound);
          expect(a.gain).toBeLessThanOrEqual(a.frobeniusBound * (1 + 1e-12));
        },
      );
    }
  }

  it('bounds the worst input direction too (x aligned with the error’s top row)', () => {
    const r = rng(11);
    const a = analyzeQuantization(
      {
        weight: matrix(r, 16, 32, 0.05),
        A: matrix(r, 4, 32, 0.1),
        B: matrix(r, 16, 4, 0.1),
        scale: 1,
      },
      { bits: 4, granularity: 'channel' },
    );
    const x = new Float64Array(32);
    for (let i = 0; i < 32; i++) x[i] = Math.sign(dequantizedAt(a.merged, 0, i) - dequantizedAt(a.base, 0, i) - a.delta[i]!);
    const b = outputErrorBound(a, hostTensor('f64', [1, 32], x));
    expect(b.bound).toBeLessThanOrEqual(a.gainBound * Math.sqrt(32) * (1 + 1e-12));
    expect(b.relative).toBeGreaterThan(0);
  });
});

describe('quantization helpers', () => {
  it('rounds half to even, as torch.round', () => {
    expect([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4, -2.6].map((v) => roundHalfEven(v) + 0)).toEqual([0, 2, 2, 0, -2, -2, 2, -3]);
  });

  it('quantizes symmetrically within half a step per entry, groups possibly partial', () => {
    const m = [0.9, -0.3, 0.05, 0.7, -1.2, 0.01, 0, 0.4, 0.2, 0.33];
    const q = quantizeSymmetric(m, 2, 5, {
      bits: 4,
      granularity: { group: 2 },
    });
    expect(q.scales).toHaveLength(2 * 3);
    for (let o = 0; o < 2; o++) {
      for (let i = 0; i < 5; i++) {
        const s = q.scales[o * 3 + Math.floor(i / 2)]!;
        expect(Math.abs(q.q[o * 5 + i]!)).toBeLessThanOrEqual(7);
        expect(Math.abs(dequantizedAt(q, o, i) - m[o * 5 + i]!)).toBeLessThanOrEqual(s / 2 + 1e-15);
      }
    }
  });

  it('accepts below the threshold and rejects above it', () => {
    const r = rng(3);
    const input = {
      weight: matrix(r, 16, 32, 0.05),
      A: matrix(r, 4, 32, 0.02),
      B: matrix(r, 16, 4, 0.02),
      scale: 1,
    };
    const a8 = analyzeQuantization(input, { bits: 8, granularity: 'channel' });
    const a4 = analyzeQuantization(input, { bits: 4, granularity: 'channel' });
    expect(a4.relativeWeightBound).toBeGreaterThan(a8.relativeWeightBound);
    const threshold = Math.sqrt(a8.relativeWeightBound * a4.relativeWeightBound);
    expect(acceptQuantization(a8, threshold)).toMatchObject({
      kind: 'accept',
      measure: 'relative-weight',
    });
    expect(acceptQuantization(a4, threshold)).toMatchObject({
      kind: 'reject',
      measure: 'relative-weight',
    });
    const x = matrix(r, 8, 32, 1);
    const d = acceptQuantization(a8, 1, x);
    expect(d).toMatchObject({ kind: 'accept', measure: 'relative-output' });
    expect(d.bound).toBe(outputErrorBound(a8, x).relative);
  });

  it('parses specs and turns a rejection into a plan without materialize', () => {
    expect(parseQuantConfig('int8')).toEqual({ bits: 8, granularity: 'channel' });
    expect(parseQuantConfig('int4:g32')).toEqual({ bits: 4, granularity: { group: 32 } });
    expect(() => parseQuantConfig('fp8')).toThrow(PlanError);
    expect(kindsAfterGate({ kind: 'reject', measure: 'relative-weight', bound: 0.2, threshold: 0.1 })).toEqual(['residual', 'grouped-bank', 'fallback']);
    expect(kindsAfterGate({ kind: 'accept', measure: 'relative-weight', bound: 0.05, threshold: 0.1 })).toHaveLength(4);
  });

  it('rejects invalid configurations with PLAN_BAD_QUANT_CONFIG', () => {
    const r = rng(5);
    const input = {
      weight: matrix(r, 4, 8, 1),
      A: matrix(r, 2, 8, 1),
      B: matrix(r, 4, 2, 1),
      scale: 1,
    };
    const code = (f: () => unknown): string | undefined => {
      try {
        f();
      } catch (e) {
        return e instanceof PlanError ? e.code : 'other';
      }
      return undefined;
    };
    expect(code(() => analyzeQuantization(input, { bits: 3 as 4, granularity: 'channel' }))).toBe(PlanCode.BAD_QUANT_CONFIG);
    expect(code(() => analyzeQuantization(input, { bits: 8, granularity: { group: 0 } }))).toBe(PlanCode.BAD_QUANT_CONFIG);
    expect(code(() => analyzeQuantization({ ...input, A: matrix(r, 2, 7, 1) }, { bits: 8, granularity: 'channel' }))).toBe(PlanCode.BAD_QUANT_CONFIG);
    const a = analyzeQuantization(input, { bits: 8, granularity: 'channel' });
    expect(code(() => acceptQuantization(a, -1))).toBe(PlanCode.BAD_QUANT_CONFIG);
    expect(code(() => outputErrorBound(a, matrix(r, 2, 5, 1)))).toBe(PlanCode.BAD_QUANT_CONFIG);
  });
});
