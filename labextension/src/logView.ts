/**
 * A rank's log in a main-area tab, following it as it grows: it asks the server for the
 * piece after the last one (``/sessions/NAME/ranks/R/log?kind=K&offset=N``) every second
 * while the tab is open, and keeps at most `MAX_CHARS` on screen. A server that fails is
 * asked less and less often (`delayAfterError`); once the session is gone the tab keeps
 * what it showed, says so, and asks no more.
 *
 * Two logs, one at a time: "Output", what the rank's cells showed (printed output,
 * tracebacks, rich output as text), and "Diagnostics", the rank process's own log
 * (C-level output, thread dumps of ``%dist stacks``).
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { delayAfterError } from './pollDelay';
import { ApiError, requestAPI } from './request';

export const MAX_CHARS = 1_000_000;

export type LogKind = 'output' | 'diagnostics';

export const LOG_KINDS: { kind: LogKind; label: string; title: string }[] = [
  {
    kind: 'output',
    label: 'Output',
    title: "What the rank's cells showed: printed output, tracebacks, rich output as text"
  },
  {
    kind: 'diagnostics',
    label: 'Diagnostics',
    title: "The rank process's log: C-level output, thread dumps (%dist stacks), crashes"
  }
];

interface ILogPiece {
  rank: number;
  kind?: LogKind;
  path: string;
  offset: number;
  end: number;
  text: string;
}

export class RankLog extends Widget {
  constructor(
    readonly session: string,
    readonly rank: number,
    private interval = 1000,
    kind: LogKind = 'output'
  ) {
    super();
    this.addClass('jp-DistLog');
    const bar = document.createElement('div');
    bar.className = 'jp-DistLog-kinds';
    bar.setAttribute('role', 'tablist');
    bar.setAttribute('aria-label', `Logs of rank ${rank}`);
    for (const { kind: k, label, title } of LOG_KINDS) {
      const tab = document.createElement('button');
      tab.type = 'button';
      tab.className = 'jp-DistButton jp-DistLog-kind';
      tab.dataset.kind = k;
      tab.textContent = label;
      tab.title = title;
      tab.setAttribute('role', 'tab');
      tab.addEventListener('click', () => this.showKind(k));
      this.tabs.set(k, tab);
      bar.appendChild(tab);
    }
    this.pre = document.createElement('pre');
    this.pre.setAttribute('aria-live', 'polite');
    this.pre.setAttribute('role', 'tabpanel');
    this.endNote = document.createElement('div');
    this.endNote.className = 'jp-DistLog-ended';
    this.endNote.setAttribute('role', 'status');
    this.endNote.hidden = true;
    this.node.append(bar, this.endNote, this.pre);
    this.title.label = `${session} rank ${rank} log`;
    this._kind = kind;
    this.markTabs();
    void this.poll();
  }

  /** The log shown. */
  get kind(): LogKind {
    return this._kind;
  }

  /** Show the other log, from its beginning. */
  showKind(kind: LogKind): void {
    if (kind === this._kind) {
      return;
    }
    this._kind = kind;
    this.offset = 0;
    this.pre.textContent = '';
    this.delay = this.interval;
    this.ended = '';
    this.endNote.hidden = true;
    this.markTabs();
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    this.generation += 1;
    void this.poll();
  }

  dispose(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
    }
    super.dispose();
  }

  private markTabs(): void {
    for (const [k, tab] of this.tabs) {
      tab.setAttribute('aria-selected', String(k === this._kind));
      tab.classList.toggle('jp-mod-active', k === this._kind);
    }
  }

  private async poll(): Promise<void> {
    if (this.isDisposed) {
      return;
    }
    const generation = this.generation;
    let more = false;
    try {
      const piece = await requestAPI<ILogPiece>(
        `sessions/${encodeURIComponent(this.session)}/ranks/${this.rank}/log`,
        {},
        { offset: String(this.offset), kind: this._kind }
      );
      if (generation !== this.generation) {
        return; // the other log was chosen meanwhile
      }
      this.title.caption = piece.path;
      let text = this.pre.textContent ?? '';
      if (piece.offset < this.offset) {
        text += '\n[the rank was started again: its log starts over]\n';
      }
      if (piece.text || text !== (this.pre.textContent ?? '')) {
        const atBottom =
          this.node.scrollTop + this.node.clientHeight >= this.node.scrollHeight - 4;
        text += piece.text;
        this.pre.textContent = text.length > MAX_CHARS ? text.slice(-MAX_CHARS) : text;
        if (atBottom) {
          this.node.scrollTop = this.node.scrollHeight;
        }
      }
      if (!this.pre.textContent) {
        this.pre.dataset.empty =
          this._kind === 'output' ? 'Nothing shown by this rank yet.' : 'Nothing logged yet.';
      }
      more = piece.end > piece.offset && piece.text.length > 0;
      this.offset = piece.end;
      this.removeClass('jp-mod-error');
      this.delay = this.interval;
    } catch (error) {
      if (generation !== this.generation) {
        return;
      }
      this.addClass('jp-mod-error');
      this.title.caption = `${error}`;
      const status = error instanceof ApiError ? error.status : 0;
      const next = delayAfterError(status, this.delay, this.interval);
      if (next === null) {
        // the session is gone: what was shown stays, and nobody asks again
        this.ended = `${error instanceof ApiError ? error.message : error}`;
        this.endNote.textContent =
          `No longer followed: session ${this.session} is gone (shut down, or started ` +
          'again elsewhere); what it showed stays here';
        this.endNote.hidden = false;
        return;
      }
      this.delay = next;
    }
    if (!this.isDisposed) {
      this.timer = setTimeout(() => void this.poll(), more ? 50 : this.delay);
    }
  }

  /** Why the log is no longer followed ("" while it is). */
  get endedBecause(): string {
    return this.ended;
  }

  private pre: HTMLPreElement;
  private endNote: HTMLDivElement;
  private tabs = new Map<LogKind, HTMLButtonElement>();
  private _kind: LogKind;
  private offset = 0;
  private generation = 0;
  private delay = 1000;
  private ended = '';
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
