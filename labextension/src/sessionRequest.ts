/** The body of ``POST /sessions`` from the new-session form's fields. */
import { IK8sFields, checkK8s, k8sFieldOfMessage, k8sOf } from './k8sRequest';

/** The form's fields; with launcher "k8s", the Kubernetes ones (`IK8sFields`) too. */
export interface INewSession extends IK8sFields {
  name: string;
  launcher: string;
  hosts: string;
  nodes: string;
  kind: 'procs' | 'gpus';
  count: string;
  backend: string;
  /** With launcher "ray": the cluster's HOST:PORT (empty: RAY_ADDRESS where the server runs, else auto). */
  rayAddress?: string;
  /** With launcher "ray": STRICT_SPREAD (one machine a node), PACK or SPREAD. */
  rayStrategy?: string;
  /** With launcher "ray": CPUs each node's bundle holds (empty: 1). */
  rayCpus?: string;
  /** With launcher "ray": GPUs each node's bundle holds (empty: the node's GPU count). */
  rayGpus?: string;
  /** With launcher "ray": Ray's runtime environment, a JSON object (empty: none). */
  rayRuntimeEnv?: string;
  /** With launcher "ray": what else each node's bundle holds, as --ray-resources:
   * NAME=AMOUNT,... or a JSON object; accelerator_type=A100 is Ray's (empty: nothing). */
  rayResources?: string;
  /** A profile of the server's: what it sets and the form has no value for applies too. */
  profile?: string;
}

/** The Ray placement strategies, the default first. */
export const RAY_STRATEGIES = ['STRICT_SPREAD', 'PACK', 'SPREAD'];

/** The launchers whose nodes a cluster manager places: no hosts. */
export const CLUSTER_LAUNCHERS = ['ray', 'k8s'];

/** A count typed in a field: a number when it is one, else the text for the server to name. */
function countOf(text: string): number | string {
  return /^\d+$/.test(text) ? Number(text) : text;
}

/** The ``ray`` object of the request: what was filled in, and the strategy. */
function rayOf(form: INewSession): Record<string, unknown> {
  const ray: Record<string, unknown> = { strategy: form.rayStrategy || RAY_STRATEGIES[0] };
  const address = (form.rayAddress ?? '').trim();
  if (address) {
    ray.address = address;
  }
  const cpus = (form.rayCpus ?? '').trim();
  if (cpus) {
    ray.cpus = countOf(cpus);
  }
  const gpus = (form.rayGpus ?? '').trim();
  if (gpus) {
    ray.gpus = countOf(gpus);
  }
  const runtimeEnv = (form.rayRuntimeEnv ?? '').trim();
  if (runtimeEnv) {
    ray.runtime_env = runtimeEnv;
  }
  const resources = (form.rayResources ?? '').trim();
  if (resources) {
    ray.resources = resources; // checked by the server, which names a bad one
  }
  return ray;
}

/** The request body for a filled-in form (empty fields are left to the server). */
export function requestOf(form: INewSession): Record<string, unknown> {
  const body: Record<string, unknown> = { name: form.name.trim() || 'default' };
  const count = form.count.trim();
  if (count) {
    body[form.kind] = /^\d+$/.test(count)
      ? Number(count)
      : /^\d+(\s*,\s*\d+)+$/.test(count)
        ? count.split(',').map(c => Number(c.trim()))
        : count;
  }
  if (form.nodes.trim()) {
    body.nodes = /^\d+$/.test(form.nodes.trim()) ? Number(form.nodes.trim()) : form.nodes;
  }
  if (form.launcher !== 'local') {
    body.launcher = form.launcher;
  }
  if (form.hosts.trim() && !CLUSTER_LAUNCHERS.includes(form.launcher)) {
    body.hosts = form.hosts.trim();
  }
  if (form.launcher === 'ray') {
    body.ray = rayOf(form);
  }
  if (form.launcher === 'k8s') {
    body.k8s = k8sOf(form);
  }
  if (form.backend) {
    body.backend = form.backend;
  }
  if (form.profile) {
    body.profile = form.profile;
  }
  return body;
}

/** The form's fields, by name. */
export type FormField = keyof INewSession;

const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;

/** What is wrong with each field the form can check itself (none: an empty object). */
export function checkForm(form: INewSession): Partial<Record<FormField, string>> {
  const wrong: Partial<Record<FormField, string>> = {};
  const name = form.name.trim();
  if (name && !NAME.test(name)) {
    wrong.name = `'${name}': expected 1-64 letters, digits, "_", "." or "-", starting with a letter or digit`;
  }
  const nodes = form.nodes.trim();
  if (nodes && !/^[1-9]\d{0,5}$/.test(nodes)) {
    wrong.nodes = `'${nodes}': expected a whole number of nodes, 1 or more`;
  }
  const count = form.count.trim();
  const what = form.kind === 'gpus' ? 'GPUs' : 'processes';
  if (count && !/^\d{1,6}(\s*,\s*\d{1,6})*$/.test(count)) {
    wrong.count = `'${count}': expected a number of ${what} per node (4), or one per node (4,2)`;
  } else if (!count && CLUSTER_LAUNCHERS.includes(form.launcher)) {
    const cluster = form.launcher === 'ray' ? 'Ray' : 'Kubernetes';
    wrong.count = `expected the number of ${what} each node runs (1, or one per node: 4,2): ${cluster} has no default`;
  }
  if (form.launcher === 'ssh' && !form.hosts.trim()) {
    wrong.hosts = 'expected the hosts to start the nodes on, for SSH: node1,alice@node2:2222';
  }
  if (form.launcher === 'ray') {
    Object.assign(wrong, checkRay(form));
  }
  if (form.launcher === 'k8s') {
    Object.assign(wrong, checkK8s(form));
    if (form.hosts.trim()) {
      wrong.hosts = 'Kubernetes runs the nodes as pods of one Job: leave Hosts empty';
    }
  }
  return wrong;
}

/** The Ray fields' own checks (the server checks the ranges and the address's form too). */
function checkRay(form: INewSession): Partial<Record<FormField, string>> {
  const wrong: Partial<Record<FormField, string>> = {};
  const address = (form.rayAddress ?? '').trim();
  if (address.startsWith('ray://')) {
    wrong.rayAddress = `'${address}': Ray Client addresses (ray://) cannot carry the ranks' traffic; expected the cluster's HOST:PORT (head:6379), or empty for RAY_ADDRESS or auto`;
  } else if (address && address !== 'auto' && !/^[^\s:]+(:[^\s:]+)*:\d{1,5}$/.test(address)) {
    wrong.rayAddress = `'${address}': expected the cluster's HOST:PORT (head:6379), auto, or empty for RAY_ADDRESS or auto`;
  }
  for (const [key, low] of [['rayCpus', 1], ['rayGpus', 0]] as [FormField, number][]) {
    const text = (form[key] ?? '').trim();
    if (text && (!/^\d{1,4}$/.test(text) || Number(text) < low)) {
      const what = key === 'rayCpus' ? 'CPUs' : 'GPUs';
      wrong[key] = `'${text}': expected a whole number of ${what} each node's bundle holds, ${low} or more`;
    }
  }
  const runtimeEnv = (form.rayRuntimeEnv ?? '').trim();
  if (runtimeEnv) {
    let value: unknown = undefined;
    let problem = '';
    try {
      value = JSON.parse(runtimeEnv);
    } catch (error) {
      problem = `not JSON (${error instanceof Error ? error.message : error})`;
    }
    if (!problem && (value === null || typeof value !== 'object' || Array.isArray(value))) {
      problem = 'not a JSON object';
    }
    if (problem) {
      const shown = runtimeEnv.length > 60 ? `${runtimeEnv.slice(0, 60)}…` : runtimeEnv;
      wrong.rayRuntimeEnv = `'${shown}': ${problem}; expected a JSON object such as {"pip": ["jupyter_dist"]}`;
    }
  }
  if (form.hosts.trim()) {
    wrong.hosts = 'Ray places the nodes on the cluster: leave Hosts empty';
  }
  return wrong;
}

/** The field a server's 400 message is about (it begins with the field's name), if any. */
export function fieldOfMessage(message: string): FormField | null {
  const k8s = k8sFieldOfMessage(message);
  if (k8s !== null) {
    return k8s;
  }
  // the ray object's: "ray: --ray-cpus 0: ..." or "ray.cpus: '2' is not a int"
  const ray = /^\s*ray(?::\s*--ray-|\.)([a-z_-]+)/.exec(message)?.[1];
  if (ray !== undefined) {
    const rayFields: Record<string, FormField> = {
      address: 'rayAddress',
      strategy: 'rayStrategy',
      cpus: 'rayCpus',
      gpus: 'rayGpus',
      'runtime-env': 'rayRuntimeEnv',
      runtime_env: 'rayRuntimeEnv',
      resources: 'rayResources'
    };
    return rayFields[ray] ?? 'launcher';
  }
  const head = /^\s*(?:--)?([a-z_]+)\b/.exec(message)?.[1] ?? '';
  const fields: Record<string, FormField> = {
    session: 'name',
    name: 'name',
    launcher: 'launcher',
    hosts: 'hosts',
    nodes: 'nodes',
    procs: 'count',
    gpus: 'count',
    backend: 'backend',
    ray: 'launcher'
  };
  return fields[head] ?? null;
}
