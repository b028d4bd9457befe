/**
 * The server's event stream (``/events``, server-sent events) read with ServerConnection's
 * fetch, so it carries the same credentials as every other request. It reconnects with
 * exponential backoff when the stream ends or fails, and stops when asked (the panel is
 * hidden): nothing streams while nobody looks.
 */
import { ServerConnection } from '@jupyterlab/services';

import { apiUrl } from './request';

export type EventHandler = (kind: string, data: any) => void;

/** Parses ``event:``/``data:`` lines from chunks of text; a blank line ends an event. */
export class SSEParser {
  constructor(private onEvent: EventHandler) {}

  feed(chunk: string): void {
    this.buffer += chunk;
    let end: number;
    while ((end = this.buffer.indexOf('\n')) >= 0) {
      const line = this.buffer.slice(0, end).replace(/\r$/, '');
      this.buffer = this.buffer.slice(end + 1);
      if (line === '') {
        if (this.data.length) {
          let data: any = null;
          try {
            data = JSON.parse(this.data.join('\n'));
          } catch {
            data = null;
          }
          if (data !== null) {
            this.onEvent(this.kind || 'message', data);
          }
        }
        this.kind = '';
        this.data = [];
      } else if (line.startsWith(':')) {
        continue; // a keep-alive comment
      } else if (line.startsWith('event:')) {
        this.kind = line.slice(6).trim();
      } else if (line.startsWith('data:')) {
        this.data.push(line.slice(5).trimStart());
      }
    }
  }

  private buffer = '';
  private kind = '';
  private data: string[] = [];
}

/** Seconds to wait before the n-th reconnection (1, 2, 4, ... at most 30). */
export function backoff(attempt: number): number {
  return Math.min(30, 2 ** Math.max(0, attempt));
}

export class EventStream {
  /** ``path``: the API route of the stream (``events``, ``sessions/a/metrics``). */
  constructor(
    private onEvent: EventHandler,
    private onState: (connected: boolean, error: string) => void = () => undefined,
    private path = 'events',
    private query: Record<string, string> = {},
    private settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  get running(): boolean {
    return this.controller !== null;
  }

  start(): void {
    if (this.controller) {
      return;
    }
    this.controller = new AbortController();
    void this.loop(this.controller);
  }

  stop(): void {
    this.controller?.abort();
    this.controller = null;
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }

  private async loop(controller: AbortController): Promise<void> {
    let attempt = 0;
    while (!controller.signal.aborted) {
      let error = '';
      try {
        const response = await ServerConnection.makeRequest(
          apiUrl(this.path, this.query, this.settings),
          { signal: controller.signal },
          this.settings
        );
        if (!response.ok || !response.body) {
          error = `the event stream answered ${response.status}`;
        } else {
          attempt = 0;
          this.onState(true, '');
          const reader = response.body.getReader();
          const decoder = new TextDecoder();
          const parser = new SSEParser(this.onEvent);
          for (;;) {
            const { value, done } = await reader.read();
            if (done) {
              break;
            }
            parser.feed(decoder.decode(value, { stream: true }));
          }
          error = 'the server closed the event stream';
        }
      } catch (err) {
        if (controller.signal.aborted) {
          return;
        }
        error = `the event stream failed: ${err}`;
      }
      this.onState(false, error);
      const wait = backoff(attempt++);
      await new Promise<void>(resolve => {
        this.timer = setTimeout(resolve, wait * 1000);
      });
    }
  }

  private controller: AbortController | null = null;
  private timer: ReturnType<typeof setTimeout> | null = null;
}
