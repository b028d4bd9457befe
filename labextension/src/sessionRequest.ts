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
    body[form.kind] = /^\d+$/.test(count) ? Number(count) : count;
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
