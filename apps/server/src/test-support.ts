// Test-only helpers shared by the server's e2e tests (not exported from the package).
import { type Executor, interpreterExecutor } from '@stageml/runtime';

/** Resolves after `ms` milliseconds. */
export const sleep = (ms: number): Promise<void> => new Promise<void>((r) => setTimeout(r, ms));

/**
 * The reference interpreter with a pause of `ms` before every run, so a request (a step) lasts long
 * enough for a test to observe it (scrape metrics, count steps, abandon it mid-generation).
 */
export function slowedInterpreter(ms: number): Executor {
  return {
    name: 'interpreter-slowed',
    capabilities: interpreterExecutor.capabilities,
    dispose: () => interpreterExecutor.dispose(),
    async prepare(g, w) {
      const p = await interpreterExecutor.prepare(g, w);
      return {
        executor: p.executor,
        async run(inputs) {
          await sleep(ms);
          return p.run(inputs);
        },
        dispose: () => {
          p.dispose();
        },
      };
    },
  };
}

/**
 * The reference interpreter made CPU-bound: every run first spins synchronously for `msPerToken`
 * per input token, as a CPU executor computes on the event loop. One long run then freezes the
 * process for its whole length; chunked work leaves gaps.
 */
export function busyInterpreter(msPerToken: number): Executor {
  return {
    name: 'interpreter-busy',
    capabilities: interpreterExecutor.capabilities,
    dispose: () => interpreterExecutor.dispose(),
    async prepare(g, w) {
      const p = await interpreterExecutor.prepare(g, w);
      return {
        executor: p.executor,
        run(inputs, opts) {
          const ids = inputs['input_ids'];
          const until = performance.now() + msPerToken * (ids === undefined ? 1 : ids.shape.reduce((a, d) => a * d, 1));
          while (performance.now() < until) {
            // Spin: the event loop is held, as by a synchronous CPU kernel.
          }
          return p.run(inputs, opts);
        },
        dispose: () => {
          p.dispose();
        },
      };
    },
  };
}
