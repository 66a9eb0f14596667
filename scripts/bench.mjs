// `pnpm bench [suite …]`: runs benchmark suites (bench/<suite>.ts), each writing
// bench/results/<suite>.json and .md. Without arguments every suite runs.
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';

const all = readdirSync('bench').filter((f) => f.endsWith('.ts')).map((f) => f.slice(0, -3)).sort();
const wanted = process.argv.slice(2);
const unknown = wanted.filter((s) => !all.includes(s));
if (unknown.length > 0) {
  console.error(`unknown bench suite(s): ${unknown.join(', ')}; known: ${all.join(', ')}`);
  process.exit(2);
}
let failed = 0;
for (const suite of wanted.length > 0 ? wanted : all) {
  console.log(`\n== bench ${suite} ==`);
  const r = spawnSync(process.execPath, ['--conditions=@stageml/source', '--import', 'tsx', `bench/${suite}.ts`], { stdio: 'inherit' });
  if (r.status !== 0) failed++;
}
process.exit(failed === 0 ? 0 : 1);
