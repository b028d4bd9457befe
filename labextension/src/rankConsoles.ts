/**
 * JupyterLab consoles on rank kernels, opened from the sidebar, kept true to their rank.
 *
 * A console's kernel is the rank's own ipykernel, adopted by the server
 * (``server/rank_consoles.py``). When the session restarts, its ranks are new processes
 * and the old kernel leaves the server: each open console is moved onto its rank's new
 * kernel (and says so), or, when the session was shut down, closed with a notice saying
 * why. The server's event stream tells when, while any rank console is open.
 *
 * Kernel > Interrupt interrupts that rank alone (the server's ``rank_kernel_actions``).
 * Kernel > Restart restarts that rank alone, after JupyterLab's own question: a fresh rank
 * kernel takes its place, the other ranks keep their variables, and all join a new process
 * group.
 */
import { ISessionContext, Notification } from '@jupyterlab/apputils';
import { ServiceManager } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { EventStream } from './events';
import { ApiError, requestAPI } from './request';
import { restartedWords } from './restartedWords';

/** What this module needs of a console panel. */
export interface IConsoleLike extends Widget {
  sessionContext: ISessionContext;
}

interface IRankStatus {
  rank: number;
  pid: number | null;
}

interface ISessionStatus {
  name: string;
  state: string;
  world_size: number;
  ranks: IRankStatus[];
}

interface IEntry {
  panel: IConsoleLike;
  session: string;
  rank: number;
  kernelId: string;
  pid: number | null;
  moving: boolean;
  /** this console's own Restart is under way: its notice says what the move did */
  restarting: boolean;
}

function sessionPath(name: string, action = ''): string {
  return `sessions/${encodeURIComponent(name)}${action ? '/' + action : ''}`;
}

function messageOf(error: unknown): string {
  return error instanceof ApiError ? error.message : `${error}`;
}

export class RankConsoles {
  constructor(
    private openConsole: (label: string, kernel: { id: string; name: string }) => Promise<IConsoleLike>,
    private services: ServiceManager.IManager
  ) {}

  /** Open a console on ``rank`` of ``session``. */
  async open(session: string, rank: number): Promise<IConsoleLike> {
    const kernel = await this.adopt(session, rank);
    const status = await requestAPI<ISessionStatus>(sessionPath(session));
    const panel = await this.openConsole(`${session} rank ${rank}`, kernel);
    const entry: IEntry = {
      panel,
      session,
      rank,
      kernelId: kernel.id,
      pid: status.ranks.find(r => r.rank === rank)?.pid ?? null,
      moving: false,
      restarting: false
    };
    this.entries.add(entry);
    panel.node.dataset.distSession = session;
    panel.node.dataset.distRank = `${rank}`;
    const context = panel.sessionContext as ISessionContext & {
      restartKernel: () => Promise<void>;
    };
    context.restartKernel = () => this.restartRank(entry);
    panel.disposed.connect(() => {
      this.entries.delete(entry);
      if (!this.entries.size) {
        this.stream.stop();
      }
    });
    this.stream.start();
    return panel;
  }

  private adopt(session: string, rank: number): Promise<{ id: string; name: string }> {
    return requestAPI<{ id: string; name: string }>(`${sessionPath(session)}/ranks/${rank}/kernel`, {
      method: 'POST'
    });
  }

  /**
   * The console's Restart, once JupyterLab asked "Restart Kernel?": this rank alone is
   * replaced by a fresh rank kernel (the server's heal, ``ranks: [rank]``); the other ranks
   * keep their variables, and every rank joins a new process group. The console moves onto
   * the new rank; one notice says all of it.
   */
  private async restartRank(entry: IEntry): Promise<void> {
    const which = `rank ${entry.rank} of ${entry.session}`;
    const id = Notification.emit(`Restarting ${which}…`, 'in-progress', { autoClose: false });
    entry.restarting = true;
    try {
      const reply = await requestAPI<{ status: ISessionStatus }>(
        sessionPath(entry.session, 'heal'),
        { method: 'POST', body: JSON.stringify({ ranks: [entry.rank] }) }
      );
      await this.follow(reply.status);
      Notification.update({
        id,
        message: restartedWords(entry.session, entry.rank, reply.status.world_size),
        type: 'success',
        autoClose: 8000
      });
    } catch (error) {
      Notification.update({
        id,
        message: `Restarting ${which} failed: ${messageOf(error)}`,
        type: 'error',
        autoClose: 10000
      });
    } finally {
      entry.restarting = false;
    }
  }

  private onEvent = (kind: string, data: any): void => {
    if (kind === 'snapshot') {
      const sessions: ISessionStatus[] = data.sessions ?? [];
      const names = new Set(sessions.map(s => s.name));
      for (const entry of [...this.entries]) {
        if (!names.has(entry.session)) {
          this.close(entry, `session ${entry.session} was shut down`);
        }
      }
      sessions.forEach(s => void this.follow(s));
    } else if (kind === 'session' && data.session) {
      void this.follow(data.session as ISessionStatus);
    } else if (kind === 'removed') {
      for (const entry of [...this.entries]) {
        if (entry.session === data.name) {
          this.close(entry, `session ${entry.session} was shut down`);
        }
      }
    }
  };

  /** Move the consoles of a ready session whose rank is a new process onto it. */
  private async follow(status: ISessionStatus): Promise<void> {
    if (status.state !== 'ready') {
      return;
    }
    for (const entry of [...this.entries]) {
      if (entry.session !== status.name) {
        continue;
      }
      const pid = status.ranks.find(r => r.rank === entry.rank)?.pid ?? null;
      if (pid !== null && pid !== entry.pid) {
        await this.move(entry, pid);
      }
    }
  }

  private async move(entry: IEntry, pid: number): Promise<void> {
    if (entry.moving) {
      return;
    }
    entry.moving = true;
    try {
      const kernel = await this.adopt(entry.session, entry.rank);
      if (kernel.id !== entry.kernelId) {
        // the old kernel left the server: its console's Jupyter session goes with it
        await this.services.sessions.refreshRunning();
        await entry.panel.sessionContext.changeKernel({ id: kernel.id, name: kernel.name });
        entry.kernelId = kernel.id;
        if (!entry.restarting) {
          Notification.info(
          `The console on rank ${entry.rank} of ${entry.session} now runs on the restarted ` +
            'rank: its variables are gone',
            { autoClose: 8000 }
          );
        }
      }
      entry.pid = pid;
    } catch (error) {
      const gone = error instanceof ApiError && error.status === 404;
      if (gone) {
        this.close(entry, `session ${entry.session} was shut down`);
      } else {
        Notification.error(
          `The console on rank ${entry.rank} of ${entry.session} cannot follow its restarted ` +
            `rank: ${messageOf(error)}`,
          { autoClose: 10000 }
        );
      }
    } finally {
      entry.moving = false;
    }
  }

  private close(entry: IEntry, why: string): void {
    if (!this.entries.delete(entry)) {
      return;
    }
    Notification.warning(`The console on rank ${entry.rank} of ${entry.session} closed: ${why}`, {
      autoClose: false
    });
    // its kernel left the server with the session: closing asks nothing of it
    entry.panel.dispose();
  }

  private entries = new Set<IEntry>();
  private stream = new EventStream(this.onEvent);
}
