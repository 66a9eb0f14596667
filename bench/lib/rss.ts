import { readFileSync, writeFileSync } from 'node:fs';

/** This process's resident set now and its high-water mark since start or the last `resetPeakRss`, in bytes (Linux /proc). */
export function processRss(): { readonly rss: number; readonly hwm: number } {
  const status = readFileSync('/proc/self/status', 'utf8');
  const kb = (key: string): number => Number(new RegExp(`${key}:\\s+(\\d+) kB`).exec(status)?.[1] ?? 0) * 1024;
  return { rss: kb('VmRSS'), hwm: kb('VmHWM') };
}

/**
 * Resets the kernel's high-water mark of this process's resident set to its current size
 * (writing 5 to /proc/self/clear_refs, Linux ≥ 4.0), so the next `processRss().hwm` is the peak of
 * what ran since. False where the kernel refuses (the mark then keeps counting from the start).
 */
export function resetPeakRss(): boolean {
  try {
    writeFileSync('/proc/self/clear_refs', '5');
    return true;
  } catch {
    return false;
  }
}
