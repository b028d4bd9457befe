/**
 * A redraw that replaces the controls under a pressed pointer loses the click: the
 * browser fires `click` only where both the press and the release landed, and after a
 * redraw they land on two different buttons. PressHold keeps such a redraw back until
 * the pointer is released (and the click has been delivered), for at most MAX_HOLD_MS,
 * so a release the page never sees cannot freeze the view.
 */
export const MAX_HOLD_MS = 2000;

export class PressHold {
  /**
   * @param area where a press holds redraws (the list of sessions)
   * @param releases where a release is heard (the document: it may end outside `area`)
   * @param redraw what to run once a held redraw may go
   * @param now the clock, in ms
   */
  constructor(
    private readonly area: EventTarget,
    private readonly releases: EventTarget,
    private readonly redraw: () => void,
    private readonly now: () => number = Date.now
  ) {
    area.addEventListener('pointerdown', this.onPress);
    releases.addEventListener('pointerup', this.onRelease, true);
    releases.addEventListener('pointercancel', this.onRelease, true);
  }

  /** Whether a redraw asked for now must wait; a waiting one runs on release. */
  hold(): boolean {
    if (this.pressedAt === null) {
      return false;
    }
    if (this.now() - this.pressedAt >= MAX_HOLD_MS) {
      this.pressedAt = null;
      return false;
    }
    this.held = true;
    return true;
  }

  dispose(): void {
    this.area.removeEventListener('pointerdown', this.onPress);
    this.releases.removeEventListener('pointerup', this.onRelease, true);
    this.releases.removeEventListener('pointercancel', this.onRelease, true);
    this.pressedAt = null;
    this.held = false;
  }

  private readonly onPress = (): void => {
    this.pressedAt = this.now();
  };

  private readonly onRelease = (): void => {
    if (this.pressedAt === null) {
      return;
    }
    this.pressedAt = null;
    if (this.held) {
      this.held = false;
      // after this release's click has reached the button it was pressed on
      setTimeout(this.redraw, 0);
    }
  };

  private pressedAt: number | null = null;
  private held = false;
}
