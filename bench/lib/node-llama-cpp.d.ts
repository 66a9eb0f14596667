// The part of node-llama-cpp 3.21.1's API bench/llamacpp.ts uses, declared here: the package is a
// dependency of bench/peers (installed on demand, see peers.ts), not of the repository, so the
// repository's typecheck cannot read its own declarations.
declare module 'node-llama-cpp' {
  /** A token id. */
  export type Token = number & { readonly __token: never };

  export enum LlamaLogLevel {
    disabled = 'disabled',
    fatal = 'fatal',
    error = 'error',
    warn = 'warn',
    info = 'info',
    log = 'log',
    debug = 'debug',
  }

  export interface LlamaContextSequence {
    evaluate(tokens: Token[], options?: { temperature?: number; yieldEogToken?: boolean }): AsyncGenerator<Token, void>;
    evaluateWithoutGeneratingNewTokens(tokens: Token[]): Promise<void>;
    dispose(): void;
  }

  export interface LlamaContext {
    getSequence(): LlamaContextSequence;
    dispose(): Promise<void>;
  }

  export interface LlamaModel {
    createContext(options: {
      contextSize?: number;
      sequences?: number;
      threads?: number;
      batchSize?: number;
      lora?: { adapters: { filePath: string }[] };
    }): Promise<LlamaContext>;
    dispose(): Promise<void>;
  }

  export interface Llama {
    loadModel(options: { modelPath: string }): Promise<LlamaModel>;
  }

  export function getLlama(options?: { gpu?: false; build?: 'never'; maxThreads?: number; logLevel?: LlamaLogLevel }): Promise<Llama>;
}
