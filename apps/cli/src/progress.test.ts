import { afterEach, describe, expect, it, vi } from 'vitest';
import { inPhase, phase } from './progress.js';

afterEach(() => {
  vi.useRealTimers();
});

function capture(isTTY: boolean): { io: { out: (l: string) => void; err: (l: string) => void }; lines: string[]; raw: string[]; stream: { isTTY: boolean; write: (t: string) => boolean } } {
  const lines: string[] = [];
  const raw: string[] = [];
  return { io: { out: (l) => lines.push(`out:${l}`), err: (l) => lines.push(l) }, lines, raw, stream: { isTTY, write: (t) => raw.push(t) > 0 } };
}

describe('phase (progress of long steps)', () => {
  it('off a TTY: nothing for a quick step, then plain lines: the label, every 10 s, and the end', () => {
    vi.useFakeTimers();
    const quick = capture(false);
    const p = phase(quick.io, 'loading the model', { stream: quick.stream, now: () => Date.now() });
    vi.advanceTimersByTime(1500);
    p.done();
    expect(quick.lines).toEqual([]);

    const slow = capture(false);
    const q = phase(slow.io, 'loading the model', { stream: slow.stream, now: () => Date.now() });
    vi.advanceTimersByTime(2100);
    expect(slow.lines).toEqual(['loading the model…']);
    vi.advanceTimersByTime(10_000);
    expect(slow.lines[1]).toMatch(/^loading the model… \(12\.\d s\)$/);
    q.done();
    q.done();
    expect(slow.lines.at(-1)).toMatch(/^loading the model: done in 12\.\d s$/);
    expect(slow.lines).toHaveLength(3);
    // Nothing on the TTY channel, nothing on stdout.
    expect(slow.raw).toEqual([]);
    expect(slow.lines.some((l) => l.startsWith('out:'))).toBe(false);
  });

  it('a step whose synchronous work held the timer still reports its time at the end', () => {
    let t = 0;
    const c = capture(false);
    const p = phase(c.io, 'quantizing', { stream: c.stream, now: () => t });
    t = 5000;
    p.done();
    expect(c.lines).toEqual(['quantizing: done in 5.0 s']);
  });

  it('on a TTY: a live spinner line with the seconds, rewritten in place, then ✓ or cleared', async () => {
    vi.useFakeTimers();
    const c = capture(true);
    const done = inPhase(c.io, 'staging', () => new Promise((r) => setTimeout(r, 3000)), { stream: c.stream, now: () => Date.now() });
    await vi.advanceTimersByTimeAsync(3000);
    await done;
    const CLEAR = '\r\u001b[2K';
    expect(c.raw[0]).toBe(`${CLEAR}⠋ staging (0.0 s)`);
    expect(c.raw.length).toBeGreaterThan(10);
    expect(c.raw.at(-1)).toBe(`${CLEAR}✓ staging (3.0 s)\n`);
    expect(c.lines).toEqual([]);
    const q = capture(true);
    phase(q.io, 'quick', { stream: q.stream, now: () => Date.now() }).done();
    expect(q.raw.at(-1)).toBe(CLEAR);
  });
});
