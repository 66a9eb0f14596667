import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { DOC, renderOpTable, withOpTable } from '../../../scripts/op-table.js';
import { OP_KEYS } from './ops/index.js';

describe('docs/ir.md op table', () => {
  it('is the table generated from OPS (run `pnpm docs:ops` after changing an op)', () => {
    const doc = readFileSync(DOC, 'utf8');
    expect(doc).toBe(withOpTable(doc));
  });

  it('lists every op once', () => {
    const rows = renderOpTable().split('\n').slice(2);
    expect(rows.map((r) => /^\| `(\w+)`/.exec(r)?.[1])).toEqual(OP_KEYS);
  });
});
