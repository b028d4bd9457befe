/**
 * The server's messages in the new-session form's words. The server names what it checks
 * as the ``%%distributed`` flags do (``ray: --ray-cpus 5000: expected 1 to 4096``); under
 * a field of the form that reads ``'5000': expected 1 to 4096``, and a flag named in the
 * middle of a message becomes the field a person fills in (``the "Ray address" field``).
 * Also here: the Count a form starts with for each launcher.
 */
import { FormField } from './sessionRequest';

/** Each flag the server names, as the form's field; the launchers as the form says them. */
const FIELD_LABELS: Record<string, string> = {
  '--session': 'Name',
  '--hosts': 'Hosts',
  '--hostfile': 'Hosts',
  '--nodes': 'Nodes',
  '--procs': 'Count',
  '--gpus': 'Count',
  '--backend': 'Backend',
  '--ray-address': 'Ray address',
  '--ray-strategy': 'Placement',
  '--ray-cpus': 'CPUs per node',
  '--ray-gpus': 'GPUs per node',
  '--ray-runtime-env': 'Runtime env',
  '--namespace': 'Namespace',
  '--context': 'Context',
  '--image': 'Image',
  '--cpus': 'CPUs per pod',
  '--memory': 'Memory per pod',
  '--node-selector': 'Node selectors',
  '--toleration': 'Tolerations',
  '--pod-template': 'Pod template',
  '--k8s-callback': 'Callback',
  '--k8s-timeout': 'Timeout (s)'
};
const LAUNCHER_WORDS: Record<string, string> = {
  '--ray': 'the Ray cluster launcher',
  '--k8s': 'the Kubernetes launcher',
  '--slurm': 'the Slurm launcher'
};

/** The field each flag is, by the form's field names. */
const FIELD_OF_FLAG: Record<string, FormField> = {
  '--session': 'name',
  '--hosts': 'hosts',
  '--hostfile': 'hosts',
  '--nodes': 'nodes',
  '--procs': 'count',
  '--gpus': 'count',
  '--backend': 'backend',
  '--ray-address': 'rayAddress',
  '--ray-strategy': 'rayStrategy',
  '--ray-cpus': 'rayCpus',
  '--ray-gpus': 'rayGpus',
  '--ray-runtime-env': 'rayRuntimeEnv',
  '--ray-resources': 'rayResources',
  '--namespace': 'k8sNamespace',
  '--context': 'k8sContext',
  '--image': 'k8sImage',
  '--cpus': 'k8sCpus',
  '--memory': 'k8sMemory',
  '--node-selector': 'k8sNodeSelectors',
  '--toleration': 'k8sTolerations',
  '--pod-template': 'k8sPodTemplate',
  '--k8s-callback': 'k8sCallback',
  '--k8s-timeout': 'k8sTimeout',
  '--k8s-queue': 'k8sQueue',
  '--k8s-gpu-resource': 'k8sGpuResource'
};

/** What Count holds when the form opens, or when its launcher changes and Count was
 * left as it was: the ranks a node runs by default. Ray and Kubernetes have no default
 * of their own (the server asks for a count): one rank a node. */
export const COUNT_DEFAULTS: Record<string, string> = {
  local: '2',
  ssh: '1',
  slurm: '1',
  ray: '1',
  k8s: '1'
};

/** Count's default for ``launcher``. */
export function countDefault(launcher: string): string {
  return COUNT_DEFAULTS[launcher] ?? '1';
}

/** A message that begins with "Ray address ADDRESS (...)" or "Kubernetes API server URL
 * (...)": a cluster that could not be reached, and the field its address comes from. */
const UNREACHABLE: [RegExp, FormField][] = [
  [/^\s*Ray address\b/, 'rayAddress'],
  [/^\s*Kubernetes API server\b/, 'k8sContext']
];

/** The field a start's failure is about (a cluster's address that did not answer), or
 * null. */
export function fieldOfFailure(message: string): FormField | null {
  for (const [pattern, field] of UNREACHABLE) {
    if (pattern.test(message)) {
      return field;
    }
  }
  return null;
}

/** ``text`` with a value quoted as the form quotes values (a value quoted already, or in
 * backticks, stays as it is). */
function quoted(value: string): string {
  return /^(['"`]).*\1$/.test(value) ? value : `'${value}'`;
}

/**
 * ``message`` as it reads under ``field``: the scope the server gives it (``ray: ``,
 * ``k8s: ``) and the field's own name at its start go (``--ray-cpus 5000: ...`` becomes
 * ``'5000': ...``, as do "Ray address ..." and "Kubernetes API server ..."), the origin
 * "(given by --ray-address)" when it is this very field goes too, and each other flag it
 * names becomes its field (``the "Nodes" field``) or its launcher.
 */
export function inFormWords(message: string, field: FormField | 'form' | null = null): string {
  let text = message.replace(/^\s*(?:ray|k8s)(?::\s+|\.(?=[a-z_]+:))/, '');
  const head =
    /^(--[a-z0-9-]+|Ray address|Kubernetes API server)(?:\s+('[^']*'|`[^`]*`|\S+?(?=:\s|\s|$)))?(?:\s+\(given by (--[a-z0-9-]+)\))?(?=[\s:(]|$)/.exec(
      text
    );
  if (head) {
    const [whole, name, value, origin] = head;
    const own = field !== null && (FIELD_OF_FLAG[name] === field || fieldOfFailure(name) === field);
    if (own) {
      const keepOrigin = origin !== undefined && FIELD_OF_FLAG[origin] !== field;
      text =
        (value !== undefined ? quoted(value) : '') +
        (keepOrigin ? ` (given by ${origin})` : '') +
        text.slice(whole.length);
      text = text.replace(/^:\s+/, '');
    }
  }
  text = text.replace(/(^|[\s(/,;])(--[a-z0-9-]+)\b/g, (all, before: string, flag: string) => {
    const label = FIELD_LABELS[flag];
    if (label !== undefined) {
      return `${before}the "${label}" field`;
    }
    const launcher = LAUNCHER_WORDS[flag];
    return launcher !== undefined ? `${before}${launcher}` : all;
  });
  return text;
}
