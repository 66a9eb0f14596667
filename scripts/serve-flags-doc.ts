// The flag table of docs/server.md, generated from `stageml serve`'s one flag table
// (apps/cli/src/serve-flags.ts): `pnpm docs:serve-flags` rewrites it, and
// apps/cli/src/serve-flags.test.ts fails when the doc is not current.
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { SERVE_FLAGS, renderServeFlagTable } from '../apps/cli/src/serve-flags.js';
import { replaceBetweenMarkers } from './doc-markers.js';

/** Where the generated table sits in docs/server.md. */
export const BEGIN = '<!-- serve-flags:begin (generated from SERVE_FLAGS by scripts/serve-flags-doc.ts; do not edit) -->';
export const END = '<!-- serve-flags:end -->';
export const DOC = fileURLToPath(new URL('../docs/server.md', import.meta.url));

/** `text` with the generated table between the markers replaced by the current one. */
export function withServeFlagTable(text: string): string {
  return replaceBetweenMarkers(text, BEGIN, END, renderServeFlagTable(), 'docs/server.md');
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  writeFileSync(DOC, withServeFlagTable(readFileSync(DOC, 'utf8')));
  console.log(`wrote the flag table of ${DOC} (${String(SERVE_FLAGS.length)} flags)`);
}
