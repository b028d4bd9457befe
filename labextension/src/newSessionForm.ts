/**
 * The "new session" form: launcher, hosts, nodes, GPUs or CPU processes per node, backend;
 * with the Ray launcher, the cluster's address, the placement strategy, the CPUs and GPUs
 * each node's bundle holds and Ray's runtime environment (shown only for Ray); with the
 * Kubernetes launcher, the pods' namespace, kubeconfig context, image, CPUs and memory, node
 * selectors and tolerations (one a line), pod template, callback address and timeout.
 * It is checked in place before it closes (`checkForm`, then the server's own check,
 * ``POST /sessions?validate=true``): a bad value is marked at its field with what is
 * expected, in the form's words (`inFormWords`), and nothing typed is lost. Count starts
 * with the launcher's default (`COUNT_DEFAULTS`), and follows the launcher until it is
 * typed in. While the session starts, the form says what the start does (`showProgress`).
 */
import { Widget } from '@lumino/widgets';

import { countDefault, inFormWords } from './formWords';
import { ProfilePicker } from './profilePicker';
import { K8sField } from './k8sRequest';
import { FormField, INewSession, RAY_STRATEGIES } from './sessionRequest';

export { INewSession, RAY_STRATEGIES, checkForm, fieldOfMessage, requestOf } from './sessionRequest';

function field(label: string, input: HTMLElement, error: HTMLElement, hint = ''): HTMLElement {
  const row = document.createElement('label');
  row.className = 'jp-DistForm-row';
  const text = document.createElement('span');
  text.textContent = label;
  row.append(text, input, error);
  if (hint) {
    input.setAttribute('title', hint);
  }
  return row;
}

function errorLine(name: string): HTMLElement {
  const element = document.createElement('span');
  element.className = 'jp-DistForm-error';
  element.id = `jp-DistForm-error-${name}`;
  element.setAttribute('role', 'alert');
  element.hidden = true;
  return element;
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

/** A field of one item a line. */
function lines(name: string, placeholder: string): HTMLTextAreaElement {
  const element = document.createElement('textarea');
  element.name = name;
  element.placeholder = placeholder;
  element.rows = 2;
  return element;
}

/** The Kubernetes fields: name, label, placeholder, hint; node selectors and tolerations
 * take one item a line. */
const K8S_FIELDS: [K8sField, string, string, string][] = [
  ['k8sNamespace', 'Namespace', "the context's", "where the session's Job runs; empty: the kubeconfig context's, or the server's own pod's"],
  ['k8sContext', 'Context', 'current', "a kubeconfig context of the server's machine; empty: the current one"],
  ['k8sImage', 'Image', "the server's pod's", "the pods' image, with jupyter_dist (same version) and python; empty: the server's own pod's"],
  ['k8sCpus', 'CPUs per pod', '8 or 500m', "each pod's CPU request and limit, a Kubernetes quantity"],
  ['k8sMemory', 'Memory per pod', '64Gi', "each pod's memory request and limit, a Kubernetes quantity"],
  ['k8sNodeSelectors', 'Node selectors', 'nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3', 'labels the machines must have, one key=value a line'],
  ['k8sTolerations', 'Tolerations', 'nvidia.com/gpu:NoSchedule', 'taints the pods tolerate, one key[=value]:Effect a line'],
  ['k8sPodTemplate', 'Pod template', '/path/on/the/server/pod.yaml', "a YAML or JSON pod template on the server's machine, merged under these fields (volumes, service account)"],
  ['k8sCallback', 'Callback', 'HOST:PORT, else in-cluster', 'where the pods dial back to the server; empty: its pod IP, in-cluster'],
  ['k8sTimeout', 'Timeout (s)', 'the start timeout', 'seconds to wait for the pods to be scheduled and connected'],
  ['k8sQueue', 'Queue', 'none', 'a Kueue LocalQueue of the namespace: the Job waits, suspended, until Kueue admits all its pods'],
  ['k8sGpuResource', 'GPU resource', 'nvidia.com/gpu', "the resource each pod's GPUs are asked as: nvidia.com/mig-1g.10gb, amd.com/gpu"]
];

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
          ['slurm', 'Slurm'],
          ['ray', 'Ray cluster'],
          ['k8s', 'Kubernetes']
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
      count: input('count', 'per node: 4, or 4,2', countDefault(defaultLauncher)),
      backend: select(
        'backend',
        [
          ['', 'automatic (nccl on GPUs, else gloo)'],
          ['gloo', 'gloo'],
          ['nccl', 'nccl']
        ],
        ''
      ),
      rayAddress: input('rayAddress', 'RAY_ADDRESS, else auto'),
      rayStrategy: select(
        'rayStrategy',
        [
          ['STRICT_SPREAD', 'STRICT_SPREAD (one machine a node)'],
          ['PACK', 'PACK (as few machines as fit)'],
          ['SPREAD', 'SPREAD (apart where there is room)']
        ],
        RAY_STRATEGIES[0]
      ),
      rayCpus: input('rayCpus', '1'),
      rayGpus: input('rayGpus', 'GPUs per node, else 0'),
      rayRuntimeEnv: input('rayRuntimeEnv', '{"pip": ["jupyter_dist"]}'),
      rayResources: input('rayResources', 'accelerator_type=A100, or TPU=1')
    };
    for (const [name, , placeholder] of K8S_FIELDS) {
      const many = name === 'k8sNodeSelectors' || name === 'k8sTolerations';
      this.inputs[name] = many ? lines(name, placeholder) : input(name, placeholder);
    }
    const i = this.inputs;
    const e = (name: string) => {
      const line = errorLine(name);
      this.errors[name] = line;
      i[name].setAttribute('aria-describedby', line.id);
      return line;
    };
    this.general = errorLine('form');
    this.progress = document.createElement('p');
    this.progress.className = 'jp-DistForm-progress';
    this.progress.setAttribute('role', 'status');
    this.progress.hidden = true;
    this.hostsRow = field('Hosts', i.hosts, e('hosts'), 'for SSH: comma-separated hosts, or leave empty');
    this.rayRows = [
      field(
        'Ray address',
        i.rayAddress,
        e('rayAddress'),
        "the cluster's HOST:PORT (head:6379); empty: RAY_ADDRESS where the server runs, else auto"
      ),
      field('Placement', i.rayStrategy, e('rayStrategy'), "the placement group's strategy"),
      field('CPUs per node', i.rayCpus, e('rayCpus'), "CPUs each node's bundle holds (default 1)"),
      field(
        'GPUs per node',
        i.rayGpus,
        e('rayGpus'),
        "GPUs each node's bundle holds; empty: the node's GPU count (0 for CPU processes)"
      ),
      field(
        'Runtime env',
        i.rayRuntimeEnv,
        e('rayRuntimeEnv'),
        "Ray's runtime environment for the nodes, a JSON object; empty: none (the nodes need jupyter_dist)"
      ),
      field(
        'Resources',
        i.rayResources,
        e('rayResources'),
        "what else each node's bundle holds, NAME=AMOUNT,... or a JSON object; accelerator_type=A100 asks for that accelerator"
      )
    ];
    for (const row of this.rayRows) {
      row.classList.add('jp-DistForm-ray');
    }
    this.k8sRows = K8S_FIELDS.map(([name, label, , hint]) => field(label, i[name], e(name), hint));
    for (const row of this.k8sRows) {
      row.classList.add('jp-DistForm-k8s');
    }
    this.node.append(
      this.progress, // at the top: the form scrolls, and this is what to look at meanwhile
      field('Name', i.name, e('name'), 'letters, digits, ".", "_" and "-"'),
      field('Launcher', i.launcher, e('launcher')),
      this.hostsRow,
      ...this.rayRows,
      ...this.k8sRows,
      field('Nodes', i.nodes, e('nodes')),
      field('Ranks', i.kind, e('kind')),
      field('Count', i.count, e('count'), 'one count, or one per node: 4,2'),
      field('Backend', i.backend, e('backend')),
      this.general
    );
    for (const element of Object.values(i)) {
      element.addEventListener('input', () => this.clear(element.name));
    }
    i.count.addEventListener('input', () => {
      this.countTyped = true;
    });
    i.launcher.addEventListener('change', () => this.showLauncher());
    this.showLauncher();
    this.profiles = new ProfilePicker(this);
    this.node.insertBefore(this.profiles.top, this.progress.nextSibling);
    this.node.insertBefore(this.profiles.bottom, this.general);
  }

  /** The server's profiles, in the list (`ProfilePicker`). */
  readonly profiles: ProfilePicker;

  /** Fill in a profile's values: each field it has; the others empty, or their first
   * choice (Name kept unless the profile names the session). */
  fill(values: Partial<INewSession>): void {
    const given = values as Record<string, string | undefined>;
    for (const [name, element] of Object.entries(this.inputs)) {
      if (name === 'name' && given.name === undefined) {
        continue;
      }
      const value = given[name];
      element.value =
        value ?? (element instanceof HTMLSelectElement ? (element.options[0]?.value ?? '') : '');
    }
    this.countTyped = given.count !== undefined;
    this.clear();
    this.showLauncher();
  }

  /** Each field's name, and whether it takes one item a line. */
  fieldKinds(): Record<string, boolean> {
    return Object.fromEntries(
      Object.entries(this.inputs).map(([name, element]) => [name, element instanceof HTMLTextAreaElement])
    );
  }

  /** Ray's fields for the Ray launcher, Kubernetes' for Kubernetes, the hosts for the
   * others; Count the launcher's default until it is typed in. */
  private showLauncher(): void {
    const launcher = this.inputs.launcher.value;
    if (!this.countTyped) {
      this.inputs.count.value = countDefault(launcher);
    }
    for (const row of this.rayRows) {
      row.hidden = launcher !== 'ray';
    }
    for (const row of this.k8sRows) {
      row.hidden = launcher !== 'k8s';
    }
    this.hostsRow.hidden = launcher === 'ray' || launcher === 'k8s';
  }

  /** Mark each bad field with what is wrong and what is expected, in the form's words;
   * ``form``: the rest. */
  showErrors(errors: Partial<Record<FormField | 'form', string>>): void {
    let first: HTMLElement | null = null;
    for (const [name, message] of Object.entries(errors)) {
      const line = name === 'form' ? this.general : this.errors[name];
      if (!line || !message) {
        continue;
      }
      line.textContent = inFormWords(message, name as FormField | 'form');
      line.hidden = false;
      const input = this.inputs[name];
      if (input) {
        input.classList.add('jp-mod-invalid');
        input.setAttribute('aria-invalid', 'true');
        first = first ?? input;
      }
    }
    first?.focus();
    if (!first && !this.general.hidden) {
      this.general.scrollIntoView({ block: 'nearest' }); // below the fields, out of sight
    }
  }

  /** Forget the marks (of one field, or all). */
  clear(name?: string): void {
    for (const [key, line] of Object.entries({ ...this.errors, form: this.general })) {
      if (name !== undefined && key !== name && key !== 'form') {
        continue;
      }
      line.textContent = '';
      line.hidden = true;
      this.inputs[key]?.classList.remove('jp-mod-invalid');
      this.inputs[key]?.removeAttribute('aria-invalid');
    }
  }

  /** What the start does now ("Ray cluster head:6379: connecting"); '' when it is done. */
  showProgress(text: string): void {
    this.progress.textContent = text;
    this.progress.hidden = !text;
    if (text) {
      this.progress.scrollIntoView({ block: 'nearest' });
    }
  }

  getValue(): INewSession {
    const i = this.inputs;
    const k8s = Object.fromEntries(K8S_FIELDS.map(([name]) => [name, i[name].value]));
    return {
      ...k8s,
      name: (i.name as HTMLInputElement).value,
      launcher: (i.launcher as HTMLSelectElement).value,
      hosts: (i.hosts as HTMLInputElement).value,
      nodes: (i.nodes as HTMLInputElement).value,
      kind: (i.kind as HTMLSelectElement).value as 'procs' | 'gpus',
      count: (i.count as HTMLInputElement).value,
      backend: (i.backend as HTMLSelectElement).value,
      rayAddress: (i.rayAddress as HTMLInputElement).value,
      rayStrategy: (i.rayStrategy as HTMLSelectElement).value,
      rayCpus: (i.rayCpus as HTMLInputElement).value,
      rayGpus: (i.rayGpus as HTMLInputElement).value,
      rayRuntimeEnv: (i.rayRuntimeEnv as HTMLInputElement).value,
      rayResources: (i.rayResources as HTMLInputElement).value,
      profile: this.profiles.chosen
    };
  }

  private inputs: Record<string, HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement>;
  private hostsRow: HTMLElement;
  private rayRows: HTMLElement[];
  private k8sRows: HTMLElement[];
  private errors: Record<string, HTMLElement> = {};
  private general: HTMLElement;
  private progress: HTMLElement;
  private countTyped = false;
}
