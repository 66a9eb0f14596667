import { analyzeBindingTimes } from '@stageml/annotations';
import { type Graph, type OpKey, type Pass, StageError, typeEquals, typeToString, verifyGraph, errorMessage } from '@stageml/ir';
import { type ResolvedContext, type RewriteContextOptions, resolveContext } from './context.js';
import { RewriteError, RwCode } from './errors.js';
import { matchPattern } from './match.js';
import { materialize } from './passes.js';
import { type Application, RewriteSession } from './session.js';
import { type Rule, type RuleSet, flattenRules } from './rule.js';

/** Options of `rewriteGreedy`. */
export interface RewriteOptions {
  /** Most sweeps over the graph (default 10); a sweep that applies nothing ends the run at a fixpoint. */
  readonly maxIterations?: number;
  /** Most rewrites in one run (default 20 per node plus 1000), a guard against rules that undo each other. */
  readonly maxRewrites?: number;
  /** Verify the input, and the graph after every rewrite (tests set this), naming the rule that broke it. */
  readonly verifyEach?: boolean;
  /** Binding times, sizes, cost model and budget the rules see. */
  readonly context?: RewriteContextOptions;
}

/** One applied rewrite. */
export interface RewriteLogEntry {
  /** Rule name. */
  readonly rule: string;
  /** Name of the value that was replaced (the matched root). */
  readonly node: string;
  /** Text of the matched subgraph, one node per line. */
  readonly before: string;
  /** Text of the nodes the rule added (or `%replacement` when it reused a value). */
  readonly after: string;
  /**
   * The op nodes the pattern matched, ascending, by index in the input graph (a node a rule built
   * earlier in the same run has an index at or past the input's node count): what a consumer maps
   * a replacement back to (`@stageml/kernel-patterns` reports kernels in the input's node indices).
   */
  readonly matched: readonly number[];
  /** Change of the residual's estimated per-request time, in seconds. */
  readonly seconds: number;
  /** Change of the residual's constant-table bytes. */
  readonly constantBytes: number;
}

/** Estimated per-request time and constant-table size of a residual. */
export interface ResidualEstimate {
  /** Seconds per request of the dynamic ops. */
  readonly seconds: number;
  /** Bytes of the static values the residual reads. */
  readonly constantBytes: number;
}

/** What `rewriteGreedy` returns. */
export interface RewriteResult {
  /** The rewritten graph (a new graph; the input is untouched). */
  readonly graph: Graph;
  /** Rewrites applied per rule name (every rule given is listed, zeros included). */
  readonly applied: Readonly<Record<string, number>>;
  /** Why the run stopped: no rule applies anywhere, or a limit was reached. */
  readonly stop: 'fixpoint' | 'iteration-limit';
  /** Sweeps run. */
  readonly iterations: number;
  /** Every applied rewrite, in order. */
  readonly log: readonly RewriteLogEntry[];
  /** The residual's estimate before and after, per the context's cost model. */
  readonly estimate: { readonly before: ResidualEstimate; readonly after: ResidualEstimate };
}

function positiveInt(name: string, v: number): number {
  if (!Number.isSafeInteger(v) || v < 1) throw new RewriteError(RwCode.BAD_OPTION, `${name} must be a positive integer, got ${String(v)}`);
  return v;
}

/**
 * Rewrites `graph` with `rules` to a fixpoint: a worklist driver (MLIR's greedy pattern driver,
 * egg's stop reasons). Each sweep visits every live op, users before operands; a node is tried against the rules whose
 * pattern can root at its op, in the order given, and the first that matches, passes its guard,
 * builds a replacement and passes its cost check replaces it. Nodes a rewrite touches are
 * revisited in the same sweep. A sweep that applies nothing ends the run (`fixpoint`);
 * `maxIterations` sweeps or `maxRewrites` rewrites end it with `iteration-limit`.
 *
 * The result is dead-code free and hash-consed; the input graph is never modified.
 */
export function rewriteGreedy(graph: Graph, rules: readonly (Rule | RuleSet)[], opts: RewriteOptions = {}): RewriteResult {
  const list = flattenRules(rules);
  const maxIterations = positiveInt('maxIterations', opts.maxIterations ?? 10);
  const maxRewrites = positiveInt('maxRewrites', opts.maxRewrites ?? 20 * graph.nodes.length + 1000);
  const verifyEach = opts.verifyEach ?? false;
  if (verifyEach) verifyGraph(graph);
  const ctx = resolveContext(graph, opts.context);
  const session = new RewriteSession(graph, analyzeBindingTimes(graph, ctx.annotations), ctx);
  const wg = session.wg;
  const applied: Record<string, number> = Object.fromEntries(list.map((r) => [r.name, 0]));
  const log: RewriteLogEntry[] = [];
  const byOp = new Map<OpKey, Rule[]>();
  const candidates = (op: OpKey): Rule[] => {
    let rs = byOp.get(op);
    if (rs === undefined) {
      rs = list.filter((r) => r.anchors === undefined || r.anchors.has(op));
      byOp.set(op, rs);
    }
    return rs;
  };

  // A stack: seeded in index order, so nodes are visited users-first (top-down), and nodes a
  // rewrite touches are visited next. Top-down lets a large pattern (a whole LoRA layer) match
  // before its pieces are rewritten or tried on their own.
  const queue: number[] = [];
  const queued = new Set<number>();
  const push = (n: number): void => {
    if (!queued.has(n) && wg.nodes[n]?.kind === 'op') {
      queued.add(n);
      queue.push(n);
    }
  };
  // A node that dies frees its operands: their producers may now match single-use patterns.
  wg.onKill = (n) => {
    for (const o of wg.nodes[n]!.operands) push(wg.nodeOf[o]!);
  };

  let total = 0;
  let iterations = 0;
  let stop: RewriteResult['stop'] = 'iteration-limit';
  sweeps: while (iterations < maxIterations) {
    iterations++;
    queue.length = 0;
    queued.clear();
    wg.nodes.forEach((n, i) => {
      if (n.alive) push(i);
    });
    let sweepApplied = 0;
    while (queue.length > 0) {
      const n = queue.pop()!;
      queued.delete(n);
      const node = wg.nodes[n]!;
      if (!node.alive || node.results.length !== 1) continue;
      for (const r of candidates(node.op)) {
        const app = tryRule(session, r, node.results[0]!);
        if (app === undefined) continue;
        const entry = session.commit(app);
        log.push(entry);
        applied[r.name]!++;
        total++;
        sweepApplied++;
        for (const f of app.fresh) push(f);
        for (const u of wg.users[app.replacement]!) push(u);
        if (verifyEach) verifyAfter(session, r, entry.node);
        break;
      }
      if (total >= maxRewrites) break sweeps;
    }
    if (sweepApplied === 0) {
      stop = 'fixpoint';
      break;
    }
  }
  wg.onKill = undefined;
  const out = materialize(wg);
  let estimate: RewriteResult['estimate'] | undefined;
  return {
    graph: out,
    applied,
    stop,
    iterations,
    log,
    // NOTE: computed on first read: costing every node of a 7B-shaped graph twice is a large part
    // of a rewrite run, and most callers never look.
    get estimate(): RewriteResult['estimate'] {
      estimate ??= { before: residualEstimate(graph, ctx), after: residualEstimate(out, ctx) };
      return estimate;
    },
  };
}

function residualEstimate(g: Graph, ctx: ResolvedContext): ResidualEstimate {
  return new RewriteSession(g, analyzeBindingTimes(g, ctx.annotations), ctx).estimate();
}

function verifyAfter(session: RewriteSession, r: Rule, node: string): void {
  try {
    verifyGraph(materialize(session.wg));
  } catch (e) {
    const code = e instanceof StageError ? `${String(e.code)}: ` : '';
    throw new RewriteError(RwCode.VERIFY_FAILED, `after rule '${r.name}' rewrote %${node}: ${code}${errorMessage(e)}`, { cause: e });
  }
}

function failed(r: Rule, root: string, phase: string, e: unknown): never {
  if (e instanceof RewriteError) throw e;
  throw new RewriteError(RwCode.RULE_FAILED, `rule '${r.name}' threw in ${phase} at %${root}: ${errorMessage(e)}`, { cause: e });
}

/** Matches, guards, builds and cost-checks one rule at one value; undefined when it does not apply. */
function tryRule(session: RewriteSession, r: Rule, v: number): Application | undefined {
  const wg = session.wg;
  const root = wg.displayName(v);
  const match = matchPattern(wg, r.match, v, (mr) => {
    session.watch(mr.nodes);
    if (r.when === undefined) return true;
    try {
      return r.when(session.workCaptures(mr.captures), session.ruleContext);
    } catch (e) {
      return failed(r, root, 'its guard', e);
    }
  });
  if (match === undefined) return undefined;
  // A cost-checked rule is not built again for a match just like one whose rewrite was slower.
  if (r.costGuard !== 'none' && session.slower.hasRule(r.name) && session.slower.has(session.slower.of(r.name, match.captures, match.nodes))) return undefined;
  const b = session.beginBuild(match.captures);
  let out;
  try {
    out = r.build(session.buildCaptures(match.captures), b, session.ruleContext);
  } catch (e) {
    session.endBuild();
    return failed(r, root, 'its builder', e);
  }
  const replacement = out === undefined ? undefined : session.translate(b, out, v, r.name);
  session.endBuild();
  if (replacement === undefined || replacement === v) return undefined;
  if (!typeEquals(wg.types[replacement]!, wg.types[v]!)) {
    throw new RewriteError(RwCode.TYPE_CHANGED, `rule '${r.name}' replaced %${root} : ${typeToString(wg.types[v]!)} by a value of type ${typeToString(wg.types[replacement]!)}`, {
      at: { graph: wg.name, value: root },
    });
  }
  const fresh = wg.deadReachable(replacement);
  if (fresh.some((n) => wg.nodes[n]!.operands.includes(v))) {
    throw new RewriteError(RwCode.BAD_RULE, `rule '${r.name}' built a replacement of %${root} that uses %${root} itself`);
  }
  const delta = session.simulate(v, replacement, fresh, r.costGuard);
  if (delta.seconds > 0 && r.costGuard !== 'none' && session.isLocal(match.captures, match.nodes, fresh)) {
    session.slower.add(r.name, session.slower.of(r.name, match.captures, match.nodes));
  }
  if (!session.accepts(r.costGuard, delta)) return undefined;
  return { rule: r.name, root: v, replacement, fresh, matched: match.nodes, delta };
}

/** `rewriteGreedy` with fixed rules and options, as a pass for the IR's `PassManager`. */
export function rewritePass(rules: readonly (Rule | RuleSet)[], opts: RewriteOptions = {}): Pass {
  return { name: 'rewrite-greedy', run: (g) => rewriteGreedy(g, rules, opts).graph };
}
