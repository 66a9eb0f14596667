// A reference server in its own process for the overload and soak suites, so that the load
// generator does not share its event loop. Options come as JSON in STAGEML_BENCH_SERVER; the
// address is printed as one line `listening <url>`. Stops on SIGTERM (or when stdin closes).
import { type ExecutorName, selectExecutor } from '@stageml/runtime';
import { parseRouterConfig } from '@stageml/router';
import { createServer } from '@stageml/server';

interface ChildOptions {
  config?: unknown;
  adminKey?: string;
  adapterRoots?: string[];
  maxBatch?: number;
  maxQueue?: number;
  maxLoras?: number;
  executor?: string;
}
const o = JSON.parse(process.env['STAGEML_BENCH_SERVER'] ?? '{}') as ChildOptions;
const { executor } = await selectExecutor({ force: (o.executor ?? 'auto') as ExecutorName | 'auto' });
const server = await createServer({
  modelDir: 'fixtures/peft-tiny/llama/base',
  modelName: 'llama',
  adaptersDir: 'fixtures/peft-tiny/llama/adapters',
  executor,
  ...(o.config === undefined ? {} : { config: parseRouterConfig(JSON.stringify(o.config)) }),
  ...(o.adminKey === undefined ? {} : { adminKey: o.adminKey }),
  ...(o.adapterRoots === undefined ? {} : { adapterRoots: o.adapterRoots }),
  ...(o.maxBatch === undefined ? {} : { maxBatch: o.maxBatch }),
  ...(o.maxQueue === undefined ? {} : { maxQueue: o.maxQueue }),
  ...(o.maxLoras === undefined ? {} : { maxLoras: o.maxLoras }),
});
const address = await server.listen('127.0.0.1', 0);
process.stdout.write(`listening ${address} executor ${executor.name}\n`);
// STAGEML_BENCH_MEMLOG=<file>: every 5 s one JSON line of memory figures (after a full GC when
// node runs with --expose-gc), for finding what grows in a soak.
const memlog = process.env['STAGEML_BENCH_MEMLOG'];
if (memlog !== undefined) {
  const { appendFileSync } = await import('node:fs');
  const t0 = Date.now();
  setInterval(() => {
    (globalThis as { gc?: () => void }).gc?.();
    const m = process.memoryUsage();
    appendFileSync(memlog, `${JSON.stringify({ t: (Date.now() - t0) / 1000, rss: m.rss, heapUsed: m.heapUsed, heapTotal: m.heapTotal, external: m.external, arrayBuffers: m.arrayBuffers })}\n`);
  }, 5000).unref();
}
const stop = (): void => {
  void server.shutdown().then(() => process.exit(0));
};
process.once('SIGTERM', stop);
process.stdin.on('end', stop);
process.stdin.resume();
