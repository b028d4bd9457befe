/** Where every rank of a session is now, grouped as `%dist stacks` groups them. */
import { Widget } from '@lumino/widgets';

import { ranksLabel } from './model';

export interface IStackGroup {
  ranks: number[];
  place: string;
  frames: string[];
}

/** A widget listing the groups: "ranks 0-6: in all_reduce (...), cell line 3". */
export function stacksBody(groups: IStackGroup[]): Widget {
  const node = document.createElement('div');
  node.className = 'jp-DistStacks';
  node.setAttribute('role', 'list');
  if (!groups.length) {
    node.textContent = 'No stack dumps came back.';
  }
  for (const group of groups) {
    const item = document.createElement('div');
    item.className = 'jp-DistStacks-group';
    item.setAttribute('role', 'listitem');
    const head = document.createElement('div');
    head.className = 'jp-DistStacks-place';
    head.textContent = `${ranksLabel(group.ranks)}: ${group.place}`;
    item.appendChild(head);
    if (group.frames.length) {
      const frames = document.createElement('pre');
      frames.textContent = group.frames.join('\n');
      item.appendChild(frames);
    }
    node.appendChild(item);
  }
  return new Widget({ node });
}
