import { hostTensor } from '@stageml/ir';
import { describe, expect, test } from 'vitest';

describe('toBeAllclose', () => {
  test('passes within tolerance', () => {
    expect(hostTensor('f32', [2], [1, 2])).toBeAllclose(hostTensor('f32', [2], [1, 2.000001]));
  });
  test('fails outside', () => {
    expect(() => { expect(hostTensor('f32', [2], [1, 2])).toBeAllclose(hostTensor('f32', [2], [1, 3])); }).toThrow(/worst at \[1\]/);
  });
});
