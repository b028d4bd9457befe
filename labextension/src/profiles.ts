/**
 * The server's launcher profiles in the new-session form: what ``GET /profiles`` lists, and
 * a profile's session request as the form's fields (the inverse of `requestOf`).
 *
 * Which form field a ``ray`` or ``k8s`` key comes from is found by asking `requestOf`
 * itself, one field at a time (`keyOfField`), so a field the form gains is filled from a
 * profile with no table to keep here; a key the form has no field for is named
 * (`elsewhere`), and still applies: the start sends the profile's name.
 */
import { INewSession, requestOf } from './sessionRequest';

/** One profile as ``GET /profiles`` lists it. */
export interface IProfile {
  name: string;
  /** local, ssh, slurm, ray or k8s */
  launcher: string;
  /** Its fields as the file has them: ``%%distributed`` options without their dashes. */
  settings: Record<string, unknown>;
  /** The ``POST /sessions`` body it makes. */
  request: Record<string, unknown>;
  /** Its fields a request has no place for (a cell's own options). */
  unused: string[];
  /** What a start from it would refuse ('' when nothing). */
  error: string;
}

/** ``GET /profiles``: the file and its profiles. */
export interface IProfileList {
  path: string;
  profiles: IProfile[];
  error: string;
}

/** The form's fields filled from a request, and the request's keys it has no field for. */
export interface IFilled {
  values: Partial<INewSession>;
  elsewhere: string[];
}

/** The launchers' objects of a request, and the form's launcher each goes with. */
const OBJECTS = ['ray', 'k8s'];

const BLANK: INewSession = {
  name: '',
  launcher: 'local',
  hosts: '',
  nodes: '',
  kind: 'procs',
  count: '',
  backend: ''
};

/** The key of the ``launcher`` object that form field ``field`` sets ("k8sQueue" ->
 * "queue"), found by filling it alone; null for a field that sets none. */
export function keyOfField(field: string, launcher: string): string | null {
  const probe = '7';
  const before = (requestOf({ ...BLANK, launcher })[launcher] ?? {}) as Record<string, unknown>;
  const after = (requestOf({ ...BLANK, launcher, [field]: probe })[launcher] ?? {}) as Record<
    string,
    unknown
  >;
  const changed = Object.keys(after).filter(key => JSON.stringify(after[key]) !== JSON.stringify(before[key]));
  return changed.length === 1 ? changed[0] : null;
}

/** A request's value as a field's text: a list one item a line where the field takes
 * lines, else with commas. */
function textOf(value: unknown, lines: boolean): string {
  if (Array.isArray(value)) {
    return value.map(String).join(lines ? '\n' : ',');
  }
  if (value !== null && typeof value === 'object') {
    return JSON.stringify(value);
  }
  return value === undefined || value === null ? '' : String(value);
}

/** ``request`` (a profile's) as the form's values. ``fields``: the form's fields, each
 * with whether it takes one item a line. */
export function formOfRequest(request: Record<string, unknown>, fields: Record<string, boolean>): IFilled {
  const values: Partial<INewSession> = {};
  const elsewhere: string[] = [];
  const launcher = String(request.launcher ?? (request.hosts ? 'ssh' : 'local'));
  values.launcher = launcher;
  for (const [key, value] of Object.entries(request)) {
    if (key === 'launcher') {
      continue;
    } else if (key === 'name' || key === 'nodes' || key === 'backend' || key === 'hosts') {
      (values as Record<string, string>)[key] = textOf(value, false);
    } else if (key === 'gpus' || key === 'procs') {
      values.kind = key;
      values.count = textOf(value, false);
    } else if (OBJECTS.includes(key) && key === launcher && value && typeof value === 'object') {
      const byKey: Record<string, string> = {};
      for (const field of Object.keys(fields)) {
        const found = keyOfField(field, launcher);
        if (found !== null) {
          byKey[found] = field;
        }
      }
      for (const [inner, item] of Object.entries(value as Record<string, unknown>)) {
        const field = byKey[inner];
        if (field === undefined) {
          elsewhere.push(`${key}.${inner}=${textOf(item, false)}`);
        } else {
          (values as Record<string, string>)[field] = textOf(item, fields[field]);
        }
      }
    } else if (!OBJECTS.includes(key)) {
      elsewhere.push(`${key}=${textOf(value, false)}`);
    }
  }
  return { values, elsewhere };
}

/** What the form says under the profile list about the chosen profile. */
export function profileNote(profile: IProfile, path: string, elsewhere: string[]): string {
  const parts = [`From ${path}.`];
  if (elsewhere.length) {
    parts.push(`Also applied, no field here: ${elsewhere.join(', ')}.`);
  }
  if (profile.unused.length) {
    parts.push(`Options of a notebook's cell, not used here: ${profile.unused.join(', ')}.`);
  }
  if (profile.error) {
    parts.push(`A start from it would be refused: ${profile.error}`);
  }
  return parts.join(' ');
}

const PROFILE_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;

/** What is wrong with a profile's name ('' when nothing). */
export function profileNameProblem(name: string): string {
  if (!name) {
    return 'expected the name to save the profile as';
  }
  return PROFILE_NAME.test(name)
    ? ''
    : `'${name.slice(0, 80)}': expected 1-64 letters, digits, "_", "." or "-", starting with a letter or digit`;
}
