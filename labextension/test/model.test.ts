import { IRank, ISession, SessionsModel, foldRanks, formatDuration, lateRanks, launcherOf, ranksLabel, sessionBadge } from '../src/model';
import { INewSession, checkForm, fieldOfMessage, requestOf } from '../src/sessionRequest';

function rank(n: number, state = 'idle', extra: Partial<IRank> = {}): IRank {
  return { rank: n, local_rank: n, node_rank: 0, host: 'a', pid: 100 + n, state, exit: null, log: '', ...extra };
}

function session(ranks: IRank[], extra: Partial<ISession> = {}): ISession {
  return {
    name: 's', state: 'ready', shape: '', spec: {}, world_size: ranks.length, backend: 'gloo',
    device: 'cpu', cells_run: 0, broken_reason: '', nodes: [], ranks, ...extra
  };
}

describe('ranks', () => {
  it('are labelled as runs', () => {
    expect(ranksLabel([3])).toBe('rank 3');
    expect(ranksLabel([0, 1, 2, 3])).toBe('ranks 0-3');
    expect(ranksLabel([5, 0, 2, 6, 7])).toBe('ranks 0,2,5-7');
  });

  it('fold runs of plain idle ranks, never busy or failed ones', () => {
    const rows = foldRanks([
      rank(0, 'busy'), rank(1), rank(2), rank(3, 'idle', { last_error: 'ValueError: x' }), rank(4), rank(5), rank(6)
    ]);
    expect(rows.map(r => [r.folded, r.ranks.map(x => x.rank)])).toEqual([
      [false, [0]], [true, [1, 2]], [false, [3]], [true, [4, 5, 6]]
    ]);
  });

  it('32 idle ranks make one row', () => {
    const rows = foldRanks(Array.from({ length: 32 }, (_, i) => rank(i)));
    expect(rows).toHaveLength(1);
    expect(ranksLabel(rows[0].ranks.map(r => r.rank))).toBe('ranks 0-31');
  });

  it('a rank still busy while another is done is late, after a grace', () => {
    const running = { turn_id: 't', kind: 'cell', path: 'a.ipynb', kernel_id: 'k', started: 100 };
    const s = session([rank(0, 'busy'), rank(1)], { running });
    expect(lateRanks(s, 103)).toEqual([]);
    expect(lateRanks(s, 110)).toEqual([0]);
    expect(lateRanks(session([rank(0, 'busy'), rank(1, 'busy')], { running }), 200)).toEqual([]);
    expect(lateRanks(session([rank(0, 'busy'), rank(1)]), 200)).toEqual([]);
  });
});

describe('sessions', () => {
  it('follow the event stream', () => {
    const model = new SessionsModel();
    let changes = 0;
    const notices: string[] = [];
    model.changed.connect(() => changes++);
    model.noticed.connect((_, text) => notices.push(text));
    model.apply('snapshot', { sessions: [session([rank(0)], { name: 'b' }), session([], { name: 'a' })] });
    expect(model.sessions.map(s => s.name)).toEqual(['a', 'b']);
    model.apply('session', { session: session([rank(0, 'busy')], { name: 'a' }) });
    expect(model.get('a')?.ranks[0].state).toBe('busy');
    model.apply('removed', { name: 'b' });
    expect(model.sessions.map(s => s.name)).toEqual(['a']);
    model.apply('notice', { text: "session 'a' was restarted from x.ipynb" });
    model.apply('bogus', {});
    expect(changes).toBe(3);
    expect(notices).toEqual(["session 'a' was restarted from x.ipynb"]);
  });

  it("leave out the notice of this page's own action, not another's", () => {
    const model = new SessionsModel();
    const notices: string[] = [];
    model.noticed.connect((_, text) => notices.push(text));
    const ours = { path: 'JupyterLab', kernel_id: '' };
    model.expectOwn('a', 'interrupt');
    model.apply('notice', { name: 'a', action: 'interrupt', by: ours, text: 'from this page' });
    // the next one is another page's (or a notebook's): shown
    model.apply('notice', { name: 'a', action: 'interrupt', by: ours, text: 'another page' });
    model.apply('notice', { name: 'a', action: 'restart', by: { path: 'x.ipynb' }, text: 'x' });
    expect(notices).toEqual(['another page', 'x']);
  });

  it('say what a start does, and a start that failed leaves no session behind', () => {
    const model = new SessionsModel();
    model.apply('snapshot', { sessions: [] });
    // the start's progress comes before the server lists the session
    model.apply('progress', { name: 'on-ray', text: 'Ray cluster 127.0.0.1:9 (given by --ray-address): connecting' });
    expect(model.progressOf('on-ray')).toBe('Ray cluster 127.0.0.1:9 (given by --ray-address): connecting');
    model.apply('session', { session: session([rank(0, 'starting')], { name: 'on-ray', state: 'starting' }) });
    expect(model.progressOf('on-ray')).toBe('Ray cluster 127.0.0.1:9 (given by --ray-address): connecting');
    // it failed: the session stops, and stopped is gone (no card, no buttons that find nothing)
    model.apply('session', { session: session([], { name: 'on-ray', state: 'stopped' }) });
    expect(model.get('on-ray')).toBeUndefined();
    expect(model.progressOf('on-ray')).toBe('');
    // a ready session's restart says its progress its own way
    model.apply('session', { session: session([rank(0)], { name: 'r' }) });
    model.apply('progress', { name: 'r', text: 'restarting' });
    expect(model.progressOf('r')).toBe('');
    expect(model.sessions.map(s => s.name)).toEqual(['r']);
  });

  it('name their launcher and durations', () => {
    expect(launcherOf(session([]))).toBe('local');
    expect(launcherOf(session([], { spec: { hosts: ['a'] } }))).toBe('SSH');
    expect(launcherOf(session([], { spec: { launcher: 'slurm' } }))).toBe('Slurm');
    expect(formatDuration(5.7)).toBe('5 s');
    expect(formatDuration(250)).toBe('4 min 10 s');
    expect(formatDuration(7500)).toBe('2 h 5 min');
  });
});

describe('nodes', () => {
  it('group ranks under their node, in order, for a two-node session', () => {
    const { nodesOf } = require('../src/model');
    const ranks = [0, 1, 2, 3].map(n => ({ ...rank(n), node_rank: n < 2 ? 0 : 1, host: n < 2 ? 'a' : 'b' }));
    const nodes = [
      { node_rank: 1, host: 'b', agent_pid: 2, gpus: [], lost: false },
      { node_rank: 0, host: 'a', agent_pid: 1, gpus: [], lost: false }
    ];
    const grouped = nodesOf(session(ranks, { nodes }));
    expect(grouped.map((g: any) => [g.node.host, g.ranks.map((r: IRank) => r.rank)])).toEqual([
      ['a', [0, 1]],
      ['b', [2, 3]]
    ]);
  });
});

describe('a session badge', () => {
  const now = 10_000;

  it('says ready while every rank is idle, and the state of a session not ready', () => {
    expect(sessionBadge(session([rank(0), rank(1)]), now)).toMatchObject({ state: 'ready', label: 'ready' });
    const broken = session([rank(0)], { state: 'broken', broken_reason: 'its restart failed' });
    expect(sessionBadge(broken, now)).toMatchObject({ state: 'broken', title: 'its restart failed' });
  });

  it('says a degraded session is degraded, with what happened to each lost rank', () => {
    const degraded = session([rank(0)], {
      state: 'degraded',
      broken_reason: 'rank 1 (host a, pid 9) killed by signal SIGKILL (9)',
      faults: ['rank 1 died (killed by signal SIGKILL (9))', 'rank 2 was lost (node b unreachable)']
    });
    expect(sessionBadge(degraded, now)).toMatchObject({
      state: 'degraded',
      label: 'degraded',
      title: 'rank 1 died (killed by signal SIGKILL (9)); rank 2 was lost (node b unreachable)'
    });
    expect(sessionBadge(session([rank(0)], { state: 'healing' }), now).state).toBe('healing');
  });

  it('says busy, with how long, while a cell runs on every rank', () => {
    const running = { turn_id: 't', kind: 'cell', path: 'train.ipynb', kernel_id: 'k', started: now - 600 };
    const s = session([rank(0, 'busy', { busy_since: now - 600 }), rank(1, 'busy', { busy_since: now - 600 })], {
      running,
      straggler_s: 30
    });
    expect(sessionBadge(s, now)).toMatchObject({ state: 'busy', label: 'busy 10 min 0 s', stuck: [] });
    expect(sessionBadge(s, now).title).toContain('train.ipynb');
  });

  it('says stuck once a rank is busy past the threshold with no cell waiting for it', () => {
    const s = session([rank(0, 'busy', { busy_since: now - 125 }), rank(1)], { straggler_s: 30 });
    const badge = sessionBadge(s, now);
    expect(badge).toMatchObject({ state: 'stuck', label: 'stuck 2 min 5 s', stuck: [0] });
    expect(badge.title).toContain('rank 0 busy for 2 min 5 s with no cell waiting');
    // not yet past it: busy
    const early = session([rank(0, 'busy', { busy_since: now - 10 }), rank(1)], { straggler_s: 30 });
    expect(sessionBadge(early, now).state).toBe('busy');
    // the server's threshold counts, not the default
    const patient = session([rank(0, 'busy', { busy_since: now - 125 }), rank(1)], { straggler_s: 600 });
    expect(sessionBadge(patient, now).state).toBe('busy');
  });

  it('says stuck for a rank long busy beside ranks of its cell that finished, not beside others', () => {
    const running = { turn_id: 't', kind: 'cell', path: 'a.ipynb', kernel_id: 'k', started: now - 100 };
    const s = session([rank(0, 'busy', { busy_since: now - 100 }), rank(1)], { running, straggler_s: 30 });
    expect(sessionBadge(s, now)).toMatchObject({ state: 'stuck', stuck: [0] });
    expect(sessionBadge(s, now).title).toContain('while rank 1 finished');
    const alone = session([rank(0, 'busy', { busy_since: now - 100 }), rank(1)], {
      running: { ...running, ranks: [0] },
      straggler_s: 30
    });
    expect(sessionBadge(alone, now).state).toBe('busy');
  });
});

describe('the new-session form', () => {
  const form = (extra: Partial<INewSession> = {}): INewSession => ({
    name: 'train', launcher: 'local', hosts: '', nodes: '', kind: 'procs', count: '2', backend: '', ...extra
  });

  it('marks each bad field with what it expects', () => {
    expect(checkForm(form())).toEqual({});
    const wrong = checkForm(form({ name: 'bad name', nodes: 'two', count: 'abc', launcher: 'ssh' }));
    expect(Object.keys(wrong).sort()).toEqual(['count', 'hosts', 'name', 'nodes']);
    expect(wrong.count).toContain("'abc': expected a number of processes per node");
    expect(wrong.nodes).toContain("'two'");
    expect(checkForm(form({ count: '4, 2', nodes: '2' }))).toEqual({});
  });

  it("finds the field a server's message is about", () => {
    expect(fieldOfMessage("procs: 'abc' is not a int or list")).toBe('count');
    expect(fieldOfMessage("--session 'a b': expected 1-64 letters")).toBe('name');
    expect(fieldOfMessage('hosts: no such host')).toBe('hosts');
    expect(fieldOfMessage('the server is gone')).toBeNull();
  });

  it('posts launcher "ray" and a ray object with what was filled in', () => {
    const ray = form({ launcher: 'ray', nodes: '2', kind: 'gpus', count: '4', rayStrategy: 'PACK' });
    expect(requestOf(ray)).toEqual({
      name: 'train', launcher: 'ray', nodes: 2, gpus: 4, ray: { strategy: 'PACK' }
    });
    const full = form({
      launcher: 'ray', nodes: '2', count: '2', hosts: 'left,from,ssh', rayAddress: ' head:6379 ',
      rayStrategy: 'SPREAD', rayCpus: '2', rayGpus: '0', rayRuntimeEnv: '{"pip": ["jupyter_dist"]}',
      rayResources: ' accelerator_type=A100,TPU=1 '
    });
    expect(requestOf(full)).toEqual({
      name: 'train', launcher: 'ray', nodes: 2, procs: 2,
      ray: {
        address: 'head:6379', strategy: 'SPREAD', cpus: 2, gpus: 0, runtime_env: '{"pip": ["jupyter_dist"]}',
        resources: 'accelerator_type=A100,TPU=1'
      }
    });
    // nothing of Ray's for another launcher, whatever its hidden fields hold
    expect(requestOf(form({ rayCpus: '3', rayAddress: 'head:6379' }))).toEqual({ name: 'train', procs: 2 });
  });

  it("checks Ray's fields in place, naming the value and what is expected", () => {
    const ray = (extra: Partial<INewSession>) => checkForm(form({ launcher: 'ray', nodes: '2', ...extra }));
    expect(ray({})).toEqual({});
    expect(ray({ rayAddress: 'auto', rayCpus: '4', rayGpus: '0', rayRuntimeEnv: '{}' })).toEqual({});
    const wrong = ray({
      rayAddress: 'ray://head:10001', rayCpus: '0', rayGpus: 'two', rayRuntimeEnv: '["pip"]', hosts: 'a,b'
    });
    expect(Object.keys(wrong).sort()).toEqual(['hosts', 'rayAddress', 'rayCpus', 'rayGpus', 'rayRuntimeEnv']);
    expect(wrong.rayAddress).toContain("'ray://head:10001': Ray Client addresses (ray://)");
    expect(wrong.rayCpus).toContain("'0': expected a whole number of CPUs");
    expect(wrong.rayGpus).toContain("'two': expected a whole number of GPUs");
    expect(wrong.rayRuntimeEnv).toContain('\'["pip"]\': not a JSON object; expected a JSON object');
    expect(ray({ rayRuntimeEnv: '{pip' }).rayRuntimeEnv).toContain("'{pip': not JSON");
    expect(ray({ rayAddress: 'head' }).rayAddress).toContain("'head': expected the cluster's HOST:PORT");
  });

  it("puts the server's messages about the ray object at their field", () => {
    expect(fieldOfMessage('ray: --ray-cpus 0: expected 1 to 4096')).toBe('rayCpus');
    expect(fieldOfMessage("ray: --ray-runtime-env '{': not JSON")).toBe('rayRuntimeEnv');
    expect(fieldOfMessage("ray: --ray-address 'h': expected HOST:PORT")).toBe('rayAddress');
    expect(fieldOfMessage("ray.gpus: 'x' is not a int")).toBe('rayGpus');
    expect(fieldOfMessage("ray: --ray-resources 'CPU=2': CPU is --ray-cpus'")).toBe('rayResources');
    expect(fieldOfMessage('ray options without --ray: add --ray')).toBe('launcher');
  });

  it('sends counts per node as a list', () => {
    expect(requestOf(form({ count: '4,2', nodes: '2' }))).toEqual({ name: 'train', procs: [4, 2], nodes: 2 });
    expect(requestOf(form({ count: '3' }))).toEqual({ name: 'train', procs: 3 });
  });
});
