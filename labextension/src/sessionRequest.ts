/** The body of ``POST /sessions`` from the new-session form's fields. */

export interface INewSession {
  name: string;
  launcher: string;
  hosts: string;
  nodes: string;
  kind: 'procs' | 'gpus';
  count: string;
  backend: string;
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
  if (form.hosts.trim()) {
    body.hosts = form.hosts.trim();
  }
  if (form.backend) {
    body.backend = form.backend;
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
  if (count && !/^\d{1,6}(\s*,\s*\d{1,6})*$/.test(count)) {
    const what = form.kind === 'gpus' ? 'GPUs' : 'processes';
    wrong.count = `'${count}': expected a number of ${what} per node (4), or one per node (4,2)`;
  }
  if (form.launcher === 'ssh' && !form.hosts.trim()) {
    wrong.hosts = 'expected the hosts to start the nodes on, for SSH: node1,alice@node2:2222';
  }
  return wrong;
}

/** The field a server's 400 message is about (it begins with the field's name), if any. */
export function fieldOfMessage(message: string): FormField | null {
  const head = /^\s*(?:--)?([a-z_]+)\b/.exec(message)?.[1] ?? '';
  const fields: Record<string, FormField> = {
    session: 'name',
    name: 'name',
    launcher: 'launcher',
    hosts: 'hosts',
    nodes: 'nodes',
    procs: 'count',
    gpus: 'count',
    backend: 'backend'
  };
  return fields[head] ?? null;
}
