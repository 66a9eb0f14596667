import type { ConformanceTable } from './case.js';
import { ELEMENTWISE_CASES } from './cases-elementwise.js';
import { STRUCTURED_CASES } from './cases-structured.js';

export type { ConformanceCase, ConformanceTable } from './case.js';

/**
 * Conformance cases for every op of the IR registry (small graphs with representative dtypes,
 * broadcasting, transposes, negative axes and symbolic dims), shared by every executor's tests.
 */
export const CONFORMANCE_CASES: ConformanceTable = { ...ELEMENTWISE_CASES, ...STRUCTURED_CASES };
