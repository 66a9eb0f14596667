import { InvalidArgumentError } from 'commander';

/** Parses `1,2,3` into token ids (commander argument parser; bad input is a usage error). */
export function parseIds(value: string): number[] {
  const parts = value.split(',').map((s) => s.trim());
  if (parts.length === 0 || parts.some((p) => !/^\d+$/.test(p))) throw new InvalidArgumentError(`expected comma-separated non-negative integers, got '${value}'`);
  return parts.map(Number);
}

/** Parses `auto`, `on` or `off` into undefined, true or false (a tri-state flag; anything else is a usage error). */
export function parseAutoOnOff(value: string): boolean | 'auto' {
  if (value === 'auto') return 'auto';
  if (value === 'on' || value === 'off') return value === 'on';
  throw new InvalidArgumentError(`expected auto, on or off, got '${value}'`);
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

/** Parses a TCP port, 0 (any free port) to 65535. */
export function parsePort(value: string): number {
  if (!/^\d{1,5}$/.test(value) || Number(value) > 65535) throw new InvalidArgumentError(`expected a port from 0 to 65535, got '${value}'`);
  return Number(value);
}

/**
 * Parses a listen address: an IPv4 or IPv6 literal or a host name. Dotted digits that are no IPv4
 * address (`999.1.1.1`) are refused here rather than failing a DNS lookup later.
 */
export function parseHost(value: string): string {
  const v4 = /^\d+(\.\d+){3}$/.test(value);
  const ok = v4 ? value.split('.').every((p) => Number(p) <= 255 && (p === '0' || !p.startsWith('0'))) : value.includes(':') ? /^[0-9A-Fa-f:.]+$/.test(value) : /^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/.test(value);
  if (!ok) throw new InvalidArgumentError(`expected an IP address or host name, got '${value}'`);
  return value;
}

/** Parses a positive number of seconds into milliseconds. */
export function parseSeconds(value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n <= 0 || n > 86_400) throw new InvalidArgumentError(`expected seconds between 0 and 86400, got '${value}'`);
  return Math.round(n * 1000);
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
