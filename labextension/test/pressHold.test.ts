import { MAX_HOLD_MS, PressHold } from '../src/pressHold';

function setup(): { area: EventTarget; doc: EventTarget; clock: { t: number }; drawn: number[]; hold: PressHold } {
  const area = new EventTarget();
  const doc = new EventTarget();
  const clock = { t: 1000 };
  const drawn: number[] = [];
  const hold = new PressHold(area, doc, () => drawn.push(clock.t), () => clock.t);
  return { area, doc, clock, drawn, hold };
}

describe('PressHold', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  it('lets a redraw go when nothing is pressed', () => {
    const { hold, drawn } = setup();
    expect(hold.hold()).toBe(false);
    jest.runAllTimers();
    expect(drawn).toEqual([]);
  });

  it('holds a redraw while pressed and runs it once after the release', () => {
    const { area, doc, hold, drawn } = setup();
    area.dispatchEvent(new Event('pointerdown'));
    expect(hold.hold()).toBe(true);
    expect(hold.hold()).toBe(true);
    expect(drawn).toEqual([]);
    doc.dispatchEvent(new Event('pointerup'));
    expect(drawn).toEqual([]); // not before the click of this release
    jest.runAllTimers();
    expect(drawn).toHaveLength(1);
    expect(hold.hold()).toBe(false);
  });

  it('a release with no held redraw draws nothing', () => {
    const { area, doc, drawn } = setup();
    area.dispatchEvent(new Event('pointerdown'));
    doc.dispatchEvent(new Event('pointercancel'));
    jest.runAllTimers();
    expect(drawn).toEqual([]);
  });

  it('a press whose release never comes holds for MAX_HOLD_MS at most', () => {
    const { area, clock, hold } = setup();
    area.dispatchEvent(new Event('pointerdown'));
    clock.t += MAX_HOLD_MS - 1;
    expect(hold.hold()).toBe(true);
    clock.t += 1;
    expect(hold.hold()).toBe(false);
    expect(hold.hold()).toBe(false);
  });

  it('a press outside the area holds nothing, and dispose stops listening', () => {
    const { area, doc, hold } = setup();
    doc.dispatchEvent(new Event('pointerdown'));
    expect(hold.hold()).toBe(false);
    hold.dispose();
    area.dispatchEvent(new Event('pointerdown'));
    expect(hold.hold()).toBe(false);
  });
});
