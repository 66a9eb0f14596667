import type { DType } from '@stageml/ir';

import { type ConformanceCase, type OperandSpec, conformanceCase as c, t, widened } from './case.js';

const NAN = Number.NaN;
const POS: readonly [number, number] = [0.1, 3];

/** Cases of a broadcasting binary op over several dtypes and shapes. */
function binaryCases(key: 'add' | 'sub' | 'mul' | 'div' | 'pow' | 'maximum' | 'minimum', ints: boolean): ConformanceCase[] {
  const base = key === 'pow' ? POS : undefined;
  const f = (dtype: DType, s1: readonly (number | string)[], s2: readonly (number | string)[], o1: Partial<OperandSpec> = {}, o2: Partial<OperandSpec> = {}): ConformanceCase =>
    c(`${key} ${dtype}[${s1.join(',')}] ${dtype}[${s2.join(',')}]`, [t(dtype, s1, { ...(base ? { range: base } : {}), ...o1 }), t(dtype, s2, o2)], (b, [x, y]) =>
      widened(b, b.op(key, [x!, y!])),
    );
  const cases = [
    f('f32', [2, 3], [3]),
    f('f32', [2, 1, 3], [4, 1]),
    f('f32', ['n', 3], [1, 3], { dims: [4, 3] }),
    f('f64', [3], [3]),
    f('f16', [2, 2], [1]),
    f('bf16', [4], [4]),
  ];
  if (ints) {
    cases.push(f('i32', [4], [4]), f('i64', [2, 2], [2]));
    // i8/u8 arithmetic wraps like the interpreter's rounding.
    cases.push(f('i8', [6], [6], { range: [-120, 120] }, { range: [-120, 120] }), f('u8', [6], [1], { range: [0, 255] }, { range: [0, 255] }));
  }
  return cases;
}

function unaryCases(key: 'neg' | 'abs' | 'exp' | 'log' | 'sqrt' | 'rsqrt' | 'tanh' | 'sigmoid' | 'silu' | 'sin' | 'cos', range?: readonly [number, number]): ConformanceCase[] {
  const f = (dtype: DType, shape: readonly (number | string)[], o: Partial<OperandSpec> = {}): ConformanceCase =>
    c(`${key} ${dtype}[${shape.join(',')}]`, [t(dtype, shape, { ...(range ? { range } : {}), ...o })], (b, [x]) => widened(b, b.op(key, [x!])));
  return [f('f32', [2, 3]), f('f32', ['n'], { dims: [5] }), f('f64', [3]), f('f16', [4]), f('bf16', [4])];
}

function compareCases(key: 'equal' | 'notEqual' | 'less' | 'lessEqual' | 'greater' | 'greaterEqual'): ConformanceCase[] {
  return [
    c(`${key} f32 ties and NaN`, [t('f32', [2, 4], { values: [1, 2, NAN, 0, -1, 2, 3, 0] }), t('f32', [4], { values: [1, 3, NAN, -0] })], (b, [x, y]) =>
      b.op(key, [x!, y!]),
    ),
    c(`${key} i32 broadcast`, [t('i32', [3, 1], { range: [-2, 2] }), t('i32', [4], { range: [-2, 2] })], (b, [x, y]) => b.op(key, [x!, y!])),
    c(`${key} bool`, [t('bool', [4], { values: [0, 1, 0, 1] }), t('bool', [4], { values: [0, 0, 1, 1] })], (b, [x, y]) => b.op(key, [x!, y!])),
  ];
}

const CAST_SOURCE = [2.7, -2.7, 0, -0.5, 300.5, -200.25, 65519, 1e-8, 0.1, NAN, 70000, -3];

/** Cases of the constant-like, element-wise and cast ops. */
export const ELEMENTWISE_CASES = {
  constant: [
    c('constant f32 [2,3]', [], (b) => b.constant([1, 2, 3, 4, 5, 6.5], 'f32', [2, 3])),
    c('constant f16 splat (rounded)', [], (b) => widened(b, b.constant(0.1, 'f16', [2, 2]))),
    c('constant i8 wraps', [t('i8', [3])], (b, [x]) => b.add(x!, b.constant([1, -2, 200], 'i8', [3]))),
    c('constant bool', [], (b) => b.constant([0, 2, 1], 'bool', [3])),
  ],
  iota: [
    c('iota i64 axis 1', [], (b) => b.iota([3, 4], 1, 'i64')),
    c('iota f32 symbolic', [t('f32', ['n', 3], { dims: [4, 3] })], (b, [x]) => b.add(x!, b.iota(['n', 3], 0, 'f32'))),
    c('iota u8 wraps past 255', [], (b) => widened(b, b.iota([300], 0, 'u8'))),
    c('iota f16 rounds past 2048', [], (b) => widened(b, b.iota([2, 2100], -1, 'f16'))),
  ],
  randomUniform: [
    c('randomUniform f32 symbolic', [t('f32', ['n'], { dims: [64] })], (b, [x]) => b.op('randomUniform', [], { shape: [3, x!.type.shape[0]!] }), {
      compare: 'range',
    }),
    c('randomUniform f16', [], (b) => b.op('randomUniform', [], { shape: [8, 8], dtype: 'f16' }), { compare: 'range' }),
  ],
  add: binaryCases('add', true),
  sub: binaryCases('sub', true),
  mul: binaryCases('mul', true),
  div: binaryCases('div', false),
  pow: binaryCases('pow', false),
  maximum: [
    ...binaryCases('maximum', true),
    c('maximum NaN either side', [t('f32', [4], { values: [1, NAN, 3, 2] }), t('f32', [4], { values: [2, 2, NAN, NAN] })], (b, [x, y]) => b.maximum(x!, y!)),
  ],
  minimum: [
    ...binaryCases('minimum', true),
    c('minimum NaN either side', [t('f32', [4], { values: [1, NAN, 3, 2] }), t('f32', [4], { values: [2, 2, NAN, NAN] })], (b, [x, y]) => b.minimum(x!, y!)),
  ],
  neg: [...unaryCases('neg'), c('neg i8 -128 wraps', [t('i8', [4], { values: [-128, 127, 0, -5] })], (b, [x]) => widened(b, b.neg(x!))), c('neg i64', [t('i64', [3])], (b, [x]) => b.neg(x!))],
  abs: [...unaryCases('abs'), c('abs i8 -128 wraps', [t('i8', [3], { values: [-128, -7, 9] })], (b, [x]) => widened(b, b.abs(x!))), c('abs i32', [t('i32', [3])], (b, [x]) => b.abs(x!))],
  exp: unaryCases('exp', [-4, 4]),
  log: unaryCases('log', POS),
  sqrt: unaryCases('sqrt', POS),
  rsqrt: unaryCases('rsqrt', POS),
  tanh: unaryCases('tanh', [-3, 3]),
  sigmoid: unaryCases('sigmoid', [-6, 6]),
  silu: unaryCases('silu', [-6, 6]),
  gelu: [
    // tfjs's erf is Abramowitz–Stegun 7.1.26 (|error| ≤ 1.5e-7) and wasm's is f32: within atol 1e-6 for |x| ≤ 3.
    c('gelu exact f32', [t('f32', [4, 5], { range: [-3, 3] })], (b, [x]) => b.gelu(x!, 'none')),
    c('gelu tanh f32', [t('f32', [4, 5], { range: [-3, 3] })], (b, [x]) => b.gelu(x!, 'tanh')),
    c('gelu exact bf16', [t('bf16', [8])], (b, [x]) => widened(b, b.gelu(x!, 'none'))),
  ],
  sin: unaryCases('sin', [-4, 4]),
  cos: unaryCases('cos', [-4, 4]),
  equal: compareCases('equal'),
  notEqual: compareCases('notEqual'),
  less: compareCases('less'),
  lessEqual: compareCases('lessEqual'),
  greater: compareCases('greater'),
  greaterEqual: compareCases('greaterEqual'),
  where: [
    c('where f32 broadcast', [t('bool', [2, 3]), t('f32', [3]), t('f32', [2, 1])], (b, [k, x, y]) => b.where(k!, x!, y!)),
    c('where bool values', [t('bool', [4]), t('bool', [4]), t('bool', [1], { values: [0] })], (b, [k, x, y]) => b.where(k!, x!, y!)),
    c('where i32 symbolic', [t('bool', ['n'], { dims: [5] }), t('i32', ['n'], { dims: [5] }), t('i32', [])], (b, [k, x, y]) => b.where(k!, x!, y!)),
  ],
  cast: [
    ...(['i32', 'i64', 'i8', 'u8', 'bool', 'f16', 'bf16', 'f64'] as const).map((to) =>
      c(`cast f32 → ${to}`, [t('f32', [12], { values: CAST_SOURCE })], (b, [x]) => b.cast(x!, to)),
    ),
    c('cast f32 → f16 → f32', [t('f32', [12], { values: CAST_SOURCE })], (b, [x]) => b.cast(b.cast(x!, 'f16'), 'f32')),
    c('cast f32 → bf16 → f32', [t('f32', [3, 4])], (b, [x]) => b.cast(b.cast(x!, 'bf16'), 'f32')),
    c('cast i32 → f32', [t('i32', [4], { values: [16777217, -3, 0, 7] })], (b, [x]) => b.cast(x!, 'f32')),
    c('cast i64 → i8', [t('i64', [4], { values: [200, -129, 5, 1000] })], (b, [x]) => b.cast(x!, 'i8')),
    c('cast u8 → i8', [t('u8', [3], { values: [255, 128, 3] })], (b, [x]) => b.cast(x!, 'i8')),
    c('cast bool → f32', [t('bool', [3])], (b, [x]) => b.cast(x!, 'f32')),
    c('cast i32 → bool', [t('i32', [4], { values: [0, 2, -1, 0] })], (b, [x]) => b.cast(x!, 'bool')),
    c('cast f16 → f32', [t('f16', [4])], (b, [x]) => b.cast(x!, 'f32')),
  ],
} as const;
