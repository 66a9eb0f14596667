import { InvalidArgumentError } from 'commander';

/** Parses `1,2,3` into token ids (commander argument parser; bad input is a usage error). */
export function parseIds(value: string): number[] {
  const parts = value.split(',').map((s) => s.trim());
  if (parts.length === 0 || parts.some((p) => !/^\d+$/.test(p))) throw new InvalidArgumentError(`expected comma-separated non-negative integers, got '${value}'`);
  return parts.map(Number);
}

/** Parses a positive integer. */
export function parsePositiveInt(value: string): number {
  if (!/^\d+$/.test(value) || Number(value) < 1 || !Number.isSafeInteger(Number(value))) throw new InvalidArgumentError(`expected a positive integer, got '${value}'`);
  return Number(value);
}

/** Parses a non-negative integer. */
export function parseNonNegativeInt(value: string): number {
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(Number(value))) throw new InvalidArgumentError(`expected a non-negative integer, got '${value}'`);
  return Number(value);
}

/** Parses a finite number. */
export function parseNumber(value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n)) throw new InvalidArgumentError(`expected a number, got '${value}'`);
  return n;
}

/** Parses a comma-separated list of names. */
export function parseNames(value: string): string[] {
  const names = value.split(',').map((s) => s.trim());
  if (names.some((n) => n === '')) throw new InvalidArgumentError(`expected comma-separated names, got '${value}'`);
  return names;
}
