/**
 * The jupyter_dist JupyterLab extension: a left-sidebar panel of the server's distributed
 * sessions, with commands for its actions. Settings: ``schema/plugin.json``.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Dialog, ICommandPalette, Notification, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { rankLogTab } from './logView';
import { IConsoleLike, RankConsoles } from './rankConsoles';
import { SessionsModel } from './model';
import { NewSessionDialog } from './newSessionDialog';
import { NewSessionForm } from './newSessionForm';
import { DistPanel, IActions } from './panel';
import { ApiError, requestAPI } from './request';
import { IStackGroup, stacksBody } from './stacksView';

const PLUGIN_ID = 'jupyter-dist-labextension:plugin';
/** Opens the sidebar (the command palette and View menu show it; see schema/plugin.json). */
export const OPEN_COMMAND = 'jupyter-dist:open-sidebar';

export const distIcon = new LabIcon({
  name: 'jupyter-dist:ranks',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<rect x="2" y="3" width="8" height="6" rx="1"/><rect x="14" y="3" width="8" height="6" rx="1"/>' +
    '<rect x="2" y="15" width="8" height="6" rx="1"/><rect x="14" y="15" width="8" height="6" rx="1"/>' +
    '<rect x="11" y="11" width="2" height="2"/></g></svg>'
});

function report(error: unknown, what: string): void {
  const message = error instanceof ApiError ? error.message : `${error}`;
  Notification.error(`${what}: ${message}`, { autoClose: 8000 });
}

function sessionPath(name: string, action = ''): string {
  return `sessions/${encodeURIComponent(name)}${action ? '/' + action : ''}`;
}

async function confirm(title: string, body: string, label: string): Promise<boolean> {
  const result = await showDialog({
    title,
    body,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label })]
  });
  return result.button.accept;
}

function actionsFor(
  app: JupyterFrontEnd,
  model: SessionsModel,
  tracker: INotebookTracker | null,
  settings: { defaultLauncher: string }
): IActions {
  const consoles = new RankConsoles(
    async (label, kernel) =>
      (await app.commands.execute('console:create', {
        name: label,
        kernelPreference: { id: kernel.id, name: kernel.name }
      })) as IConsoleLike,
    app.serviceManager
  );
  const lost = (name: string): string => {
    const session = model.get(name);
    const users = (session?.notebooks ?? []).map(n => n.path).filter(Boolean);
    const running = session?.running ? ` Its running ${session.running.kind} from ${session.running.path || 'a notebook'} stops.` : '';
    const told = users.length ? ` ${users.join(', ')} will be told.` : '';
    return `The variables in its ${session?.world_size ?? ''} ranks are lost.${running}${told}`;
  };
  return {
    newSession: async () => {
      // it starts the session itself, saying how the start goes (`NewSessionDialog`)
      await new NewSessionDialog(new NewSessionForm(settings.defaultLauncher), model).launch();
    },
    useInNotebook: async name => {
      // the notebook asked for, named now: another may be current once the kernel answers
      const notebook = tracker?.currentWidget;
      const label = notebook?.title.label ?? 'the notebook';
      const kernel = notebook?.sessionContext.session?.kernel;
      if (!kernel) {
        Notification.warning('Open a notebook (with a running kernel) to use the session in.');
        return;
      }
      const future = kernel.requestExecute({
        code: `%load_ext jupyter_dist\n%dist attach ${name}`,
        silent: false,
        store_history: false
      });
      const reply = await future.done;
      const content: any = reply.content;
      if (content.status === 'ok') {
        Notification.success(
          `%%distributed cells of ${label} now run in session ${name}`,
          { autoClose: 5000 }
        );
      } else {
        Notification.error(`Attaching ${label} to ${name} failed: ${content.ename}: ${content.evalue}`);
      }
    },
    stacks: async name => {
      try {
        const reply = await requestAPI<{ groups: IStackGroup[] }>(sessionPath(name, 'stacks'), {
          method: 'POST'
        });
        await showDialog({
          title: `Where the ranks of ${name} are`,
          body: stacksBody(reply.groups ?? []),
          buttons: [Dialog.okButton({ label: 'Close' })]
        });
      } catch (error) {
        report(error, `Stacks of ${name}`);
      }
    },
    interrupt: async name => {
      try {
        model.expectOwn(name, 'interrupt');
        await requestAPI(sessionPath(name, 'interrupt'), { method: 'POST' });
      } catch (error) {
        report(error, `Interrupting ${name}`);
      }
    },
    restart: async name => {
      if (!(await confirm(`Restart session ${name}?`, lost(name), 'Restart'))) {
        return;
      }
      try {
        model.expectOwn(name, 'restart');
        await requestAPI(sessionPath(name, 'restart'), { method: 'POST' });
      } catch (error) {
        report(error, `Restarting ${name}`);
      }
    },
    heal: async name => {
      try {
        await requestAPI(sessionPath(name, 'heal'), { method: 'POST' });
      } catch (error) {
        report(error, `Healing ${name}`);
      }
    },
    shutdown: async name => {
      if (!(await confirm(`Shut session ${name} down?`, lost(name), 'Shut down'))) {
        return;
      }
      try {
        model.expectOwn(name, 'shutdown');
        await requestAPI(sessionPath(name), { method: 'DELETE' });
      } catch (error) {
        report(error, `Shutting ${name} down`);
      }
    },
    openConsole: async (name, rank) => {
      try {
        await consoles.open(name, rank);
      } catch (error) {
        report(error, `A console on rank ${rank} of ${name}`);
      }
    },
    openLog: (name, rank) => {
      const id = `jupyter-dist-log-${name}-${rank}`;
      const open = [...app.shell.widgets('main')].find(w => w.id === id);
      if (open) {
        app.shell.activateById(id);
        return;
      }
      app.shell.add(rankLogTab(name, rank), 'main');
    }
  };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'A sidebar of the distributed sessions of the server, their nodes and ranks.',
  autoStart: true,
  optional: [ILayoutRestorer, INotebookTracker, ISettingRegistry, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    tracker: INotebookTracker | null,
    registry: ISettingRegistry | null,
    palette: ICommandPalette | null
  ) => {
    const model = new SessionsModel();
    const settings = { defaultLauncher: 'local', refreshRate: 1 };
    const panel = new DistPanel(model, actionsFor(app, model, tracker, settings));
    panel.title.icon = distIcon;
    panel.title.label = 'Distributed';
    panel.title.caption = 'Distributed sessions: their nodes, ranks and logs';
    model.noticed.connect((_, text) => Notification.info(text, { autoClose: 8000 }));
    app.shell.add(panel, 'left', { rank: 700 });
    if (restorer) {
      restorer.add(panel, 'jupyter-dist-sidebar');
    }
    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Show distributed sessions',
      caption: 'Open the Distributed sidebar: sessions, their nodes, ranks and logs',
      icon: distIcon,
      execute: () => app.shell.activateById(panel.id)
    });
    palette?.addItem({ command: OPEN_COMMAND, category: 'Distributed' });
    if (registry) {
      void registry.load(PLUGIN_ID).then(loaded => {
        const apply = () => {
          settings.defaultLauncher = loaded.get('defaultLauncher').composite as string;
          settings.refreshRate = loaded.get('refreshRate').composite as number;
          panel.tick = settings.refreshRate * 1000;
          panel.shown = new Set(loaded.get('metrics').composite as string[]);
          panel.render();
        };
        apply();
        loaded.changed.connect(apply);
      });
    }
  }
};

export default plugin;
