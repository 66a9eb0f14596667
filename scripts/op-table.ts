// The op table of docs/ir.md, generated from the registry: `pnpm docs:ops` rewrites it, and
// packages/ir/src/op-table.test.ts fails when the doc is not current.
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { OPS, OP_KEYS } from '@stageml/ir';
import { replaceBetweenMarkers } from './doc-markers.js';

/** Where the generated table sits in docs/ir.md. */
export const BEGIN = '<!-- op-table:begin (generated from OPS by scripts/op-table.ts; do not edit) -->';
export const END = '<!-- op-table:end -->';
export const DOC = fileURLToPath(new URL('../docs/ir.md', import.meta.url));

const cell = (s: string): string => s.replace(/\|/g, '\\|');

/** The markdown table of every op: key, printed name, operands, attributes, effect, traits, semantics. */
export function renderOpTable(): string {
  const rows = OP_KEYS.map((k) => {
    const d = OPS[k];
    const attrs = Object.keys(d.attrs);
    return `| \`${k}\` | \`${d.name}\` | ${d.operands.join(', ')} | ${attrs.length === 0 ? '—' : attrs.join(', ')} | ${d.effect} | ${d.traits.join(', ') || '—'} | ${cell(d.semantics)} |`;
  });
  return ['| key | printed | operands | attributes | effect | traits | semantics |', '| --- | --- | --- | --- | --- | --- | --- |', ...rows].join('\n');
}

/** `text` with the generated table between the markers replaced by the current one. */
export function withOpTable(text: string): string {
  return replaceBetweenMarkers(text, BEGIN, END, renderOpTable(), 'docs/ir.md');
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  writeFileSync(DOC, withOpTable(readFileSync(DOC, 'utf8')));
  console.log(`wrote the op table of ${DOC} (${String(OP_KEYS.length)} ops)`);
}
