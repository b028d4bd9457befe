/**
 * The Kubernetes part of the new-session form: its fields, the ``k8s`` object of
 * ``POST /sessions`` made from them, their checks (as the magic's ``--k8s`` flags are
 * checked, where that is cheap; the server checks the rest, the pod template's file too),
 * and the field a server's ``k8s`` message is about.
 */

/** The form's Kubernetes fields, as typed (empty: the flag's default). */
export interface IK8sFields {
  /** The namespace (empty: the kubeconfig context's, or the server's own pod's). */
  k8sNamespace?: string;
  /** A kubeconfig context of the server's machine (empty: the current one). */
  k8sContext?: string;
  /** The pods' image, with jupyter_dist installed (empty: the server's own pod's). */
  k8sImage?: string;
  /** Each pod's CPUs, a Kubernetes quantity: 8, 500m. */
  k8sCpus?: string;
  /** Each pod's memory, a Kubernetes quantity: 64Gi. */
  k8sMemory?: string;
  /** Node selectors, one ``key=value`` a line. */
  k8sNodeSelectors?: string;
  /** Tolerations, one ``key[=value]:Effect`` a line. */
  k8sTolerations?: string;
  /** A pod template's path on the server's machine. */
  k8sPodTemplate?: string;
  /** ``HOST:PORT`` the pods dial back to (empty: the server's pod IP, in-cluster). */
  k8sCallback?: string;
  /** Seconds to wait for the pods (empty: the session's start timeout). */
  k8sTimeout?: string;
  /** A Kueue LocalQueue of the namespace (empty: none, the pods are made at once). */
  k8sQueue?: string;
  /** The resource each pod's GPUs are asked as (empty: nvidia.com/gpu). */
  k8sGpuResource?: string;
}

export type K8sField = keyof IK8sFields;

export const TOLERATION_EFFECTS = ['NoSchedule', 'PreferNoSchedule', 'NoExecute'];
/** The most node selectors or tolerations one session may give. */
const MAX_SELECTORS = 64;
/** The longest a session may wait for its pods (a day), as the server has it. */
const MAX_WAIT_S = 86400;

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const LABEL_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const LABEL_PREFIX = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
const QUANTITY = /^(?:\d+(?:\.\d+)?|\.\d+)(?:m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/;
const IMAGE = /^[^\s\x00-\x1f\x7f]{1,1024}$/;
const HOST_PORT = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253}):(\d{1,5})$/;
const QUEUE = /^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;

const text = (value: string | undefined): string => (value ?? '').trim();

/** The non-empty lines of a field, trimmed. */
export function linesOf(value: string | undefined): string[] {
  return (value ?? '')
    .split('\n')
    .map(line => line.trim())
    .filter(Boolean);
}

/** The ``k8s`` object of the request: what was filled in. */
export function k8sOf(form: IK8sFields): Record<string, unknown> {
  const k8s: Record<string, unknown> = {};
  const strings: [K8sField, string][] = [
    ['k8sNamespace', 'namespace'],
    ['k8sContext', 'context'],
    ['k8sImage', 'image'],
    ['k8sCpus', 'cpus'],
    ['k8sMemory', 'memory'],
    ['k8sPodTemplate', 'pod_template'],
    ['k8sCallback', 'callback'],
    ['k8sQueue', 'queue'],
    ['k8sGpuResource', 'gpu_resource']
  ];
  for (const [field, key] of strings) {
    if (text(form[field])) {
      k8s[key] = text(form[field]);
    }
  }
  const selectors = linesOf(form.k8sNodeSelectors);
  if (selectors.length) {
    k8s.node_selector = selectors;
  }
  const tolerations = linesOf(form.k8sTolerations);
  if (tolerations.length) {
    k8s.tolerations = tolerations;
  }
  const timeout = text(form.k8sTimeout);
  if (timeout) {
    // a number when it is one, else the text for the server to name
    k8s.timeout = /^\d+(\.\d+)?$/.test(timeout) ? Number(timeout) : timeout;
  }
  return k8s;
}

function labelKeyProblem(key: string): string {
  const slash = key.lastIndexOf('/');
  const prefix = slash >= 0 ? key.slice(0, slash) : '';
  const name = key.slice(slash + 1);
  if (LABEL_NAME.test(name) && (slash < 0 || LABEL_PREFIX.test(prefix))) {
    return '';
  }
  return `label key '${key}': expected an optional DNS prefix and '/', then at most 63 letters, digits, '-', '_', '.' (kubernetes.io/arch, gpu-type)`;
}

function selectorProblem(line: string): string {
  const eq = line.indexOf('=');
  if (eq < 0) {
    return `'${line}': expected key=value, e.g. nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3`;
  }
  const value = line.slice(eq + 1);
  const key = labelKeyProblem(line.slice(0, eq));
  if (key) {
    return `'${line}': ${key}`;
  }
  if (value && !LABEL_NAME.test(value)) {
    return `'${line}': value '${value}': expected at most 63 letters, digits, '-', '_', '.'`;
  }
  return '';
}

function tolerationProblem(line: string): string {
  const colon = line.lastIndexOf(':');
  const rest = colon > 0 ? line.slice(0, colon) : '';
  const effect = colon > 0 ? line.slice(colon + 1) : '';
  if (!rest || !TOLERATION_EFFECTS.includes(effect)) {
    return `'${line}': expected key[=value]:Effect with Effect one of ${TOLERATION_EFFECTS.join(', ')}, e.g. nvidia.com/gpu:NoSchedule`;
  }
  const eq = rest.indexOf('=');
  const key = labelKeyProblem(eq < 0 ? rest : rest.slice(0, eq));
  if (key) {
    return `'${line}': ${key}`;
  }
  const value = eq < 0 ? '' : rest.slice(eq + 1);
  if (value && !LABEL_NAME.test(value)) {
    return `'${line}': value '${value}': expected a label value`;
  }
  return '';
}

function quantityProblem(value: string): boolean {
  return !QUANTITY.test(value) || Number(value.replace(/[A-Za-z]+$/, '') || '0') <= 0;
}

/** The first bad line of a one-per-line field, or of its count. */
function linesProblem(lines: string[], problem: (line: string) => string): string {
  if (lines.length > MAX_SELECTORS) {
    return `${lines.length} lines: expected at most ${MAX_SELECTORS}`;
  }
  for (const line of lines) {
    const wrong = problem(line);
    if (wrong) {
      return wrong;
    }
  }
  return '';
}

/** What is wrong with each Kubernetes field, as the ``--k8s`` flags are checked. */
export function checkK8s(form: IK8sFields): Partial<Record<K8sField, string>> {
  const wrong: Partial<Record<K8sField, string>> = {};
  const namespace = text(form.k8sNamespace);
  if (namespace && !DNS_LABEL.test(namespace)) {
    wrong.k8sNamespace = `'${namespace}': expected a Kubernetes namespace (lower-case letters, digits and '-', at most 63, starting and ending with a letter or digit), or empty for the context's`;
  }
  const context = text(form.k8sContext);
  if (context.length > 253 || /[\x00-\x1f\x7f]/.test(context)) {
    wrong.k8sContext = `'${context.slice(0, 60)}': expected a kubeconfig context's name`;
  }
  const image = text(form.k8sImage);
  if (image && !IMAGE.test(image)) {
    wrong.k8sImage = `'${image.slice(0, 80)}': expected an image reference such as registry/team/image:tag (no spaces)`;
  }
  for (const [field, example] of [
    ['k8sCpus', '8, 500m'],
    ['k8sMemory', '64Gi, 512Mi']
  ] as [K8sField, string][]) {
    const value = text(form[field]);
    if (value && quantityProblem(value)) {
      wrong[field] = `'${value}': expected a Kubernetes quantity more than 0, such as ${example}`;
    }
  }
  const selectors = linesProblem(linesOf(form.k8sNodeSelectors), selectorProblem);
  if (selectors) {
    wrong.k8sNodeSelectors = selectors;
  }
  const tolerations = linesProblem(linesOf(form.k8sTolerations), tolerationProblem);
  if (tolerations) {
    wrong.k8sTolerations = tolerations;
  }
  const callback = text(form.k8sCallback);
  const hostPort = HOST_PORT.exec(callback);
  if (callback && (!hostPort || Number(hostPort[2]) < 1 || Number(hostPort[2]) > 65535)) {
    wrong.k8sCallback = `'${callback}': expected HOST:PORT the pods can reach, with a port 1-65535 (10.0.3.7:7077), or empty in-cluster`;
  }
  const timeout = text(form.k8sTimeout);
  if (timeout && (!/^\d+(\.\d+)?$/.test(timeout) || Number(timeout) <= 0 || Number(timeout) > MAX_WAIT_S)) {
    wrong.k8sTimeout = `'${timeout}': expected seconds, more than 0, at most ${MAX_WAIT_S}, or empty for the start timeout`;
  }
  const queue = text(form.k8sQueue);
  if (queue && !QUEUE.test(queue)) {
    wrong.k8sQueue = `'${queue.slice(0, 80)}': expected the name of a Kueue LocalQueue in the namespace (lower-case letters, digits, '-' and '.', at most 63), or empty for none`;
  }
  const gpuResource = text(form.k8sGpuResource);
  if (gpuResource && gpuResourceProblem(gpuResource)) {
    wrong.k8sGpuResource = `'${gpuResource.slice(0, 80)}': expected an extended resource name DOMAIN/NAME, e.g. nvidia.com/gpu, nvidia.com/mig-1g.10gb or amd.com/gpu`;
  }
  return wrong;
}

/** Whether ``value`` is no extended resource name, as the server checks it. */
function gpuResourceProblem(value: string): boolean {
  const slash = value.indexOf('/');
  const prefix = slash >= 0 ? value.slice(0, slash) : '';
  const name = slash >= 0 ? value.slice(slash + 1) : '';
  const native = prefix === 'kubernetes.io' || prefix.endsWith('.kubernetes.io');
  return (
    native ||
    !prefix.includes('.') ||
    !DNS_SUBDOMAIN.test(prefix) ||
    !LABEL_NAME.test(name) ||
    name.length > 54
  );
}

/** The Kubernetes field a server's message is about (``k8s: --memory '1x': ...``,
 * ``k8s.cpus: 8 is not a str``), ``launcher`` for the rest of its ``k8s`` messages, or
 * null for a message about something else. */
export function k8sFieldOfMessage(message: string): K8sField | 'launcher' | null {
  if (!/^\s*(?:--)?k8s\b/.test(message)) {
    return null;
  }
  const named = /^\s*k8s(?::\s*--|\.)([a-z0-9_-]+)/.exec(message)?.[1];
  const fields: Record<string, K8sField> = {
    namespace: 'k8sNamespace',
    context: 'k8sContext',
    image: 'k8sImage',
    cpus: 'k8sCpus',
    memory: 'k8sMemory',
    'node-selector': 'k8sNodeSelectors',
    node_selector: 'k8sNodeSelectors',
    toleration: 'k8sTolerations',
    tolerations: 'k8sTolerations',
    'pod-template': 'k8sPodTemplate',
    pod_template: 'k8sPodTemplate',
    'k8s-callback': 'k8sCallback',
    callback: 'k8sCallback',
    'k8s-timeout': 'k8sTimeout',
    timeout: 'k8sTimeout',
    'k8s-queue': 'k8sQueue',
    queue: 'k8sQueue',
    'k8s-gpu-resource': 'k8sGpuResource',
    gpu_resource: 'k8sGpuResource'
  };
  return (named !== undefined ? fields[named] : undefined) ?? 'launcher';
}
