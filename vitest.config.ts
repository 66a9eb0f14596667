import { defineConfig } from 'vitest/config';

export default defineConfig({
  resolve: { conditions: ['@stageml/source'] },
  ssr: { resolve: { conditions: ['@stageml/source'] } },
  test: {
    include: ['packages/*/src/**/*.test.ts', 'packages/*/test/**/*.test.ts', 'apps/*/src/**/*.test.ts', 'apps/*/test/**/*.test.ts', 'bench/lib/**/*.test.ts'],
    exclude: ['**/node_modules/**', '**/dist/**', '**/*.gpu.test.ts'],
    setupFiles: ['packages/testkit/src/setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    typecheck: { enabled: true, include: ['packages/*/src/**/*.test-d.ts'], tsconfig: './tsconfig.json' },
  },
});
