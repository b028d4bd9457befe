/**
 * The "new session" form: launcher, hosts, nodes, GPUs or CPU processes per node, backend.
 * The server checks every value (`POST /sessions`) and its message is shown as it is.
 */
import { Widget } from '@lumino/widgets';

import { INewSession } from './sessionRequest';

export { INewSession, requestOf } from './sessionRequest';

function field(label: string, input: HTMLElement, hint = ''): HTMLElement {
  const row = document.createElement('label');
  row.className = 'jp-DistForm-row';
  const text = document.createElement('span');
  text.textContent = label;
  row.append(text, input);
  if (hint) {
    input.setAttribute('title', hint);
  }
  return row;
}

function select(name: string, options: [string, string][], value: string): HTMLSelectElement {
  const element = document.createElement('select');
  element.name = name;
  for (const [key, text] of options) {
    const option = document.createElement('option');
    option.value = key;
    option.textContent = text;
    option.selected = key === value;
    element.appendChild(option);
  }
  return element;
}

function input(name: string, placeholder: string, value = ''): HTMLInputElement {
  const element = document.createElement('input');
  element.name = name;
  element.placeholder = placeholder;
  element.value = value;
  return element;
}

export class NewSessionForm extends Widget {
  constructor(defaultLauncher = 'local') {
    super();
    this.addClass('jp-DistForm');
    this.inputs = {
      name: input('name', 'default'),
      launcher: select(
        'launcher',
        [
          ['local', 'local (this machine)'],
          ['ssh', 'SSH'],
          ['slurm', 'Slurm']
        ],
        defaultLauncher
      ),
      hosts: input('hosts', 'node1,alice@node2:2222'),
      nodes: input('nodes', '1'),
      kind: select(
        'kind',
        [
          ['procs', 'CPU processes per node'],
          ['gpus', 'GPUs per node']
        ],
        'procs'
      ),
      count: input('count', '2'),
      backend: select(
        'backend',
        [
          ['', 'automatic (nccl on GPUs, else gloo)'],
          ['gloo', 'gloo'],
          ['nccl', 'nccl']
        ],
        ''
      )
    };
    const i = this.inputs;
    this.node.append(
      field('Name', i.name, 'letters, digits, ".", "_" and "-"'),
      field('Launcher', i.launcher),
      field('Hosts', i.hosts, 'for SSH: comma-separated hosts, or leave empty'),
      field('Nodes', i.nodes),
      field('Ranks', i.kind),
      field('Count', i.count, 'one count, or one per node: 4,2'),
      field('Backend', i.backend)
    );
  }

  getValue(): INewSession {
    const i = this.inputs;
    return {
      name: (i.name as HTMLInputElement).value,
      launcher: (i.launcher as HTMLSelectElement).value,
      hosts: (i.hosts as HTMLInputElement).value,
      nodes: (i.nodes as HTMLInputElement).value,
      kind: (i.kind as HTMLSelectElement).value as 'procs' | 'gpus',
      count: (i.count as HTMLInputElement).value,
      backend: (i.backend as HTMLSelectElement).value
    };
  }

  private inputs: Record<string, HTMLInputElement | HTMLSelectElement>;
}
