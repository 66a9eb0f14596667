import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

/** Most lines `engine.ts` may hold (issue 35, item 6): the engine's parts live in modules of their own. */
const MAX_ENGINE_LINES = 400;

/** Lines of a source text (a final newline ends the last line, it does not start another). */
function lineCount(text: string): number {
  return text.endsWith('\n') ? text.split('\n').length - 1 : text.split('\n').length;
}

describe('engine.ts', () => {
  it(`stays within ${String(MAX_ENGINE_LINES)} lines`, () => {
    const text = readFileSync(new URL('./engine.ts', import.meta.url), 'utf8');
    expect(text).toContain('export class Engine');
    expect(lineCount(text)).toBeLessThanOrEqual(MAX_ENGINE_LINES);
  });

  it('counts lines as an editor does', () => {
    expect(lineCount('a\nb\n')).toBe(2);
    expect(lineCount('a\nb')).toBe(2);
    expect(lineCount('x\n'.repeat(401))).toBeGreaterThan(MAX_ENGINE_LINES);
  });
});
