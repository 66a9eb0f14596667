import { defineConfig } from 'tsup';

// NOTE: `patterns` is a second entry because the residual-pattern recognizer is backend-neutral:
// @stageml/sm90-native reads the same kernel specs (see README, "Pattern recognition").
export default defineConfig({
  entry: ['src/index.ts', 'src/patterns.ts'],
  format: ['esm'],
  dts: true,
  sourcemap: true,
  clean: true,
  target: 'node20',
});
