import type { Value } from '@stageml/ir';
import { expectTypeOf, test } from 'vitest';
import { type Captures, m, rule } from './index.js';

const p = m.op('add', m.capture('x'), m.oneOf(m.capture('y'), m.op('neg', m.capture('y'), { as: 'n' })), { as: 'root' });
type C = Captures<typeof p, Value>;

test('captures bound on every match are required; those of some alternatives are optional', () => {
  expectTypeOf<C['x']>().toEqualTypeOf<Value>();
  expectTypeOf<C['y']>().toEqualTypeOf<Value>();
  expectTypeOf<C['root']>().toEqualTypeOf<Value>();
  expectTypeOf<C['n']>().toEqualTypeOf<Value | undefined>();
});

test('a rule sees exactly its pattern captures', () => {
  rule({ name: 'add.example', identity: 'x + y', match: p, build: ({ x, n }) => n ?? x });
  // @ts-expect-error: `z` is not a capture of the pattern.
  rule({ name: 'add.example', identity: 'x + y', match: p, build: ({ z }: { z: Value }) => z });
});
