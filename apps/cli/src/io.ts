/** Where the CLI writes; tests capture it. */
export interface CliIo {
  readonly out: (line: string) => void;
  readonly err: (line: string) => void;
}
