import { StageError } from './stage-error.js';

/**
 * Error classes: the one place that says what kind of failure each coded error is. Every package's
 * `errors.ts` registers its codes here with their class; the CLI's exit codes and the server's HTTP
 * statuses are both derived from this registry, so they cannot disagree.
 */

/**
 * Kind of failure of a coded error:
 * - `input`: the caller supplied something invalid (a file, graph, model, request or option);
 * - `io`: a file or directory could not be read or written;
 * - `unavailable`: a resource or capability is missing or busy right now (a backend, a tool, capacity);
 * - `internal`: a failure of StageML itself (a bug, or a broken invariant).
 */
export type ErrorClass = 'input' | 'io' | 'unavailable' | 'internal';

/** What a class means to the two front ends. */
export interface ErrorClassInfo {
  /** Process exit code of the `stageml` command. */
  readonly exitCode: number;
  /** Default HTTP status of the server. */
  readonly httpStatus: number;
  /** Inclusive range a code of this class may refine its HTTP status within. */
  readonly httpRange: readonly [number, number];
  /** One-line description. */
  readonly summary: string;
}

/** Every error class with its exit code and HTTP status. */
export const ERROR_CLASSES: Readonly<Record<ErrorClass, ErrorClassInfo>> = Object.freeze({
  input: { exitCode: 3, httpStatus: 400, httpRange: [400, 499], summary: 'invalid input: a file, graph, model, request or value was rejected' },
  io: { exitCode: 4, httpStatus: 500, httpRange: [400, 599], summary: 'a file or directory could not be read or written' },
  unavailable: { exitCode: 5, httpStatus: 503, httpRange: [409, 599], summary: 'a resource or capability is missing or busy' },
  internal: { exitCode: 1, httpStatus: 500, httpRange: [500, 599], summary: 'an internal failure (a bug: please report it)' },
});

/** How one code is classified: its class, optionally refining the HTTP status or exit code. */
export interface ErrorCodeSpec {
  /** The class. */
  readonly class: ErrorClass;
  /** A more specific HTTP status inside the class's range (404, 409, 429, …). */
  readonly httpStatus?: number;
  /** A more specific exit code (only usage errors: 2). */
  readonly exitCode?: number;
}

/** A registered code, resolved. */
export interface ErrorCodeInfo {
  /** The code. */
  readonly code: string;
  /** Its class. */
  readonly class: ErrorClass;
  /** Process exit code of the CLI. */
  readonly exitCode: number;
  /** HTTP status of the server. */
  readonly httpStatus: number;
}

// NOTE: keyed on a global symbol, so two copies of this package (an ESM and a CJS build loaded
// together, or two versions) share one registry.
const REGISTRY_KEY = Symbol.for('@stageml/ir.error-codes');
type Registry = Map<string, ErrorCodeInfo>;
function registry(): Registry {
  const g = globalThis as unknown as Record<symbol, Registry | undefined>;
  return (g[REGISTRY_KEY] ??= new Map<string, ErrorCodeInfo>());
}

/** `IR_ERROR_REGISTRY` (declared with the IR's codes): a package registered a code inconsistently. */
class ErrorRegistryError extends StageError<'IR_ERROR_REGISTRY'> {
  constructor(message: string) {
    super('IR_ERROR_REGISTRY', message);
  }
}

/** The class of every code in `codes` (checked at compile time to cover each key). */
export type ErrorClassTable<C extends Readonly<Record<string, string>>> = { readonly [K in keyof C]: ErrorClass | ErrorCodeSpec };

/**
 * Registers a package's error codes with their classes and returns `codes` (frozen), so an
 * `errors.ts` reads `export const XCode = registerErrorCodes({ … }, { … })`. A code registered twice
 * must keep its class and statuses; a status outside its class's range is rejected.
 */
export function registerErrorCodes<const C extends Readonly<Record<string, string>>>(codes: C, classes: ErrorClassTable<C>): C {
  const reg = registry();
  for (const key of Object.keys(codes) as (keyof C & string)[]) {
    const code = codes[key]!;
    const raw = classes[key];
    const spec: ErrorCodeSpec = typeof raw === 'string' ? { class: raw } : raw;
    const cls = ERROR_CLASSES[spec.class];
    const httpStatus = spec.httpStatus ?? cls.httpStatus;
    if (httpStatus < cls.httpRange[0] || httpStatus > cls.httpRange[1]) {
      throw new ErrorRegistryError(`error code ${code}: HTTP ${String(httpStatus)} is outside class '${spec.class}' (${String(cls.httpRange[0])}..${String(cls.httpRange[1])})`);
    }
    const info: ErrorCodeInfo = Object.freeze({ code, class: spec.class, exitCode: spec.exitCode ?? cls.exitCode, httpStatus });
    const prev = reg.get(code);
    if (prev !== undefined && (prev.class !== info.class || prev.httpStatus !== info.httpStatus || prev.exitCode !== info.exitCode)) {
      throw new ErrorRegistryError(`error code ${code} is registered twice with different classes`);
    }
    reg.set(code, info);
  }
  return Object.freeze({ ...codes });
}

/** The registered classification of `code`, or undefined when no package registered it. */
export function errorCodeInfo(code: string): ErrorCodeInfo | undefined {
  return registry().get(code);
}

/** Every registered code (of the packages loaded so far), sorted by code. */
export function registeredErrorCodes(): readonly ErrorCodeInfo[] {
  return [...registry().values()].sort((a, b) => (a.code < b.code ? -1 : a.code > b.code ? 1 : 0));
}

/**
 * Classification of any thrown value: a coded error by its registered code; an unregistered code
 * or a foreign error is `internal`.
 */
export function classifyError(e: unknown): ErrorCodeInfo {
  const code = typeof e === 'object' && e !== null && 'code' in e && typeof e.code === 'string' && e instanceof Error ? e.code : undefined;
  const info = code === undefined ? undefined : errorCodeInfo(code);
  if (info !== undefined) return info;
  const cls = ERROR_CLASSES.internal;
  return { code: code ?? 'INTERNAL', class: 'internal', exitCode: cls.exitCode, httpStatus: cls.httpStatus };
}

/** The message of a thrown value (`Error.message`, else its string form). */
export function errorMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
