/**
 * A rank's log in a main-area tab, following it as it grows: it asks the server for the
 * piece after the last one (``/sessions/NAME/ranks/R/log?offset=N``) every second while
 * the tab is open, and keeps at most `MAX_CHARS` on screen.
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { requestAPI } from './request';

export const MAX_CHARS = 1_000_000;

interface ILogPiece {
  rank: number;
  path: string;
  offset: number;
  end: number;
  text: string;
}

export class RankLog extends Widget {
  constructor(
    readonly session: string,
    readonly rank: number,
    private interval = 1000
  ) {
    super();
    this.addClass('jp-DistLog');
    this.pre = document.createElement('pre');
    this.pre.setAttribute('aria-live', 'polite');
    this.node.appendChild(this.pre);
    this.title.label = `${session} rank ${rank} log`;
    void this.poll();
  }

  dispose(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
    }
    super.dispose();
  }

  private async poll(): Promise<void> {
    if (this.isDisposed) {
      return;
    }
    let more = false;
    try {
      const piece = await requestAPI<ILogPiece>(
        `sessions/${encodeURIComponent(this.session)}/ranks/${this.rank}/log`,
        {},
        { offset: String(this.offset) }
      );
      this.title.caption = piece.path;
      if (piece.text) {
        const atBottom =
          this.node.scrollTop + this.node.clientHeight >= this.node.scrollHeight - 4;
        const text = (this.pre.textContent ?? '') + piece.text;
        this.pre.textContent = text.length > MAX_CHARS ? text.slice(-MAX_CHARS) : text;
        if (atBottom) {
          this.node.scrollTop = this.node.scrollHeight;
        }
      }
      more = piece.end > this.offset && piece.text.length > 0;
      this.offset = piece.end;
      this.removeClass('jp-mod-error');
    } catch (error) {
      this.addClass('jp-mod-error');
      this.title.caption = `${error}`;
    }
    if (!this.isDisposed) {
      this.timer = setTimeout(() => void this.poll(), more ? 50 : this.interval);
    }
  }

  private pre: HTMLPreElement;
  private offset = 0;
  private timer: ReturnType<typeof setTimeout> | null = null;
}

export function rankLogTab(session: string, rank: number): MainAreaWidget<RankLog> {
  const content = new RankLog(session, rank);
  const widget = new MainAreaWidget({ content });
  widget.id = `jupyter-dist-log-${session}-${rank}`;
  widget.title.label = content.title.label;
  widget.title.closable = true;
  return widget;
}
