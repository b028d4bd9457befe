import { SSEParser, backoff } from '../src/events';
import { errorOf } from '../src/request';
import { requestOf } from '../src/sessionRequest';

describe('errors', () => {
  it('carry the server message and reason', () => {
    const err = errorOf(400, 'Bad Request', JSON.stringify({ message: '--procs 0: expected a whole number', reason: 'SpecError' }));
    expect(err.message).toBe('--procs 0: expected a whole number');
    expect(err.reason).toBe('SpecError');
    expect(err.status).toBe(400);
  });

  it('fall back to the status text or the body', () => {
    expect(errorOf(502, 'Bad Gateway', '').message).toBe('Bad Gateway');
    expect(errorOf(500, '', '<html>oops</html>').message).toBe('<html>oops</html>');
  });
});

describe('the event stream', () => {
  it('parses events split anywhere, skipping keep-alives', () => {
    const seen: [string, any][] = [];
    const parser = new SSEParser((kind, data) => seen.push([kind, data]));
    const text = ': keep-alive\n\nevent: session\ndata: {"session": {"name": "a"}}\n\nevent: removed\r\ndata: {"name": "a"}\r\n\r\n';
    for (const piece of [text.slice(0, 7), text.slice(7, 40), text.slice(40)]) {
      parser.feed(piece);
    }
    expect(seen).toEqual([['session', { session: { name: 'a' } }], ['removed', { name: 'a' }]]);
  });

  it('backs off exponentially up to 30 s', () => {
    expect([0, 1, 2, 3, 4, 5, 9].map(backoff)).toEqual([1, 2, 4, 8, 16, 30, 30]);
  });
});

describe('the new-session form', () => {
  it('sends only what was filled in', () => {
    expect(requestOf({ name: '', launcher: 'local', hosts: '', nodes: '', kind: 'procs', count: '2', backend: '' }))
      .toEqual({ name: 'default', procs: 2 });
    expect(requestOf({ name: 'x', launcher: 'ssh', hosts: 'a,b', nodes: '2', kind: 'gpus', count: '4,2', backend: 'nccl' }))
      .toEqual({ name: 'x', launcher: 'ssh', hosts: 'a,b', nodes: 2, gpus: [4, 2], backend: 'nccl' });
  });
});
