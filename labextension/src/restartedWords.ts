/** The words of a rank console's Restart (kept apart from the widgets: tested alone). */

/**
 * What a console's Restart did, short enough for a notice to show whole: its rank alone
 * was replaced, the others kept theirs (and all joined a new process group: the sidebar
 * shows its number).
 */
export function restartedWords(session: string, rank: number, worldSize: number): string {
  const done = `Rank ${rank} of ${session} restarted alone (its variables are gone)`;
  if (worldSize === 2) {
    return `${done}; the other rank kept its own`;
  }
  return worldSize > 2 ? `${done}; the other ${worldSize - 1} ranks kept theirs` : done;
}
