/**
 * The one way the panel talks to the server extension's REST API: authenticated and
 * XSRF-protected by JupyterLab's ServerConnection, errors turned into `ApiError` with the
 * server's own message (it names the bad value and what was expected).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** Where the API lives under the server's base URL (see `server/rest-api.yaml`). */
export const API_PREFIX = 'jupyter-dist/api/v1';
/** Who the panel is, as the sessions' notices name it ("interrupted from JupyterLab"). */
export const SENDER = 'JupyterLab';

/** An error the server answered with, or a server that could not be reached. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly reason: string,
    readonly status: number
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** The API URL of ``path`` (``sessions/a/restart``), naming the panel as the sender. */
export function apiUrl(
  path: string,
  query: Record<string, string> = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): string {
  const url = URLExt.join(settings.baseUrl, API_PREFIX, path);
  return url + URLExt.objectToQueryString({ path: SENDER, ...query });
}

/** The message a failed response carries: the server's JSON ``{message, reason}``. */
export function errorOf(status: number, statusText: string, body: string): ApiError {
  let message = statusText || `HTTP ${status}`;
  let reason = '';
  if (body) {
    try {
      const data = JSON.parse(body);
      if (data && typeof data.message === 'string') {
        message = data.message;
      }
      if (data && typeof data.reason === 'string') {
        reason = data.reason;
      }
    } catch {
      message = body.slice(0, 500);
    }
  }
  return new ApiError(message, reason, status);
}

/** One REST call; resolves to the decoded JSON (null for 204). */
export async function requestAPI<T>(
  path: string,
  init: RequestInit = {},
  query: Record<string, string> = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = apiUrl(path, query, settings);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ApiError(`cannot reach the Jupyter server: ${error}`, 'NetworkError', 0);
  }
  const body = await response.text();
  if (!response.ok) {
    throw errorOf(response.status, response.statusText, body);
  }
  return (body ? JSON.parse(body) : null) as T;
}
