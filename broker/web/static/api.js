// Same-origin JSON API client, visibility-aware polling and live event streams.

let csrfToken = '';
let unauthorizedHandler = () => {};

export function setCsrfToken(token) {
  csrfToken = typeof token === 'string' ? token : '';
}

export function onUnauthorized(fn) {
  unauthorizedHandler = fn;
}

export class ApiError extends Error {
  constructor(status, code, message, fieldViolations = []) {
    super(message);
    this.status = status;
    this.code = code;
    this.fieldViolations = Array.isArray(fieldViolations) ? fieldViolations : [];
  }
}

/**
 * Returns {status, text, data}. `text` is the raw body so pollers can skip
 * re-rendering when nothing changed. Throws ApiError; a 401 also triggers the
 * login screen (except for the login call itself).
 */
export async function request(method, path, body) {
  const headers = {Accept: 'application/json'};
  const init = {method, headers, credentials: 'same-origin', cache: 'no-store'};
  if (method !== 'GET') {
    headers['Content-Type'] = 'application/json';
    if (path !== '/api/login') headers['X-CSRF-Token'] = csrfToken;
    init.body = JSON.stringify(body ?? {});
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, 'UNAVAILABLE', `Cannot reach the broker (${e.message || e}).`);
  }
  const text = res.status === 204 ? '' : await res.text();
  if (!res.ok) {
    let err = {};
    try {
      err = (JSON.parse(text) || {}).error || {};
    } catch {
      // not JSON (proxy error page ...): fall back to the status line
    }
    const message = typeof err.message === 'string' && err.message
      ? err.message : `${res.status} ${res.statusText || 'error'}`;
    const e = new ApiError(res.status, err.code || `HTTP_${res.status}`, message, err.field_violations);
    if (res.status === 401 && path !== '/api/login') unauthorizedHandler(e);
    throw e;
  }
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      throw new ApiError(res.status, 'BAD_RESPONSE', `The broker sent a response that is not JSON (${path}).`);
    }
  }
  return {status: res.status, text, data};
}

export const get = (path) => request('GET', path);
export const post = (path, body) => request('POST', path, body);

/**
 * Runs `fn` now and then every `intervalMs` while the tab is visible; a hidden
 * tab stops polling and resumes (immediately) when shown again.
 */
export function poller(fn, intervalMs) {
  let timer = null;
  let running = false;
  let again = false;
  let stopped = false;

  const schedule = () => {
    if (!stopped && !document.hidden && !timer) timer = setTimeout(tick, intervalMs);
  };
  async function tick() {
    timer = null;
    if (stopped || document.hidden) return;
    running = true;
    try {
      await fn();
    } catch (e) {
      console.debug('poll failed', e);
    } finally {
      running = false;
    }
    if (again) {
      again = false;
      tick();
    } else {
      schedule();
    }
  }
  const onVisibility = () => {
    if (!document.hidden && !timer && !running) tick();
  };
  document.addEventListener('visibilitychange', onVisibility);
  tick();
  return {
    /** Poll right away (after the one in flight, if any). */
    now() {
      if (stopped) return;
      if (timer) {
        clearTimeout(timer);
        timer = null;
      }
      if (running) again = true;
      else tick();
    },
    stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      timer = null;
      document.removeEventListener('visibilitychange', onVisibility);
    },
  };
}

/**
 * EventSource wrapper driving a `data-testid="live"` indicator. EventSource
 * retries by itself while CONNECTING; when it gives up (CLOSED, e.g. the
 * server answered with an error status) we check the session (a 401 shows
 * the login screen) and open a new one after a pause.
 */
export function liveStream(url, indicator, handlers) {
  let es = null;
  let retry = null;
  let closed = false;

  const setState = (state) => {
    indicator.classList.remove('live-open', 'live-wait');
    if (state === 'open') {
      indicator.textContent = 'live';
      indicator.classList.add('live-open');
      indicator.title = 'Receiving job events';
    } else {
      indicator.textContent = state === 'connecting' ? 'live: connecting' : 'live: reconnecting';
      indicator.classList.add('live-wait');
      indicator.title = 'The event stream is not connected; the view refreshes periodically';
    }
  };

  const open = () => {
    if (closed) return;
    setState('connecting');
    es = new EventSource(url, {withCredentials: true});
    es.onopen = () => setState('open');
    es.onerror = (ev) => {
      if (closed) return;
      setState('reconnecting');
      // The server's own `event: error` (its last message before it ends the stream) carries why.
      if (ev && typeof ev.data === 'string' && ev.data) {
        try {
          const info = JSON.parse(ev.data);
          if (info && info.message) indicator.title = `Live updates interrupted: ${info.message}`;
        } catch {
          // not JSON: keep the generic title
        }
      }
      if (es.readyState === EventSource.CLOSED && !retry) {
        get('/api/session').catch(() => {});
        retry = setTimeout(() => {
          retry = null;
          open();
        }, 5000);
      }
    };
    for (const [name, fn] of Object.entries(handlers)) {
      es.addEventListener(name, (ev) => {
        let data = null;
        try {
          data = JSON.parse(ev.data);
        } catch {
          return;
        }
        fn(data);
      });
    }
  };
  open();
  return {
    isOpen: () => Boolean(es && es.readyState === EventSource.OPEN),
    close() {
      closed = true;
      if (retry) clearTimeout(retry);
      if (es) es.close();
    },
  };
}
