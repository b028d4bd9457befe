/** When a log tab asks the server again, after a failed ask (kept apart: tested alone). */

/** The longest wait between two asks of a server that does not answer. */
export const MAX_DELAY_MS = 30_000;

/**
 * The wait before the next ask after one failed with HTTP ``status`` (0: no answer), when
 * the last wait was ``lastMs`` and the normal one is ``intervalMs``; null: ask no more
 * (404: the session is gone, and its log with it).
 */
export function delayAfterError(status: number, lastMs: number, intervalMs: number): number | null {
  if (status === 404) {
    return null;
  }
  return Math.min(MAX_DELAY_MS, Math.max(intervalMs, lastMs * 2));
}
