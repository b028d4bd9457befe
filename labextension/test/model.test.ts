import { IRank, ISession, SessionsModel, foldRanks, formatDuration, lateRanks, launcherOf, ranksLabel } from '../src/model';

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
