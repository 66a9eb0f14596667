// `pnpm bench [suite …]`: runs benchmark suites (bench/<suite>.ts), each writing
// bench/results/<suite>.json and .md. Without arguments every suite runs.
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';

const all = readdirSync('bench').filter((f) => f.endsWith('.ts')).map((f) => f.slice(0, -3)).sort();
// Flags (`--minutes 2`) go to every suite run; the other arguments name suites.
const args = process.argv.slice(2);
const flags = [];
const wanted = [];
for (let i = 0; i < args.length; i++) {
  if (args[i].startsWith('--')) {
    flags.push(args[i]);
    if (i + 1 < args.length && !args[i + 1].startsWith('--') && !all.includes(args[i + 1])) flags.push(args[++i]);
  } else wanted.push(args[i]);
}
const unknown = wanted.filter((s) => !all.includes(s));
if (unknown.length > 0) {
  console.error(`unknown bench suite(s): ${unknown.join(', ')}; known: ${all.join(', ')}`);
  process.exit(2);
}
let failed = 0;
for (const suite of wanted.length > 0 ? wanted : all) {
  console.log(`\n== bench ${suite} ==`);
  const r = spawnSync(process.execPath, ['--conditions=@stageml/source', '--import', 'tsx', `bench/${suite}.ts`, ...flags], { stdio: 'inherit' });
  if (r.status !== 0) failed++;
}
process.exit(failed === 0 ? 0 : 1);
