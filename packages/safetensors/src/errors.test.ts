import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

import { StageError } from '@stageml/ir';
import { describe, expect, it } from 'vitest';

import { SafetensorsCode, SafetensorsError, isSafetensorsError } from './errors.js';

describe('SafetensorsCode', () => {
  it('prefixes every code with ST_ and never reuses one', () => {
    const codes = Object.values(SafetensorsCode);
    expect(codes.every((c) => c.startsWith('ST_'))).toBe(true);
    expect(new Set(codes).size).toBe(codes.length);
  });

  it('lists every code in the README error table', async () => {
    const readme = await readFile(fileURLToPath(new URL('../README.md', import.meta.url)), 'utf8');
    for (const code of Object.values(SafetensorsCode)) expect(readme).toContain(`| \`${code}\` |`);
  });
});

describe('SafetensorsError', () => {
  it('is a StageError carrying code, file, tensor, hint and cause', () => {
    const cause = new RangeError('inner');
    const e = new SafetensorsError(SafetensorsCode.GAP, 'msg', { file: 'f.safetensors', tensor: 'w', hint: 'h', cause });
    expect(e).toBeInstanceOf(StageError);
    expect(e).toMatchObject({ name: 'SafetensorsError', code: 'ST_GAP', file: 'f.safetensors', tensor: 'w', hint: 'h', cause });
    expect(e.message).toBe('f.safetensors: msg');
    expect(isSafetensorsError(e)).toBe(true);
    expect(isSafetensorsError(e, 'ST_GAP')).toBe(true);
    expect(isSafetensorsError(e, 'ST_IO')).toBe(false);
    expect(isSafetensorsError(cause)).toBe(false);
  });
});
