// Jobs list: filters in the URL hash, server-side pages, live state updates.
import {get, poller, liveStream} from './api.js';
import {h, throttle} from './dom.js';
import {num, age, fmtTime, humanise, stateName, JOB_STATES, TERMINAL_STATES} from './fmt.js';
import {stateChip, setStateChip, gpuSummary, currentAttempt, jobName} from './jobutil.js';

const PAGE_SIZE = 100;
const TEXT_FILTERS = [
  // [hash / API parameter, label, placeholder, admin only]
  ['tenant', 'Tenant', 'any tenant', true],
  ['cluster', 'Cluster', 'any cluster', false],
  ['gpu_model', 'GPU model', 'any model', false],
  ['job_set', 'Job set', 'any job set', false],
];
const ACTIVE_STATES = JOB_STATES.filter((s) => !TERMINAL_STATES.has(s));

function normState(s) {
  const up = String(s || '').trim().toUpperCase();
  if (!up) return null;
  const full = up.startsWith('JOB_STATE_') ? up : `JOB_STATE_${up}`;
  return JOB_STATES.includes(full) ? full : null;
}

function filtersFrom(params, isAdmin) {
  const f = {states: [...new Set(params.getAll('state').map(normState).filter(Boolean))]};
  for (const [key, , , adminOnly] of TEXT_FILTERS) f[key] = adminOnly && !isAdmin ? '' : (params.get(key) || '').trim();
  f.states.sort((a, b) => JOB_STATES.indexOf(a) - JOB_STATES.indexOf(b));
  return f;
}

function filterParams(f) {
  const p = new URLSearchParams();
  for (const [key] of TEXT_FILTERS) if (f[key]) p.set(key, f[key]);
  for (const s of f.states) p.append('state', s);
  return p;
}

/** Last path for the "back to jobs" link on the job page. */
export let lastJobsHash = '#/jobs';

export function mountJobs(root, ctx, route) {
  let filters = filtersFrom(route.params, ctx.isAdmin);
  let tokens = ['']; // page tokens of the pages visited, for "Previous page"
  let nextToken = '';
  let lastText = null;
  let lastLoad = 0;
  let seq = 0;
  let live = null;
  let liveKey = '';
  const rows = new Map(); // job_id -> {json, tr}

  // ---- filter bar ----
  const inputs = {};
  const fields = [];
  for (const [key, label, placeholder, adminOnly] of TEXT_FILTERS) {
    if (adminOnly && !ctx.isAdmin) continue;
    const input = h('input', {type: 'search', class: 'input', placeholder, value: filters[key],
      'data-testid': `filter-${key.replace('_', '-')}`, 'aria-label': label, spellcheck: 'false'});
    inputs[key] = input;
    fields.push(h('label', {class: 'filter'}, h('span', {class: 'filter-label'}, label), input));
  }
  const stateSummary = h('span', {class: 'dd-value'});
  const checks = JOB_STATES.map((s) => h('input', {type: 'checkbox', value: s, checked: filters.states.includes(s)}));
  const stateMenu = h('div', {class: 'dd-menu'},
    h('div', {class: 'dd-presets'},
      h('button', {type: 'button', class: 'btn btn-small', 'data-preset': 'active'}, 'Active'),
      h('button', {type: 'button', class: 'btn btn-small', 'data-preset': 'queued'}, 'Queued'),
      h('button', {type: 'button', class: 'btn btn-small', 'data-preset': 'terminal'}, 'Finished'),
      h('button', {type: 'button', class: 'btn btn-small', 'data-preset': 'any'}, 'Any')),
    h('div', {class: 'dd-list'}, JOB_STATES.map((s, i) =>
      h('label', {class: 'dd-item'}, checks[i], stateChip(s)))));
  const stateDd = h('details', {class: 'dropdown', 'data-testid': 'filter-state'},
    h('summary', {class: 'input dd-summary'}, stateSummary), stateMenu);
  const clearBtn = h('button', {type: 'button', class: 'btn', 'data-testid': 'filter-clear'}, 'Clear filters');
  const liveEl = h('span', {class: 'live', 'data-testid': 'live'}, 'live: connecting');
  const info = h('span', {class: 'muted small', 'data-testid': 'jobs-info'});

  const tbody = h('tbody');
  const table = h('table', {class: 'tbl jobs-tbl', 'data-testid': 'jobs-table'},
    h('thead', null, h('tr', null,
      h('th', null, 'Job'), h('th', null, 'Name'), h('th', null, 'Tenant'), h('th', null, 'State'),
      h('th', {class: 'num'}, 'GPUs'), h('th', null, 'Cluster'), h('th', null, 'Waiting for'),
      h('th', {class: 'num'}, 'Age'))),
    tbody);
  const empty = h('div', {class: 'empty', 'data-testid': 'jobs-empty', hidden: true}, 'No jobs match these filters.');
  const prevBtn = h('button', {type: 'button', class: 'btn', 'data-testid': 'prev-page', hidden: true}, '← Previous page');
  const nextBtn = h('button', {type: 'button', class: 'btn', 'data-testid': 'next-page', hidden: true}, 'Next page →');
  const pageNo = h('span', {class: 'muted small', 'data-testid': 'page-number'});

  root.append(
    h('div', {class: 'page-head'}, h('h2', null, 'Jobs'), info, h('div', {class: 'spacer'}), liveEl),
    h('div', {class: 'toolbar filters', 'data-testid': 'job-filters'},
      h('label', {class: 'filter'}, h('span', {class: 'filter-label'}, 'State'), stateDd),
      fields, h('div', {class: 'spacer'}), clearBtn),
    h('div', {class: 'table-wrap'}, table, empty),
    h('div', {class: 'pager'}, prevBtn, pageNo, nextBtn));

  function showFilters() {
    for (const [key] of TEXT_FILTERS) if (inputs[key] && inputs[key].value !== filters[key]) inputs[key].value = filters[key];
    checks.forEach((c) => {
      c.checked = filters.states.includes(c.value);
    });
    stateSummary.textContent = filters.states.length === 0 ? 'any state'
      : filters.states.length <= 3 ? filters.states.map(stateName).join(', ')
        : `${filters.states.length} states`;
    const any = filters.states.length > 0 || TEXT_FILTERS.some(([k]) => filters[k]);
    clearBtn.disabled = !any;
  }

  const hashFor = (f) => {
    const s = filterParams(f).toString();
    return `#/jobs${s ? `?${s}` : ''}`;
  };

  function applyFilters(f) {
    filters = f;
    lastJobsHash = hashFor(f);
    if (location.hash !== lastJobsHash) history.replaceState(null, '', lastJobsHash);
    tokens = [''];
    lastText = null;
    showFilters();
    openLive();
    load();
  }

  function readInputs() {
    const f = {...filters, states: checks.filter((c) => c.checked).map((c) => c.value)};
    for (const [key] of TEXT_FILTERS) if (inputs[key]) f[key] = inputs[key].value.trim();
    return f;
  }

  let typing = null;
  for (const input of Object.values(inputs)) {
    input.addEventListener('input', () => {
      clearTimeout(typing);
      typing = setTimeout(() => applyFilters(readInputs()), 400);
    });
    input.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter') {
        clearTimeout(typing);
        applyFilters(readInputs());
      }
    });
  }
  stateMenu.addEventListener('change', () => applyFilters(readInputs()));
  stateMenu.addEventListener('click', (ev) => {
    const b = ev.target.closest('button[data-preset]');
    if (!b) return;
    const preset = {
      active: ACTIVE_STATES, queued: ['JOB_STATE_QUEUED'], any: [],
      terminal: JOB_STATES.filter((s) => TERMINAL_STATES.has(s)),
    }[b.dataset.preset];
    checks.forEach((c) => {
      c.checked = preset.includes(c.value);
    });
    applyFilters(readInputs());
  });
  const closeDropdown = (ev) => {
    if (stateDd.open && !stateDd.contains(ev.target)) stateDd.open = false;
  };
  document.addEventListener('click', closeDropdown);
  clearBtn.addEventListener('click', () => applyFilters(filtersFrom(new URLSearchParams(), ctx.isAdmin)));
  nextBtn.addEventListener('click', () => {
    if (!nextToken) return;
    tokens.push(nextToken);
    lastText = null;
    load().then(() => window.scrollTo({top: 0}));
  });
  prevBtn.addEventListener('click', () => {
    if (tokens.length <= 1) return;
    tokens.pop();
    lastText = null;
    load().then(() => window.scrollTo({top: 0}));
  });

  // ---- rows ----
  function buildRow(job) {
    const id = String(job.job_id ?? '');
    const st = job.status || {};
    const state = st.state || 'JOB_STATE_UNSPECIFIED';
    const g = gpuSummary(job.spec);
    const att = currentAttempt(job);
    let wait = null;
    if (state === 'JOB_STATE_QUEUED' && st.queue_info) {
      const qi = st.queue_info;
      const reason = qi.reason && qi.reason !== 'WAIT_REASON_UNSPECIFIED' ? humanise(qi.reason, 'WAIT_REASON_') : 'not evaluated yet';
      wait = [h('span', {class: 'wait-reason', 'data-testid': 'wait-reason'}, reason),
        qi.message ? h('span', {class: 'wait-msg'}, ` ${qi.message}`) : null];
    }
    const created = st.create_time || '';
    return h('tr', {'data-testid': `job-row-${id}`, 'data-job-id': id},
      h('td', {class: 'mono'}, h('a', {href: `#/jobs/${encodeURIComponent(id)}`, 'data-testid': 'job-link'}, id)),
      h('td', {class: 'name', title: jobName(job)}, jobName(job)),
      h('td', null, job.spec?.tenant || ''),
      h('td', null, stateChip(state, {'data-testid': 'job-state'}), st.held ? h('span', {class: 'chip chip-held', title: `held by ${st.held_by || '?'}`}, 'held') : null),
      h('td', {class: 'num', title: g.title}, g.text),
      h('td', null, att?.cluster || ''),
      h('td', {class: 'wait', title: st.queue_info?.message || ''}, wait),
      h('td', {class: 'num age', 'data-ts': created, title: fmtTime(created)}, age(created)));
  }

  function render(d) {
    const jobs = Array.isArray(d.jobs) ? d.jobs : [];
    nextToken = typeof d.next_page_token === 'string' ? d.next_page_token : '';
    const seen = new Set();
    const order = [];
    for (const job of jobs) {
      const id = String(job.job_id ?? '');
      if (seen.has(id)) continue;
      seen.add(id);
      const json = JSON.stringify(job);
      let entry = rows.get(id);
      if (!entry || entry.json !== json) {
        entry = {json, tr: buildRow(job)};
        rows.set(id, entry);
      }
      order.push(entry.tr);
    }
    for (const id of [...rows.keys()]) if (!seen.has(id)) rows.delete(id);
    const current = [...tbody.children];
    if (current.length !== order.length || current.some((tr, i) => tr !== order[i])) tbody.replaceChildren(...order);
    empty.hidden = jobs.length > 0;
    table.classList.toggle('is-empty', jobs.length === 0);
    nextBtn.hidden = !nextToken;
    prevBtn.hidden = tokens.length <= 1;
    pageNo.textContent = tokens.length > 1 || nextToken ? `page ${tokens.length}` : '';
    const first = (tokens.length - 1) * PAGE_SIZE;
    info.textContent = jobs.length
      ? `${num(first + 1)}–${num(first + jobs.length)}${nextToken ? ' · more on the next page' : ''}`
      : '';
  }

  async function load() {
    const my = ++seq;
    const p = filterParams(filters);
    p.set('page_size', String(PAGE_SIZE));
    const token = tokens[tokens.length - 1];
    if (token) p.set('page_token', token);
    try {
      const {text, data} = await get(`/api/jobs?${p}`);
      if (my !== seq) return;
      lastLoad = Date.now();
      ctx.clearError('jobs');
      if (text === lastText) return;
      lastText = text;
      render(data || {});
    } catch (e) {
      if (my === seq) ctx.showError('jobs', e);
    }
  }
  const refetch = throttle(load, 1000);

  function onJobEvent(ev) {
    const id = ev?.job_id || ev?.job?.job_id;
    const state = ev?.job?.status?.state || ev?.transition?.to_state;
    if (id && state) {
      const tr = tbody.querySelector(`tr[data-testid="job-row-${CSS.escape(id)}"]`);
      const chip = tr?.querySelector('[data-testid="job-state"]');
      if (chip) setStateChip(chip, state);
      const wait = tr?.querySelector('td.wait');
      if (wait && state !== 'JOB_STATE_QUEUED') wait.replaceChildren();
    }
    refetch();
  }

  function openLive() {
    const p = new URLSearchParams();
    if (filters.tenant) p.set('tenant', filters.tenant);
    if (filters.job_set) p.set('job_set', filters.job_set);
    const key = p.toString();
    if (live && key === liveKey) return;
    if (live) live.close();
    liveKey = key;
    live = liveStream(`/api/events${key ? `?${key}` : ''}`, liveEl, {job: onJobEvent});
  }

  // Events drive refreshes; the poll only fills in while the stream is down
  // (and every 15 s to be safe).
  const poll = poller(async () => {
    if (live && live.isOpen() && Date.now() - lastLoad < 15000) return;
    await load();
  }, ctx.pollMs);
  const ageTimer = setInterval(() => {
    for (const td of tbody.querySelectorAll('td.age')) td.textContent = age(td.dataset.ts);
  }, 15000);

  lastJobsHash = hashFor(filters);
  showFilters();
  openLive();

  return {
    update(r) {
      const f = filtersFrom(r.params, ctx.isAdmin);
      if (hashFor(f) !== hashFor(filters)) applyFilters(f);
      return true;
    },
    unmount() {
      poll.stop();
      refetch.cancel();
      clearTimeout(typing);
      clearInterval(ageTimer);
      document.removeEventListener('click', closeDropdown);
      if (live) live.close();
    },
  };
}
