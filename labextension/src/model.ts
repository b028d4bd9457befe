/**
 * The sessions of the server as the panel shows them: applied from the event stream
 * (``snapshot``, ``session``, ``removed``, ``notice``), and the pure functions the views
 * use to make many ranks readable (folding idle ranks, spotting a late one).
 */
import { ISignal, Signal } from '@lumino/signaling';

import { SENDER } from './request';

/** How long after this page asked for an action its notice is taken for that action's. */
export const OWN_NOTICE_MS = 60_000;

export interface IRank {
  rank: number;
  local_rank: number;
  node_rank: number;
  host: string;
  pid: number | null;
  state: string;
  exit: string | null;
  log: string;
  busy_since?: number | null;
  last_error?: string;
}

export interface INode {
  node_rank: number;
  host: string;
  agent_pid: number | null;
  gpus: { index?: number; name?: string; memory_mib?: number }[];
  lost: boolean;
}

export interface ITurn {
  turn_id: string;
  kind: string;
  path: string;
  kernel_id: string;
  started: number | null;
  ranks?: number[];
}

export interface ISession {
  name: string;
  state: string;
  shape: string;
  spec: { launcher?: string | null; hosts?: unknown[]; procs?: number[] };
  world_size: number;
  backend: string;
  device: string;
  cells_run: number;
  broken_reason: string;
  /** how many times every rank joined a new process group (ranks replaced, resized) */
  generation?: number;
  /** what happened to each rank a heal will replace, in words (empty when ready) */
  faults?: string[];
  nodes: INode[];
  ranks: IRank[];
  started_at?: number;
  straggler_s?: number;
  /** the notebook that started it, its path now (renames followed; '' if none did) */
  notebook?: string;
  /** that notebook's file id, which renames keep ('' if the server has none) */
  notebook_id?: string;
  notebooks?: { path: string; kernel_id: string; since: number }[];
  running?: ITurn | null;
  queue?: ITurn[];
}

/** The launcher a session's nodes were started by, in words. */
export function launcherOf(session: ISession): string {
  const launcher = session.spec?.launcher;
  if (launcher) {
    return launcher === 'ssh' ? 'SSH' : launcher === 'slurm' ? 'Slurm' : launcher;
  }
  return session.spec?.hosts && session.spec.hosts.length ? 'SSH' : 'local';
}

/** "3 s", "4 min 10 s", "2 h 5 min". */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${s % 60} s`;
  }
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** "rank 3", "ranks 0-3", "ranks 0,2,5-7". */
export function ranksLabel(ranks: number[]): string {
  const sorted = [...ranks].sort((a, b) => a - b);
  const parts: string[] = [];
  let start = 0;
  for (let i = 1; i <= sorted.length; i++) {
    if (i === sorted.length || sorted[i] !== sorted[i - 1] + 1) {
      const first = sorted[start];
      const last = sorted[i - 1];
      parts.push(first === last ? `${first}` : `${first}-${last}`);
      start = i;
    }
  }
  return `${sorted.length === 1 ? 'rank' : 'ranks'} ${parts.join(',')}`;
}

/** What a rank is doing, in one word: starting, idle, busy, error or dead. */
export function rankState(rank: IRank): string {
  if (rank.state === 'idle' && rank.last_error) {
    return 'error';
  }
  return rank.state;
}

/** Seconds a rank may stay busy unwaited for before it is called stuck, when the
 * server does not say (its ``JUPYTER_DIST_STRAGGLER_S`` default). */
export const STUCK_AFTER_S = 30;

/** What a session's badge says: its state, or, for a ready session, whether its ranks
 * are idle, busy (with how long) or stuck (with which and how long). */
export interface ISessionBadge {
  state: string;
  label: string;
  title: string;
  stuck: number[];
}

/**
 * A ready session's badge from its ranks: "ready" while none is busy; "busy 12 s" while
 * a cell runs; "stuck 2 min" once a rank has been busy ``straggler_s`` or longer with no
 * request of a notebook waiting for it, or beside ranks of the same request already
 * done. ``now`` in epoch seconds.
 */
export function sessionBadge(session: ISession, now: number): ISessionBadge {
  if (session.state !== 'ready') {
    const why = session.faults?.length ? session.faults.join('; ') : session.broken_reason;
    return { state: session.state, label: session.state, title: why, stuck: [] };
  }
  const busy = session.ranks.filter(r => r.state === 'busy');
  if (!busy.length) {
    return { state: 'ready', label: 'ready', title: 'every rank is idle', stuck: [] };
  }
  const running = session.running ?? null;
  const since = (r: IRank) => Math.max(0, now - (r.busy_since ?? running?.started ?? now));
  const longest = Math.max(...busy.map(since));
  const after = session.straggler_s ?? STUCK_AFTER_S;
  const members = running?.ranks?.length ? new Set(running.ranks) : null;
  const done = session.ranks.filter(
    r => r.state === 'idle' && (members === null || members.has(r.rank))
  );
  const long = busy.filter(r => since(r) >= after).map(r => r.rank);
  if (long.length && (running === null || done.length)) {
    const why =
      running === null
        ? 'with no cell waiting for them (Interrupt, or Restart the session)'
        : `while ${ranksLabel(done.map(r => r.rank))} finished`;
    return {
      state: 'stuck',
      label: `stuck ${formatDuration(longest)}`,
      title: `${ranksLabel(long)} busy for ${formatDuration(longest)} ${why}`,
      stuck: long
    };
  }
  const what = running ? `a ${running.kind} from ${running.path || 'a notebook'}` : 'a cell';
  return {
    state: 'busy',
    label: `busy ${formatDuration(longest)}`,
    title: `${ranksLabel(busy.map(r => r.rank))} running ${what}`,
    stuck: []
  };
}

/** A rank row, or several identical idle ranks folded into one. */
export interface IRankRow {
  ranks: IRank[];
  folded: boolean;
}

/** Ranks in order, with runs of two or more plain idle ranks (no error) folded. */
export function foldRanks(ranks: IRank[]): IRankRow[] {
  const rows: IRankRow[] = [];
  let run: IRank[] = [];
  const flush = () => {
    if (run.length >= 2) {
      rows.push({ ranks: run, folded: true });
    } else {
      run.forEach(r => rows.push({ ranks: [r], folded: false }));
    }
    run = [];
  };
  for (const rank of [...ranks].sort((a, b) => a.rank - b.rank)) {
    if (rankState(rank) === 'idle' || rankState(rank) === 'starting') {
      if (run.length && rankState(run[0]) !== rankState(rank)) {
        flush();
      }
      run.push(rank);
    } else {
      flush();
      rows.push({ ranks: [rank], folded: false });
    }
  }
  flush();
  return rows;
}

/**
 * Ranks still busy with the session's cell while at least one other rank of it is done
 * (idle again) for ``after`` seconds or more: late ranks, stragglers. ``now`` in epoch
 * seconds.
 */
export function lateRanks(session: ISession, now: number, after = 5): number[] {
  const running = session.running;
  if (!running || running.kind !== 'cell' || running.started === null) {
    return [];
  }
  const busy = session.ranks.filter(r => r.state === 'busy');
  const done = session.ranks.filter(r => r.state === 'idle');
  if (!busy.length || !done.length || now - running.started < after) {
    return [];
  }
  return busy.map(r => r.rank);
}

/** Nodes of a session with their ranks, in node order. */
export function nodesOf(session: ISession): { node: INode; ranks: IRank[] }[] {
  const nodes = session.nodes.length
    ? session.nodes
    : [...new Set(session.ranks.map(r => r.node_rank))].map(n => ({
        node_rank: n,
        host: session.ranks.find(r => r.node_rank === n)?.host ?? '?',
        agent_pid: null,
        gpus: [],
        lost: false
      }));
  return [...nodes]
    .sort((a, b) => a.node_rank - b.node_rank)
    .map(node => ({ node, ranks: session.ranks.filter(r => r.node_rank === node.node_rank) }));
}

/** The sessions, kept up to date from the server's events. */
export class SessionsModel {
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** A notice ("session 's' was restarted from eval.ipynb; ...") arrived. */
  get noticed(): ISignal<this, string> {
    return this._noticed;
  }

  get sessions(): ISession[] {
    return [...this._sessions.values()].sort((a, b) => a.name.localeCompare(b.name));
  }

  get(name: string): ISession | undefined {
    return this._sessions.get(name);
  }

  /** What a session's start last said it does ("Ray cluster head:6379: connecting"), while
   * it starts; '' when it is not starting. */
  progressOf(name: string): string {
    return this._progress.get(name) ?? '';
  }

  /** Apply one server-sent event. A session that stopped is gone: its name is free, its
   * buttons would find nothing (a start that failed stops it without a ``removed``). */
  apply(kind: string, data: any): void {
    if (kind === 'snapshot' && Array.isArray(data?.sessions)) {
      this._sessions = new Map(data.sessions.map((s: ISession) => [s.name, s]));
      this._progress.clear();
    } else if (kind === 'session' && data?.session?.name) {
      const session: ISession = data.session;
      if (session.state === 'stopped') {
        this._sessions.delete(session.name);
      } else {
        this._sessions.set(session.name, session);
      }
      if (session.state !== 'starting') {
        this._progress.delete(session.name);
      }
    } else if (kind === 'progress' && typeof data?.name === 'string' && typeof data?.text === 'string') {
      const state = this._sessions.get(data.name)?.state;
      if (state !== undefined && state !== 'starting') {
        return; // a restart's or a heal's: the card says those its own way
      }
      this._progress.set(data.name, data.text);
    } else if (kind === 'removed' && typeof data?.name === 'string') {
      this._sessions.delete(data.name);
      this._progress.delete(data.name);
    } else if (kind === 'notice' && typeof data?.text === 'string') {
      if (!this.ownNotice(data)) {
        this._noticed.emit(data.text);
      }
      return;
    } else {
      return;
    }
    this._changed.emit();
  }

  /**
   * This page is about to do ``action`` (interrupt, restart, shutdown) to session ``name``:
   * the server's notice of it, meant for the others using the session, is not shown here,
   * where the person just asked for it (and the cell it stops shows what happened).
   */
  expectOwn(name: string, action: string): void {
    this._own.set(`${name}\u0000${action}`, Date.now());
  }

  private ownNotice(data: any): boolean {
    if (data?.by?.path !== SENDER || typeof data?.name !== 'string') {
      return false;
    }
    const key = `${data.name}\u0000${data.action}`;
    const at = this._own.get(key);
    if (at === undefined) {
      return false;
    }
    this._own.delete(key);
    return Date.now() - at < OWN_NOTICE_MS;
  }

  private _own = new Map<string, number>();
  private _sessions = new Map<string, ISession>();
  private _progress = new Map<string, string>();
  private _changed = new Signal<this, void>(this);
  private _noticed = new Signal<this, string>(this);
}

/** One sample of a session's nodes and ranks (``GET /sessions/NAME/metrics``). */
export interface IGpuSample {
  index: number;
  name: string;
  util_percent: number;
  mem_used_mib: number;
  mem_total_mib: number;
}

export interface IMetrics {
  time: number;
  nodes: {
    node_rank: number;
    host: string;
    cpu_percent: number | null;
    cpus: number;
    mem_used_mib: number | null;
    mem_total_mib: number | null;
    gpus: IGpuSample[];
    error: string;
  }[];
  ranks: { rank: number; pid: number; cpu_percent: number | null; rss_mib: number | null }[];
}

/** "512 MiB", "3.4 GiB". */
export function formatMiB(mib: number): string {
  return mib >= 1024 ? `${(mib / 1024).toFixed(1)} GiB` : `${Math.round(mib)} MiB`;
}
