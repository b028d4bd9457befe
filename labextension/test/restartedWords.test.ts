import { restartedWords } from '../src/restartedWords';

describe('restartedWords', () => {
  it('says the rank restarted alone and the others kept their variables', () => {
    const text = restartedWords('train', 1, 4);
    expect(text).toContain('Rank 1 of train restarted alone');
    expect(text).toContain('its variables are gone');
    expect(text).toContain('the other 3 ranks kept theirs');
    expect(text.length).toBeLessThan(100); // a notice shows it whole
  });

  it('speaks of one other rank, or none', () => {
    expect(restartedWords('train', 0, 2)).toContain('the other rank kept its own');
    expect(restartedWords('train', 0, 1)).not.toContain('kept');
  });
});
