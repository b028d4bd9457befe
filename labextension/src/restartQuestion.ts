/** The words of a rank console's Restart (kept apart from the widgets: tested alone). */

/** What the console's Restart asks: the whole session restarts, not one rank. */
export function restartQuestion(session: string, rank: number, worldSize: number): string {
  const ranks = worldSize ? `all ${worldSize} ranks` : 'all its ranks';
  return (
    `This console runs on rank ${rank} of session ${session}. A rank cannot restart ` +
    `alone: its process group is the session's. Restarting restarts ${ranks} of ` +
    `${session}, and the variables in every rank are lost; a cell running on it stops. ` +
    'The console then runs on the new rank.'
  );
}
