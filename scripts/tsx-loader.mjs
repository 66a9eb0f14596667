// `node --import ./scripts/tsx-loader.mjs FILE.ts`: registers tsx, resolved from apps/cli (a
// dependency of the CLI) rather than from the root. README command 1 installs only the CLI and what
// it depends on (`--prod --filter @stageml/cli...`), so the root's dev dependencies, tsx among
// them, are absent there; the root scripts (`start`, `stageml`, `demo`) load tsx through this file.
/* global URL */
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

await import(pathToFileURL(createRequire(new URL('../apps/cli/package.json', import.meta.url)).resolve('tsx')).href);
