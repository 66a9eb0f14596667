// Every file git tracks is free of merge-conflict markers (a merge that left `<<<<<<< HEAD` …
// `>>>>>>> branch` in docs/server.md once shipped).
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, test } from 'vitest';

const root = fileURLToPath(new URL('../../..', import.meta.url));
const OPEN = '<'.repeat(7);
const MID = '='.repeat(7);
const BASE = '|'.repeat(7);
const CLOSE = '>'.repeat(7);

/** Lines (1-based, with text) that are conflict markers: an opening or closing marker, or a separator inside one. */
export function conflictMarkers(text: string): string[] {
  const found: string[] = [];
  let inside = false;
  text.split('\n').forEach((line, i) => {
    const l = line.replace(/\r$/, '');
    const marker = (m: string): boolean => l === m || l.startsWith(`${m} `);
    if (marker(OPEN)) {
      inside = true;
      found.push(`${String(i + 1)}: ${l}`);
    } else if (marker(CLOSE)) {
      inside = false;
      found.push(`${String(i + 1)}: ${l}`);
    } else if (inside && (l === MID || marker(BASE))) found.push(`${String(i + 1)}: ${l}`);
  });
  return found;
}

describe('the repository', () => {
  test('finds conflict markers, and only them', () => {
    expect(conflictMarkers(['a', `${OPEN} HEAD`, 'x', MID, 'y', `${CLOSE} engine`, 'b'].join('\n'))).toEqual([`2: ${OPEN} HEAD`, `4: ${MID}`, `6: ${CLOSE} engine`]);
    // A setext heading's underline or a quoted arrow is no marker.
    expect(conflictMarkers(['Title', MID, `${CLOSE}> quoted`, `a ${OPEN} b`].join('\n'))).toEqual([]);
  });

  test('has no merge-conflict markers in any tracked file', () => {
    const files = execFileSync('git', ['ls-files', '-z'], { cwd: root, encoding: 'utf8', maxBuffer: 64 * 2 ** 20 }).split('\0').filter((f) => f !== '');
    expect(files.length).toBeGreaterThan(100);
    const bad: string[] = [];
    for (const f of files) {
      let buf: Buffer;
      try {
        buf = readFileSync(join(root, f));
      } catch {
        continue; // deleted in the work tree
      }
      if (buf.includes(0)) continue; // binary
      for (const m of conflictMarkers(buf.toString('utf8'))) bad.push(`${f}:${m}`);
    }
    expect(bad).toEqual([]);
  });
});
