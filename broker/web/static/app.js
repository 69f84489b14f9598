// Tandem fleet view: session, header, error banner and hash routing.
import {get, post, setCsrfToken, onUnauthorized, ApiError} from './api.js';
import {h, replaceChildren} from './dom.js';
import {mountFleet} from './fleet.js';
import {mountQueues} from './queues.js';
import {mountJobs} from './jobs.js';
import {mountJob} from './job.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const userBox = document.getElementById('user');
const whoami = document.getElementById('whoami');
const banner = document.getElementById('error-banner');
const bannerText = document.getElementById('error-text');
const bannerDetails = document.getElementById('error-details');

let session = null;
let page = null; // {unmount(), update?(route)}
let pageName = '';
let returnTo = '';

// ---- error banner: one message per source, the latest one shown ----------
const errors = new Map();

function renderBanner() {
  const last = [...errors.values()].pop();
  if (!last) {
    banner.hidden = true;
    bannerText.textContent = '';
    bannerDetails.replaceChildren();
    return;
  }
  bannerText.textContent = last.message;
  bannerDetails.replaceChildren(...last.details.map((v) =>
    h('li', null, h('code', null, String(v.field ?? '')), ' ', String(v.description ?? ''))));
  banner.hidden = false;
}

function showError(key, err) {
  if (err instanceof ApiError && err.status === 401) return; // the login screen says it
  const message = err instanceof Error ? err.message : String(err);
  errors.delete(key);
  errors.set(key, {message, details: err instanceof ApiError ? err.fieldViolations : []});
  renderBanner();
}

function clearError(key) {
  if (errors.delete(key)) renderBanner();
}

document.getElementById('error-dismiss').addEventListener('click', () => {
  errors.clear();
  renderBanner();
});

// ---- routing -------------------------------------------------------------
function parseRoute() {
  const raw = location.hash.replace(/^#/, '');
  if (raw === 'login' || raw === '/login') return {name: 'login'};
  const q = raw.indexOf('?');
  const path = (q >= 0 ? raw.slice(0, q) : raw).replace(/^\/+|\/+$/g, '');
  const params = new URLSearchParams(q >= 0 ? raw.slice(q + 1) : '');
  if (path === '' || path === 'fleet') return {name: 'fleet', params};
  if (path === 'queues') return {name: 'queues', params};
  if (path === 'jobs') return {name: 'jobs', params};
  const m = /^jobs\/(.+)$/.exec(path);
  if (m) {
    let id = m[1];
    try {
      id = decodeURIComponent(id);
    } catch {
      // keep it raw
    }
    return {name: 'job', id, params};
  }
  return {name: 'notfound', path};
}

const pageContext = () => ({
  session,
  isAdmin: session?.caller?.kind === 'admin',
  pollMs: Math.max(500, (Number(session?.poll_interval_s) || 2) * 1000),
  probeGpus: Number(session?.probe_gpus) || 8,
  showError,
  clearError,
});

function unmountPage() {
  if (page) {
    try {
      page.unmount();
    } catch (e) {
      console.error(e);
    }
  }
  page = null;
  pageName = '';
}

function setActiveTab(name) {
  const tab = name === 'job' ? 'jobs' : name;
  for (const a of nav.querySelectorAll('a[data-tab]')) {
    a.classList.toggle('active', a.dataset.tab === tab);
    if (a.dataset.tab === tab) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

function route() {
  const r = parseRoute();
  if (r.name === 'login') {
    unmountPage();
    showLogin();
    return;
  }
  if (!session) {
    returnTo = location.hash;
    location.replace('#login');
    return;
  }
  renderHeader();
  setActiveTab(r.name);
  // A filter change on the same page (e.g. the back button between two job
  // filters) is handled by the page without a rebuild.
  if (page && pageName === r.name && page.update && page.update(r)) return;
  unmountPage();
  errors.clear();
  renderBanner();
  const root = h('div', {class: `page page-${r.name}`});
  replaceChildren(main, root);
  const ctx = pageContext();
  pageName = r.name;
  if (r.name === 'fleet') page = mountFleet(root, ctx, r);
  else if (r.name === 'queues') page = mountQueues(root, ctx, r);
  else if (r.name === 'jobs') page = mountJobs(root, ctx, r);
  else if (r.name === 'job') page = mountJob(root, ctx, r);
  else {
    root.append(h('div', {class: 'empty'}, 'No such page. ', h('a', {href: '#/fleet'}, 'Go to the fleet')));
    page = {unmount() {}};
  }
  document.title = `Tandem · ${r.name === 'job' ? r.id : r.name}`;
}

// ---- session -------------------------------------------------------------
function renderHeader() {
  const caller = session?.caller || {};
  whoami.textContent = `${caller.name || '?'} (${caller.kind || '?'})`;
  whoami.title = caller.kind === 'admin' ? 'Signed in as an administrator' : `Signed in as tenant ${caller.name || ''}`;
  nav.hidden = false;
  userBox.hidden = false;
}

// A non-secret hint that this browser logged in: without it the page shows the login screen straight
// away instead of asking /api/session for a 401 (which Chromium reports as a console error).
const HINT = 'tandem.logged-in';
function setHint(on) {
  try {
    if (on) localStorage.setItem(HINT, '1');
    else localStorage.removeItem(HINT);
  } catch {
    // storage disabled: every load asks the server
  }
}
function hasHint() {
  try {
    return localStorage.getItem(HINT) === '1';
  } catch {
    return true;
  }
}

function setSession(s) {
  session = s && typeof s === 'object' ? s : null;
  setCsrfToken(session?.csrf_token);
  setHint(Boolean(session));
}

onUnauthorized(() => {
  if (parseRoute().name === 'login') return;
  setSession(null);
  unmountPage();
  returnTo = location.hash;
  location.replace('#login');
});

function showLogin() {
  nav.hidden = true;
  userBox.hidden = true;
  errors.clear();
  renderBanner();
  document.title = 'Tandem · sign in';
  const input = h('input', {
    id: 'login-token', type: 'password', autocomplete: 'off', spellcheck: 'false',
    placeholder: 'Bearer token', required: true, 'aria-label': 'Bearer token',
  });
  const submit = h('button', {id: 'login-submit', type: 'submit', class: 'btn btn-primary'}, 'Sign in');
  const errLine = h('div', {class: 'login-error', 'data-testid': 'login-error', role: 'alert'});
  const form = h('form', {class: 'login-card', autocomplete: 'off'},
    h('h1', null, 'Sign in to Tandem'),
    h('p', {class: 'muted'}, 'Paste the bearer token you use with the tandem CLI. It is exchanged for a session cookie and not stored by the page.'),
    h('label', {for: 'login-token', class: 'field-label'}, 'Token'),
    input,
    errLine,
    submit);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const token = input.value.trim();
    if (!token) {
      errLine.textContent = 'Enter a token.';
      return;
    }
    submit.disabled = true;
    errLine.textContent = '';
    try {
      const {data} = await post('/api/login', {token});
      input.value = '';
      setSession(data);
      const target = returnTo && returnTo !== '#login' ? returnTo : '#/fleet';
      returnTo = '';
      if (location.hash === target) route();
      else location.hash = target;
    } catch (e) {
      errLine.textContent = e.message || 'Sign-in failed.';
      input.select();
    } finally {
      submit.disabled = false;
    }
  });
  replaceChildren(main, h('div', {class: 'login-wrap'}, form));
  input.focus();
}

document.getElementById('logout').addEventListener('click', async () => {
  try {
    await post('/api/logout', {});
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 401)) {
      showError('logout', e);
      return;
    }
  }
  setSession(null);
  unmountPage();
  returnTo = '';
  location.hash = '#login';
});

window.addEventListener('hashchange', route);

async function boot() {
  if (!hasHint()) {
    if (parseRoute().name === 'login') route();
    else {
      returnTo = location.hash;
      location.replace('#login');
    }
    return;
  }
  try {
    const {data} = await get('/api/session');
    setSession(data);
    if (parseRoute().name === 'login') location.replace('#/fleet');
    route();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      if (parseRoute().name === 'login') route();
      return; // onUnauthorized already went to #login
    }
    showError('session', e);
    replaceChildren(main, h('div', {class: 'empty'},
      'The broker did not answer. ',
      h('button', {type: 'button', class: 'btn', onclick: () => {
        clearError('session');
        boot();
      }}, 'Retry')));
  }
}

boot();
