import { MAX_DELAY_MS, delayAfterError } from '../src/pollDelay';

describe('delayAfterError', () => {
  it('stops asking about a session that is gone', () => {
    expect(delayAfterError(404, 1000, 1000)).toBeNull();
  });

  it('backs off from a server that fails or does not answer, up to a bound', () => {
    expect(delayAfterError(0, 1000, 1000)).toBe(2000);
    expect(delayAfterError(500, 2000, 1000)).toBe(4000);
    expect(delayAfterError(0, MAX_DELAY_MS, 1000)).toBe(MAX_DELAY_MS);
  });
});
