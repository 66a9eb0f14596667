// `pnpm start [-- ARGS]`: `stageml serve` on the peft-tiny fixture, with ARGS overriding the
// defaults (`pnpm start -- --port 9000`). pnpm passes a literal `--` through; it is dropped, and a
// default is left out whenever ARGS give the same option (or a model of their own).
import { spawn } from 'node:child_process';

const args = process.argv.slice(2).filter((a) => a !== '--');
const given = new Set(args.filter((a) => a.startsWith('--')).map((a) => a.split('=')[0]));
const ownModel = given.has('--model') || (args.length > 0 && !args[0].startsWith('-'));
const defaults = [
  ...(ownModel ? [] : ['fixtures/peft-tiny/llama/base']),
  ...(ownModel || given.has('--served-model-name') ? [] : ['--served-model-name', 'llama']),
  ...(ownModel || given.has('--adapters') ? [] : ['--adapters', 'fixtures/peft-tiny/llama/adapters']),
  ...(given.has('--port') ? [] : ['--port', '8000']),
];
const child = spawn(process.execPath, ['--conditions=@stageml/source', '--import', 'tsx', 'apps/cli/src/bin.ts', 'serve', ...(ownModel ? args : [...defaults, ...args])], { stdio: 'inherit' });
for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => child.kill(signal));
child.on('exit', (code, signal) => {
  process.exitCode = code ?? (signal === null ? 1 : 128);
});
