import { restartQuestion } from '../src/restartQuestion';

describe('restartQuestion', () => {
  it('says that the whole session restarts, with its ranks counted', () => {
    const text = restartQuestion('train', 1, 4);
    expect(text).toContain('rank 1 of session train');
    expect(text).toContain('A rank cannot restart alone');
    expect(text).toContain('restarts all 4 ranks of train');
    expect(text).toContain('variables in every rank are lost');
  });

  it('does without the count when the session did not say it', () => {
    expect(restartQuestion('train', 0, 0)).toContain('restarts all its ranks of train');
  });
});
