/**
 * The sidebar panel: every session of the server, its nodes and ranks, live from the
 * event stream while the panel is visible, with the actions a person needs (new session,
 * use in this notebook, stacks, interrupt, restart, shut down, a rank's log).
 */
import { Widget } from '@lumino/widgets';
import { Message } from '@lumino/messaging';

import { EventStream } from './events';
import { PressHold } from './pressHold';
import {
  IMetrics,
  IRank,
  ISession,
  SessionsModel,
  foldRanks,
  formatDuration,
  formatMiB,
  lateRanks,
  launcherOf,
  nodesOf,
  rankState,
  ranksLabel,
  sessionBadge
} from './model';

/** What the panel's buttons do (given by the plugin, which has the app). */
export interface IActions {
  newSession(): void;
  useInNotebook(session: string): void;
  stacks(session: string): void;
  interrupt(session: string): void;
  restart(session: string): void;
  heal(session: string): void;
  shutdown(session: string): void;
  openLog(session: string, rank: number): void;
  openConsole(session: string, rank: number): void;
}

function button(label: string, title: string, onClick: () => void, cls = ''): HTMLButtonElement {
  const element = document.createElement('button');
  element.type = 'button';
  element.className = `jp-DistButton ${cls}`.trim();
  element.textContent = label;
  element.title = title;
  element.setAttribute('aria-label', title);
  element.addEventListener('click', event => {
    event.stopPropagation();
    onClick();
  });
  return element;
}

/** A small horizontal bar: ``fraction`` of it filled, with a label read by screen readers. */
function bar(fraction: number, label: string, cls = ''): HTMLElement {
  const outer = document.createElement('span');
  outer.className = `jp-DistBar ${cls}`.trim();
  outer.setAttribute('role', 'meter');
  outer.setAttribute('aria-valuemin', '0');
  outer.setAttribute('aria-valuemax', '100');
  const percent = Math.max(0, Math.min(100, fraction * 100));
  outer.setAttribute('aria-valuenow', percent.toFixed(0));
  outer.setAttribute('aria-label', label);
  outer.title = label;
  const inner = document.createElement('span');
  inner.className = 'jp-DistBar-fill';
  inner.style.width = `${percent}%`;
  outer.appendChild(inner);
  return outer;
}

function span(text: string, cls: string, title = ''): HTMLSpanElement {
  const element = document.createElement('span');
  element.className = cls;
  element.textContent = text;
  if (title) {
    element.title = title;
  }
  return element;
}

export class DistPanel extends Widget {
  constructor(
    readonly model: SessionsModel,
    private actions: IActions,
    private tickMs = 1000
  ) {
    super();
    this.id = 'jupyter-dist-sidebar';
    this.addClass('jp-DistPanel');
    this.title.caption = 'Distributed sessions';
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'Distributed sessions');

    const header = document.createElement('div');
    header.className = 'jp-DistPanel-header';
    header.append(
      span('Distributed sessions', 'jp-DistPanel-title'),
      button('New session', 'Start a new session', () => this.actions.newSession(), 'jp-mod-accept')
    );
    this.status = span('', 'jp-DistPanel-connection');
    this.status.setAttribute('role', 'status');
    this.list = document.createElement('div');
    this.list.className = 'jp-DistPanel-sessions';
    this.list.setAttribute('role', 'tree');
    this.node.append(header, this.status, this.list);
    this.press = new PressHold(this.list, document, () => this.scheduleRender());

    this.stream = new EventStream(
      (kind, data) => this.model.apply(kind, data),
      (connected, error) => this.setConnection(connected, error)
    );
    this.model.changed.connect(() => {
      this.syncMetrics();
      this.scheduleRender();
    });
  }

  /** Which sessions are opened into their nodes and ranks. */
  readonly expanded = new Set<string>();
  /** Sessions whose idle ranks are shown one by one, not folded. */
  readonly unfolded = new Set<string>();
  /** Which samples to show: node CPU, node memory, GPUs, each rank's CPU and memory. */
  shown = new Set<string>(['cpu', 'memory', 'gpu', 'ranks']);
  /** The latest sample of each opened session. */
  readonly metrics = new Map<string, IMetrics>();

  set tick(ms: number) {
    this.tickMs = Math.max(250, ms);
    if (this.timer !== null) {
      this.stopTicking();
      this.startTicking();
    }
  }

  dispose(): void {
    this.press.dispose();
    this.stream.stop();
    this.stopMetrics();
    this.stopTicking();
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    this.stream.start();
    this.startTicking();
    this.syncMetrics();
    this.render();
  }

  protected onAfterHide(msg: Message): void {
    this.stream.stop(); // nothing streams while nobody looks
    this.stopMetrics();
    this.stopTicking();
  }

  /** A metrics stream for each opened session that exists, none for the others. */
  private syncMetrics(): void {
    const wanted = new Set(
      [...this.expanded].filter(name => this.model.get(name)?.state === 'ready')
    );
    for (const [name, stream] of this.metricStreams) {
      if (!wanted.has(name) || !this.isVisible) {
        stream.stop();
        this.metricStreams.delete(name);
        this.metrics.delete(name);
      }
    }
    if (!this.isVisible) {
      return;
    }
    for (const name of wanted) {
      if (!this.metricStreams.has(name)) {
        const stream = new EventStream(
          (kind, data) => {
            if (kind === 'metrics') {
              this.metrics.set(name, data as IMetrics);
              this.scheduleRender();
            }
          },
          () => undefined,
          `sessions/${encodeURIComponent(name)}/metrics`,
          { interval: String(this.tickMs / 1000) }
        );
        this.metricStreams.set(name, stream);
        stream.start();
      }
    }
  }

  private stopMetrics(): void {
    for (const stream of this.metricStreams.values()) {
      stream.stop();
    }
    this.metricStreams.clear();
  }

  protected onAfterAttach(msg: Message): void {
    if (this.isVisible) {
      this.onAfterShow(msg);
    }
  }

  protected onBeforeDetach(msg: Message): void {
    this.onAfterHide(msg);
  }

  get listening(): boolean {
    return this.stream.running;
  }

  private startTicking(): void {
    if (this.timer === null) {
      this.timer = setInterval(() => this.scheduleRender(), this.tickMs);
    }
  }

  private stopTicking(): void {
    if (this.timer !== null) {
      clearInterval(this.timer);
      this.timer = null;
    }
  }

  private setConnection(connected: boolean, error: string): void {
    this.status.textContent = connected ? '' : `Reconnecting: ${error}`;
    this.toggleClass('jp-mod-disconnected', !connected);
  }

  private scheduleRender(): void {
    if (this.pending) {
      return;
    }
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      if (!this.press.hold()) {
        this.render(); // else drawn once the pressed button has had its click
      }
    });
  }

  /** Draw every session; keeps the keyboard focus on the same control. */
  render(): void {
    const focused = (document.activeElement as HTMLElement | null)?.dataset?.distKey;
    const now = Date.now() / 1000;
    const sessions = this.model.sessions;
    this.list.replaceChildren(...sessions.map(s => this.sessionNode(s, now)));
    if (!sessions.length) {
      const empty = document.createElement('p');
      empty.className = 'jp-DistPanel-empty';
      empty.textContent =
        'No sessions. Run a %%distributed cell, or start one with "New session".';
      this.list.appendChild(empty);
    }
    if (focused) {
      const again = this.list.querySelector<HTMLElement>(`[data-dist-key="${focused}"]`);
      again?.focus();
    }
  }

  private sessionNode(session: ISession, now: number): HTMLElement {
    const open = this.expanded.has(session.name);
    const badge = sessionBadge(session, now);
    const card = document.createElement('div');
    card.className = `jp-DistSession jp-mod-${badge.state}`;
    card.setAttribute('role', 'treeitem');
    card.setAttribute('aria-expanded', String(open));
    card.dataset.session = session.name;

    const head = document.createElement('div');
    head.className = 'jp-DistSession-head';
    const toggle = button(
      open ? '▾' : '▸',
      `${open ? 'Fold' : 'Open'} session ${session.name}`,
      () => {
        if (open) {
          this.expanded.delete(session.name);
        } else {
          this.expanded.add(session.name);
        }
        this.syncMetrics();
        this.render();
      },
      'jp-DistToggle'
    );
    toggle.dataset.distKey = `toggle:${session.name}`;
    const nodes = session.nodes.length || 1;
    const perNode = Math.max(1, Math.round(session.world_size / nodes));
    const uptime = session.started_at ? formatDuration(now - session.started_at) : '';
    head.append(
      toggle,
      span(session.name, 'jp-DistSession-name'),
      span(badge.label, `jp-DistBadge jp-DistSession-state jp-mod-${badge.state}`, badge.title)
    );
    const facts = document.createElement('div');
    facts.className = 'jp-DistSession-facts';
    facts.textContent = [
      session.notebook ?? '',
      launcherOf(session),
      `${nodes} × ${perNode} ${session.device === 'cuda' ? 'GPU' : 'CPU'}`,
      session.backend,
      uptime ? `up ${uptime}` : '',
      `${session.cells_run} cells`,
      session.generation ? `group ${session.generation}` : ''
    ]
      .filter(Boolean)
      .join(' · ');
    const notebooks = (session.notebooks ?? []).map(n => n.path || n.kernel_id.slice(0, 8));
    const running = session.running;
    const activity = document.createElement('div');
    activity.className = 'jp-DistSession-activity';
    // a session that starts is not the server's yet: no button would find it
    const starting = session.state === 'starting';
    if (starting) {
      activity.textContent = this.model.progressOf(session.name) || 'starting';
    } else if (running) {
      const since = running.started ? ` (${formatDuration(now - running.started)})` : '';
      activity.textContent = `running a ${running.kind} from ${running.path || 'a notebook'}${since}`;
      const waiting = session.queue?.length ?? 0;
      if (waiting) {
        activity.textContent += `; ${waiting} waiting`;
      }
    } else if (notebooks.length) {
      activity.textContent = `used by ${notebooks.join(', ')}`;
    }

    const actions = document.createElement('div');
    actions.className = 'jp-DistSession-actions';
    const name = session.name;
    const act = (label: string, title: string, fn: () => void, cls = '') => {
      const b = button(label, title, fn, cls);
      b.dataset.distKey = `${label}:${name}`;
      return b;
    };
    actions.append(
      act('Use here', `Use session ${name} in the current notebook`, () =>
        this.actions.useInNotebook(name)
      ),
      act('Stacks', `Where every rank of ${name} is now`, () => this.actions.stacks(name)),
      act('Interrupt', `Interrupt the running cell of ${name}`, () => this.actions.interrupt(name)),
      ...(session.state === 'degraded' || session.state === 'broken'
        ? [
            act(
              'Heal',
              `Replace the lost ranks of ${name}; the others keep their variables`,
              () => this.actions.heal(name)
            )
          ]
        : []),
      act('Restart', `Restart the ranks of ${name}`, () => this.actions.restart(name)),
      act('Shut down', `Shut session ${name} down`, () => this.actions.shutdown(name), 'jp-mod-warn')
    );
    card.append(head, facts);
    if (activity.textContent) {
      card.append(activity);
    }
    if (session.faults?.length) {
      card.append(span(session.faults.join('; '), 'jp-DistSession-error'));
    } else if (session.broken_reason) {
      card.append(span(session.broken_reason, 'jp-DistSession-error'));
    } else if (badge.state === 'stuck') {
      card.append(span(badge.title, 'jp-DistSession-error jp-mod-stuck'));
    }
    if (!starting) {
      card.append(actions);
    }
    if (open) {
      card.append(this.nodesNode(session, now, new Set(badge.stuck)));
    }
    return card;
  }

  private nodesNode(session: ISession, now: number, stuck: Set<number>): HTMLElement {
    const late = new Set(lateRanks(session, now));
    const group = document.createElement('div');
    group.className = 'jp-DistNodes';
    group.setAttribute('role', 'group');
    const sample = this.metrics.get(session.name);
    for (const { node, ranks } of nodesOf(session)) {
      const box = document.createElement('div');
      box.className = 'jp-DistNode';
      box.setAttribute('role', 'treeitem');
      const gpus = node.gpus.length
        ? `${node.gpus.length} GPU${node.gpus.length > 1 ? 's' : ''}`
        : `${ranks.length} CPU rank${ranks.length > 1 ? 's' : ''}`;
      box.append(
        span(`node ${node.node_rank}: ${node.host}`, 'jp-DistNode-host'),
        span(` · ${gpus}${node.lost ? ' · lost' : ''}`, 'jp-DistNode-facts')
      );
      const measured = sample?.nodes.find(n => n.node_rank === node.node_rank);
      if (measured) {
        box.appendChild(this.nodeMetrics(measured));
      }
      const table = document.createElement('div');
      table.className = 'jp-DistRanks';
      table.setAttribute('role', 'group');
      const rows = this.unfolded.has(session.name)
        ? ranks.map(r => ({ ranks: [r], folded: false }))
        : foldRanks(ranks);
      for (const row of rows) {
        table.appendChild(
          this.rankRow(session, row.ranks, row.folded, { late, stuck }, now, sample)
        );
      }
      box.appendChild(table);
      group.appendChild(box);
    }
    return group;
  }

  private rankRow(
    session: ISession,
    ranks: IRank[],
    folded: boolean,
    marks: { late: Set<number>; stuck: Set<number> },
    now: number,
    sample?: IMetrics
  ): HTMLElement {
    const first = ranks[0];
    const state = !folded && marks.stuck.has(first.rank) ? 'stuck' : rankState(first);
    const row = document.createElement('div');
    const isLate = !folded && marks.late.has(first.rank) && state !== 'stuck';
    row.className = `jp-DistRank jp-mod-${state}${isLate ? ' jp-mod-late' : ''}`;
    row.setAttribute('role', 'treeitem');
    row.dataset.rank = String(first.rank);
    const label = folded ? ranksLabel(ranks.map(r => r.rank)) : `rank ${first.rank}`;
    row.append(span(label, 'jp-DistRank-label'), span(state, `jp-DistBadge jp-mod-${state}`));
    if (folded) {
      const show = button('show', `Show ${label} one by one`, () => {
        this.unfolded.add(session.name);
        this.render();
      });
      show.dataset.distKey = `show:${session.name}:${first.rank}`;
      row.append(show);
    } else {
      row.append(span(first.pid ? `pid ${first.pid}` : '', 'jp-DistRank-pid'));
      if (first.busy_since && first.state === 'busy') {
        row.append(
          span(
            formatDuration(now - first.busy_since),
            'jp-DistRank-elapsed',
            state === 'stuck'
              ? 'busy this long with no cell waiting for it, or beside finished ranks'
              : isLate
                ? 'still running while other ranks are done'
                : 'running its cell for'
          )
        );
      }
      if (isLate) {
        row.append(span('late', 'jp-DistBadge jp-mod-late', 'a straggler'));
      }
      const measured = sample?.ranks.find(r => r.rank === first.rank);
      if (
        this.shown.has('ranks') &&
        measured &&
        measured.cpu_percent !== null &&
        measured.rss_mib !== null
      ) {
        row.append(
          span(
            `CPU ${Math.round(measured.cpu_percent)}% · ${formatMiB(measured.rss_mib)}`,
            'jp-DistRank-usage',
            'CPU (of one core) and resident memory of the rank process'
          )
        );
      }
      const log = button(
        'log',
        `Open the log of rank ${first.rank}: what it printed and raised (its process diagnostics on a second tab)`,
        () =>
        this.actions.openLog(session.name, first.rank)
      );
      log.dataset.distKey = `log:${session.name}:${first.rank}`;
      const console = button('console', `Open a console on rank ${first.rank}'s kernel`, () =>
        this.actions.openConsole(session.name, first.rank)
      );
      console.dataset.distKey = `console:${session.name}:${first.rank}`;
      row.append(log, console);
      const error = first.last_error || first.exit || '';
      if (error) {
        row.append(span(error, 'jp-DistRank-error', error));
      }
    }
    return row;
  }

  private nodeMetrics(node: IMetrics['nodes'][number]): HTMLElement {
    const box = document.createElement('div');
    box.className = 'jp-DistNode-metrics';
    if (node.error) {
      box.append(span(`no sample: ${node.error}`, 'jp-DistRank-error'));
      return box;
    }
    const line = (label: string, fraction: number, text: string, cls = '') => {
      const row = document.createElement('div');
      row.className = 'jp-DistMetric';
      row.append(span(label, 'jp-DistMetric-label'), bar(fraction, `${label} ${text}`, cls));
      row.append(span(text, 'jp-DistMetric-value'));
      box.appendChild(row);
    };
    if (this.shown.has('cpu')) {
      line('CPU', (node.cpu_percent ?? 0) / 100, `${Math.round(node.cpu_percent ?? 0)}% of ${node.cpus}`);
    }
    if (this.shown.has('memory') && node.mem_used_mib !== null && node.mem_total_mib) {
      line(
        'memory',
        node.mem_used_mib / node.mem_total_mib,
        `${formatMiB(node.mem_used_mib)} of ${formatMiB(node.mem_total_mib)}`
      );
    }
    for (const gpu of this.shown.has('gpu') ? node.gpus : []) {
      line(`GPU ${gpu.index}`, gpu.util_percent / 100, `${Math.round(gpu.util_percent)}%`, 'jp-mod-gpu');
      line(
        `GPU ${gpu.index} mem`,
        gpu.mem_total_mib ? gpu.mem_used_mib / gpu.mem_total_mib : 0,
        `${formatMiB(gpu.mem_used_mib)} of ${formatMiB(gpu.mem_total_mib)}`,
        'jp-mod-gpu'
      );
    }
    return box;
  }

  private metricStreams = new Map<string, EventStream>();
  private stream: EventStream;
  private list: HTMLElement;
  private status: HTMLElement;
  private pending = false;
  private readonly press: PressHold;
  private timer: ReturnType<typeof setInterval> | null = null;
}
