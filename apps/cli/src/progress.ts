import type { CliIo } from './io.js';

/** A running phase of `phase()`. */
export interface Phase {
  /** Ends the phase (idempotent): on a TTY the live line becomes its result; elsewhere a final line when it took ≥ 2 s. */
  done(): void;
}

/** Where `phase` writes: a TTY gets a live line rewritten in place, anything else plain lines. */
export interface ProgressTarget {
  readonly isTTY?: boolean | undefined;
  write(text: string): unknown;
}

/** Options of `phase`. */
export interface PhaseOptions {
  /** The stream (default `process.stderr`). */
  readonly stream?: ProgressTarget;
  /** Seconds before a non-TTY shows anything (default 2). */
  readonly quietS?: number;
  /** Seconds between a non-TTY's "still running" lines (default 10). */
  readonly everyS?: number;
  /** Clock (ms), for tests. */
  readonly now?: () => number;
}

const FRAMES = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/**
 * Feedback for a step that may take seconds (loading weights, measuring executors, staging,
 * quantizing): on a TTY a spinner line with the elapsed seconds, rewritten every 250 ms while the
 * event loop is free and replaced by `✓ label (N s)` at the end (cleared when under 2 s); otherwise
 * (logs, pipes) nothing for the first 2 s, then `label…`, a `label… (N s)` line every 10 s and
 * `label: done in N s` at the end — a quick step prints nothing. Synchronous work between awaits
 * holds the timer, so callers split long work into phases (each starts with its own line on a TTY).
 */
export function phase(io: CliIo, label: string, opts: PhaseOptions = {}): Phase {
  const stream = opts.stream ?? process.stderr;
  const now = opts.now ?? (() => performance.now());
  const quiet = (opts.quietS ?? 2) * 1000;
  const every = (opts.everyS ?? 10) * 1000;
  const t0 = now();
  const secs = (): string => ((now() - t0) / 1000).toFixed(1);
  let ended = false;
  if (stream.isTTY === true) {
    let frame = 0;
    const draw = (): void => {
      stream.write(`\r\x1b[2K${FRAMES[frame++ % FRAMES.length]!} ${label} (${secs()} s)`);
    };
    draw();
    const timer = setInterval(draw, 250);
    timer.unref();
    return {
      done(): void {
        if (ended) return;
        ended = true;
        clearInterval(timer);
        stream.write(now() - t0 >= quiet ? `\r\x1b[2K✓ ${label} (${secs()} s)\n` : '\r\x1b[2K');
      },
    };
  }
  let shown = false;
  let next = quiet;
  const tick = (): void => {
    const dt = now() - t0;
    if (dt < next) return;
    io.err(shown ? `${label}… (${secs()} s)` : `${label}…`);
    shown = true;
    next = dt + every;
  };
  const timer = setInterval(tick, 250);
  timer.unref();
  return {
    done(): void {
      if (ended) return;
      ended = true;
      clearInterval(timer);
      if (shown || now() - t0 >= quiet) io.err(`${label}: done in ${secs()} s`);
    },
  };
}

/** Runs `work` as a `phase` named `label`. */
export async function inPhase<T>(io: CliIo, label: string, work: () => Promise<T>, opts: PhaseOptions = {}): Promise<T> {
  const p = phase(io, label, opts);
  try {
    return await work();
  } finally {
    p.done();
  }
}
