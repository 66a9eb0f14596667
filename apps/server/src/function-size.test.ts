import { readFileSync, readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

/** Most lines any function of the server's source may span (issue 35, item 6). */
const MAX_LINES = 120;
const SRC = fileURLToPath(new URL('.', import.meta.url));

/** Every `.ts` source file under `dir`, tests excluded (a test's `describe` callback is not server code). */
function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return sources(p);
    return e.name.endsWith('.ts') && !e.name.endsWith('.test.ts') && e.name !== 'test-support.ts' ? [p] : [];
  });
}

/** `file:line name (N lines)` for every function-like node of `text` longer than `max` lines. */
export function longFunctions(file: string, text: string, max: number): string[] {
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const out: string[] = [];
  const visit = (node: ts.Node): void => {
    if (ts.isFunctionLike(node) && 'body' in node && node.body !== undefined) {
      const start = sf.getLineAndCharacterOfPosition(node.getStart(sf)).line;
      const end = sf.getLineAndCharacterOfPosition(node.getEnd()).line;
      const lines = end - start + 1;
      const name = node.name !== undefined && ts.isIdentifier(node.name) ? node.name.text : '<anonymous>';
      if (lines > max) out.push(`${file}:${String(start + 1)} ${name} (${String(lines)} lines)`);
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return out;
}

describe('apps/server source', () => {
  it(`has no function longer than ${String(MAX_LINES)} lines`, () => {
    const files = sources(SRC);
    expect(files.length).toBeGreaterThan(10);
    const long = files.flatMap((f) => longFunctions(relative(SRC, f), readFileSync(f, 'utf8'), MAX_LINES));
    expect(long).toEqual([]);
  });

  it('finds a long function when there is one', () => {
    const body = Array.from({ length: 130 }, (_, i) => `  const x${String(i)} = ${String(i)};`).join('\n');
    expect(longFunctions('a.ts', `export const f = () => {\n${body}\n};\n`, MAX_LINES)).toEqual(['a.ts:1 <anonymous> (132 lines)']);
    expect(longFunctions('b.ts', `function g() {\n${body}\n}\n`, 200)).toEqual([]);
  });
});
