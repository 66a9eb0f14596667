// How the benchmarks drive llama.cpp (node-llama-cpp): greedy generation, prefill, and timed decode
// of one or more sequences over one or more contexts — shared by bench/llamacpp.ts (llama.cpp in
// the bench's own process) and bench/lib/llamacpp-worker.ts (llama.cpp in a process of its own).
import type { LlamaContext, Token } from 'node-llama-cpp';

/** `steps` greedy tokens after `prompt` on a fresh sequence of `ctx`. */
export async function llamaGreedy(ctx: LlamaContext, prompt: readonly number[], steps: number): Promise<number[]> {
  const seq = ctx.getSequence();
  const out: number[] = [];
  try {
    for await (const t of seq.evaluate([...prompt] as Token[], { temperature: 0, yieldEogToken: true })) {
      out.push(t);
      if (out.length >= steps) break;
    }
  } finally {
    seq.dispose();
  }
  return out;
}

/** What a timed decode measured. */
export interface LlamaDecodeRun {
  /** Tokens of all sequences ÷ the seconds from the first decode step to the last token. */
  readonly tokensPerSecond: number;
  /** Each sequence's greedy tokens. */
  readonly tokens: number[][];
}

/**
 * Decodes `steps` greedy tokens for each prompt, concurrently: prompt k on a sequence of context
 * k mod ctxs.length, after an untimed prefill of all but its last token; the clock runs from the
 * first decode step to the last token of every sequence.
 */
export async function llamaDecodeRun(ctxs: readonly LlamaContext[], ps: readonly (readonly number[])[], steps: number): Promise<LlamaDecodeRun> {
  const seqs = ps.map((_, k) => ctxs[k % ctxs.length]!.getSequence());
  const tokens = ps.map((): number[] => []);
  try {
    await Promise.all(seqs.map((s, k) => s.evaluateWithoutGeneratingNewTokens(ps[k]!.slice(0, -1) as Token[])));
    const t0 = performance.now();
    await Promise.all(
      seqs.map(async (s, k) => {
        for await (const t of s.evaluate([ps[k]![ps[k]!.length - 1]!] as Token[], { temperature: 0, yieldEogToken: true })) {
          if (tokens[k]!.push(t) >= steps) break;
        }
      }),
    );
    return { tokensPerSecond: (ps.length * steps) / ((performance.now() - t0) / 1000), tokens };
  } finally {
    for (const s of seqs) s.dispose();
  }
}

/** Prefill tokens/s of `prompt` on a fresh sequence of `ctx`. */
export async function llamaPrefill(ctx: LlamaContext, prompt: readonly number[]): Promise<number> {
  const seq = ctx.getSequence();
  try {
    const t0 = performance.now();
    await seq.evaluateWithoutGeneratingNewTokens([...prompt] as Token[]);
    return prompt.length / ((performance.now() - t0) / 1000);
  } finally {
    seq.dispose();
  }
}
