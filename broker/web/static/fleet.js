// Fleet page: totals per GPU model, one card per cluster with its domain
// (rack / NVLink clique) picture coloured by free GPUs.
import {get, post, poller} from './api.js';
import {h, replaceChildren} from './dom.js';
import {num, fmtSpan, fmtClock, collator, plural} from './fmt.js';

/** Colour bucket of a domain: f0 = nothing free ... f5 = all free. */
function freeClass(d) {
  const total = Number(d.gpus_total) || 0;
  if (!d.model || total <= 0) return 'cpu';
  const free = Number(d.gpus_free) || 0;
  if (free <= 0) return 'f0';
  if (free >= total) return 'f5';
  const r = free / total;
  return r <= 0.25 ? 'f1' : r <= 0.5 ? 'f2' : r <= 0.75 ? 'f3' : 'f4';
}

const segLabel = (s) => (s === null || s === undefined ? '(none)' : s === '' ? '""' : s);

export function domainTitle(d, probeGpus) {
  const where = (d.path || []).map(segLabel).join(' / ');
  if (!d.model || !(Number(d.gpus_total) > 0)) {
    return `${where} · CPU only · ${num(d.nodes)} ${plural(d.nodes, 'node')}`;
  }
  const n = Number(d.probe_replicas) || 0;
  return `${where} · ${d.model} · ${num(d.gpus_free)} of ${num(d.gpus_total)} free · ` +
    `${num(d.gpus_reserved)} reserved · room for ${num(n)} × ${probeGpus}-GPU ${plural(n, 'replica')}`;
}

/** Why the broker would not place a new gang on the cluster now ('' = it would). */
const unusable = (c) => (!c.connected ? 'disconnected' : c.stale ? 'stale' : c.cordoned ? 'cordoned' : '');

function health(c) {
  if (!c.connected) return {cls: 'bad', text: 'disconnected', title: 'No agent stream'};
  if (c.stale) return {cls: 'warn', text: 'stale', title: 'The last inventory report is too old'};
  return {cls: 'ok', text: 'healthy', title: 'Connected, fresh inventory'};
}

function reportAge(c) {
  if (c.last_report_age_s === null || c.last_report_age_s === undefined) return 'never reported';
  return `report ${fmtSpan(Number(c.last_report_age_s))} ago`;
}

const int = (v) => String(Math.round(Number(v) || 0));

/** Stacked used / reserved / free bar. */
function stackBar(g, extraClass = '') {
  const total = Number(g.total) || 0;
  const bar = h('div', {class: `stack ${extraClass}`, role: 'img',
    'aria-label': `${num(g.used)} used, ${num(g.reserved)} reserved, ${num(g.unavailable || 0)} unavailable, ` +
      `${num(g.free)} free of ${num(total)}`});
  if (total > 0) {
    for (const [key, cls] of [['used', 'seg-used'], ['reserved', 'seg-reserved'], ['unavailable', 'seg-unavail'],
      ['free', 'seg-free']]) {
      const v = Math.max(0, Number(g[key]) || 0);
      if (v <= 0) continue;
      const seg = h('span', {class: cls});
      seg.style.width = `${(100 * v) / total}%`;
      bar.append(seg);
    }
  }
  return bar;
}

const barLegend = () => h('span', {class: 'bar-legend'},
  h('span', {class: 'legend-item'}, h('span', {class: 'sw seg-used'}), 'used'),
  h('span', {class: 'legend-item'}, h('span', {class: 'sw seg-reserved'}), 'reserved'),
  h('span', {class: 'legend-item'}, h('span', {class: 'sw seg-unavail'}), 'unavailable'),
  h('span', {class: 'legend-item'}, h('span', {class: 'sw seg-free'}), 'free'));

function gpuTable(rows, testidPrefix, barClass, withLegend = false) {
  // "unavailable" (GPUs on unready / cordoned nodes) gets a column only when the server reports it.
  const unavail = rows.some((g) => g.unavailable !== undefined && g.unavailable !== null);
  const thead = h('thead', null, h('tr', null,
    h('th', null, 'Model'), h('th', {class: 'num'}, 'Total'), h('th', {class: 'num'}, 'Free'),
    h('th', {class: 'num', title: 'Reserved'}, withLegend ? 'Reserved' : 'Resv.'), h('th', {class: 'num'}, 'Used'),
    unavail ? h('th', {class: 'num', title: 'Unavailable: on unready, cordoned or unhealthy nodes'},
      withLegend ? 'Unavailable' : 'Unav.') : null,
    h('th', {class: 'bar-col'}, withLegend ? barLegend() : '')));
  const tbody = h('tbody');
  for (const g of rows) {
    const model = g.model || '';
    // Plain integers (no separators): the free cell's text must parse as one.
    tbody.append(h('tr', null,
      h('td', {class: 'model', title: model || 'CPU only'}, h('span', {class: 'model-name'}, model || 'CPU only')),
      h('td', {class: 'num'}, int(g.total)),
      h('td', {class: 'num free-num', 'data-testid': `${testidPrefix}${model}`}, int(g.free)),
      h('td', {class: 'num'}, int(g.reserved)),
      h('td', {class: 'num'}, int(g.used)),
      unavail ? h('td', {class: `num ${Number(g.unavailable) > 0 ? 'unavail' : 'muted'}`}, int(g.unavailable)) : null,
      h('td', {class: 'bar-col'}, stackBar(g, barClass))));
  }
  return h('div', {class: 'gpu-wrap'}, h('table', {class: 'tbl gpu-tbl'}, thead, tbody));
}

/** Domains grouped by every path segment but the last (zone → ... → rack). */
function groupDomains(domains) {
  const groups = new Map();
  const sorted = domains.slice().sort((a, b) => {
    const pa = a.path || [];
    const pb = b.path || [];
    for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
      const c = collator.compare(segLabel(pa[i]), segLabel(pb[i]));
      if (c) return c;
    }
    return 0;
  });
  for (const d of sorted) {
    const p = d.path || [];
    const key = p.length > 1 ? p.slice(0, -1).map(segLabel).join(' / ') : '';
    let g = groups.get(key);
    if (!g) groups.set(key, (g = []));
    g.push(d);
  }
  return groups;
}

const pathKey = (d) => JSON.stringify(d.path || []);
const pathAttr = (d) => (d.path || []).map((x) => (x === null || x === undefined ? '' : x)).join('/');

function paintCell(cell, d, probeGpus, gang) {
  const probe = Number(d.probe_replicas) || 0;
  let cls = `cell ${freeClass(d)}`;
  if (probe >= 1) cls += ' fit';
  if (probe >= gang) cls += ' gang';
  if (Number(d.gpus_reserved) > 0) cls += ' res';
  if (cell.classList.contains('sel')) cls += ' sel';
  cell.className = cls;
  cell.dataset.free = String(Number(d.gpus_free) || 0);
  cell.dataset.probe = String(probe);
  cell.title = domainTitle(d, probeGpus);
}

/** The picture plus a path -> {json, cell} map so polls can repaint single cells. */
function domainPicture(c, probeGpus, gang) {
  const domains = Array.isArray(c.domains) ? c.domains : [];
  const pic = h('div', {class: 'dpic'});
  const cells = new Map();
  if (domains.length === 0) {
    pic.append(h('div', {class: 'muted small'}, c.connected ? 'No topology domains reported.' : 'No inventory.'));
    return {pic, cells};
  }
  const frag = document.createDocumentFragment();
  for (const [label, list] of groupDomains(domains)) {
    const row = h('div', {class: 'dcells'});
    for (const d of list) {
      const cell = document.createElement('span');
      cell.dataset.testid = 'domain';
      cell.dataset.path = pathAttr(d);
      paintCell(cell, d, probeGpus, gang);
      cells.set(pathKey(d), {json: JSON.stringify(d), cell, d});
      row.append(cell);
    }
    frag.append(h('div', {class: 'dgroup'},
      label ? h('div', {class: 'dlabel', title: label}, label) : null, row));
  }
  pic.append(frag);
  return {pic, cells};
}

export function mountFleet(root, ctx, route) {
  const probeGpus = ctx.probeGpus;
  const params = route.params;
  const state = {
    gang: Math.max(1, parseInt(params.get('gang') || '8', 10) || 8),
    q: params.get('q') || '',
    sort: params.get('sort') || 'name',
    onlyFit: params.get('fit') === '1',
    compact: params.get('compact') === '1',
  };
  let lastText = null;
  let data = null;
  const cards = new Map(); // name -> {el, top, pic, cells, detail, cluster, json, topJson, domKey}

  // ---- static skeleton ----
  const asOf = h('span', {class: 'muted small', 'data-testid': 'evaluate-time'});
  const summary = h('div', {class: 'summary', 'data-testid': 'fleet-summary'});
  const totalsBox = h('div', {class: 'totals', 'data-testid': 'fleet-totals'});
  const gangInput = h('input', {type: 'number', min: '1', max: '100000', step: '1', value: String(state.gang),
    class: 'input input-num', 'data-testid': 'gang-size', 'aria-label': 'gang size in replicas'});
  const gangCount = h('span', {class: 'gang-count', 'data-testid': 'gang-fit-count'});
  const onlyFit = h('input', {type: 'checkbox', 'data-testid': 'gang-only', checked: state.onlyFit});
  const compact = h('input', {type: 'checkbox', 'data-testid': 'compact', checked: state.compact});
  const search = h('input', {type: 'search', class: 'input', placeholder: 'Filter clusters', title: 'Matches name, region or role',
    value: state.q, 'data-testid': 'cluster-filter', 'aria-label': 'filter clusters'});
  const sortSel = h('select', {class: 'input', 'data-testid': 'cluster-sort', 'aria-label': 'sort clusters'},
    [['name', 'Sort: name'], ['free', 'Sort: free GPUs'], ['block', 'Sort: largest block'],
      ['health', 'Sort: problems first']].map(([v, t]) => h('option', {value: v, selected: state.sort === v}, t)));
  const grid = h('div', {class: 'cluster-grid', 'data-testid': 'clusters'});
  const emptyNote = h('div', {class: 'empty', hidden: true}, 'No cluster matches the filter.');

  const legend = h('div', {class: 'legend', 'data-testid': 'legend'},
    h('span', {class: 'legend-title'}, 'Free GPUs per domain'),
    [['f0', 'none'], ['f1', '≤25%'], ['f2', '≤50%'], ['f3', '≤75%'], ['f4', '<100%'], ['f5', 'all']].map(([cls, t]) =>
      h('span', {class: 'legend-item'}, h('span', {class: `cell ${cls}`}), t)),
    h('span', {class: 'legend-item'}, h('span', {class: 'cell cpu'}), 'CPU only'),
    h('span', {class: 'legend-sep'}),
    h('span', {class: 'legend-item'}, h('span', {class: 'cell f2 fit'}), `room for ≥1 × ${probeGpus}-GPU replica`),
    h('span', {class: 'legend-item gang-legend'}, h('span', {class: 'cell f3 fit gang'}), ''),
    h('span', {class: 'legend-item'}, h('span', {class: 'cell f2 res'}), 'has reserved GPUs'));
  const gangLegendText = legend.querySelector('.gang-legend');

  root.append(
    h('div', {class: 'page-head'},
      h('h2', null, 'Fleet'), asOf, h('div', {class: 'spacer'}), summary),
    totalsBox,
    h('div', {class: 'toolbar'},
      h('label', {class: 'gang-ctl', title: `Clusters with a single domain that can host the whole gang (${probeGpus} GPUs per replica) are outlined`},
        'Gang of ', gangInput, ` × ${probeGpus}-GPU replicas`),
      gangCount,
      h('label', {class: 'check'}, onlyFit, ' only clusters that fit'),
      h('div', {class: 'spacer'}),
      h('div', {class: 'tool-group'},
        h('label', {class: 'check', title: 'Hide the per-model tables'}, compact, ' compact'),
        search, sortSel)),
    legend,
    grid,
    emptyNote);

  const writeHash = () => {
    const p = new URLSearchParams();
    if (state.gang !== 8) p.set('gang', String(state.gang));
    if (state.q) p.set('q', state.q);
    if (state.sort !== 'name') p.set('sort', state.sort);
    if (state.onlyFit) p.set('fit', '1');
    if (state.compact) p.set('compact', '1');
    const s = p.toString();
    history.replaceState(null, '', `#/fleet${s ? `?${s}` : ''}`);
  };

  // ---- cards ----
  /** Everything of a card above the domain picture (cheap to rebuild). */
  function buildTop(c) {
    const name = String(c.name ?? '');
    const hl = health(c);
    const badges = h('div', {class: 'badges'},
      h('span', {class: `badge badge-${hl.cls}`, title: hl.title, 'data-testid': `health-${name}`}, hl.text),
      c.cordoned ? h('span', {class: 'badge badge-cordon', title: c.cordon_reason || 'cordoned (no reason given)',
        'data-testid': `cordoned-${name}`}, 'cordoned') : null);
    const actions = h('div', {class: 'card-actions'});
    if (ctx.isAdmin) {
      actions.append(h('button', {type: 'button', class: `btn btn-small ${c.cordoned ? '' : 'btn-warn'}`,
        'data-testid': `cordon-${name}`, 'data-action': c.cordoned ? 'uncordon' : 'cordon', 'data-cluster': name,
        title: c.cordoned ? 'Let the broker place new jobs here again' : 'Stop placing new jobs on this cluster'},
      c.cordoned ? 'Uncordon' : 'Cordon'));
    }
    const levels = Array.isArray(c.levels) && c.levels.length ? c.levels.join(' › ') : 'no topology levels';
    const gpus = Array.isArray(c.gpus) ? c.gpus : [];
    const largest = Number(c.largest_probe_replicas) || 0;
    return h('div', {class: 'card-top'},
      h('div', {class: 'card-head'},
        h('div', {class: 'card-title'},
          h('h3', null, name),
          h('span', {class: 'muted', title: [c.region, c.role].filter(Boolean).join(' · ')},
            [c.region, c.role].filter(Boolean).join(' · '))),
        badges, h('div', {class: 'spacer'}), actions),
      h('div', {class: 'meta'},
        h('span', {'data-testid': 'report-age'}, reportAge(c)),
        h('span', null, `${num(c.nodes)} ${plural(c.nodes, 'node')}`),
        h('span', null, `${num(c.active_attempts)} active ${plural(c.active_attempts, 'attempt')}`),
        c.agent_version ? h('span', null, `agent ${c.agent_version}`) : null,
        h('span', {title: 'topology levels'}, levels)),
      gpus.length ? gpuTable(gpus, 'cluster-free-', 'stack-sm') : h('div', {class: 'muted small no-gpus'}, 'No GPUs reported.'),
      h('div', {class: 'csum'},
        gpus.length ? gpus.map((g) => h('span', null, h('strong', null, g.model || 'CPU'), ' ',
          h('span', {class: 'free-txt'}, int(g.free)), ` / ${int(g.total)} free`)) : h('span', null, 'no GPUs'),
        h('span', null, reportAge(c))),
      h('div', {class: 'largest', 'data-testid': `largest-block-${name}`,
        title: `The domain with the most room holds ${largest} replicas of ${probeGpus} GPUs`},
      'Largest free block: ', h('strong', null, num(largest)), ` × ${probeGpus} GPUs`,
      h('span', {class: 'fits-note'}, unusable(c) ? ` · fits the gang, but ${unusable(c)}` : ' · fits the gang')));
  }

  function setCardFlags(el, c) {
    el.classList.toggle('is-down', !c.connected);
    el.classList.toggle('is-stale', Boolean(c.connected && c.stale));
    el.classList.toggle('is-cordoned', Boolean(c.cordoned));
  }

  function newCard(c) {
    const name = String(c.name ?? '');
    const top = buildTop(c);
    const {pic, cells} = domainPicture(c, probeGpus, state.gang);
    const detail = h('div', {class: 'ddetail', 'data-testid': 'domain-detail'});
    const el = h('section', {class: 'card cluster', 'data-testid': `cluster-${name}`, 'data-name': name}, top, pic, detail);
    setCardFlags(el, c);
    return {el, top, pic, cells, detail, cluster: c, topJson: '', domKey: '', json: ''};
  }

  /** Rebuilds the parts of a card whose data changed; single cells are repainted in place. */
  function updateCard(entry, c) {
    const {domains, ...rest} = c;
    const topJson = JSON.stringify(rest);
    const list = Array.isArray(domains) ? domains : [];
    const domKey = JSON.stringify(list.map((d) => d.path));
    if (topJson !== entry.topJson) {
      if (entry.topJson) {
        const top = buildTop(c);
        entry.top.replaceWith(top);
        entry.top = top;
        setCardFlags(entry.el, c);
      }
      entry.topJson = topJson;
    }
    if (domKey !== entry.domKey) {
      if (entry.domKey) {
        const {pic, cells} = domainPicture(c, probeGpus, state.gang);
        entry.pic.replaceWith(pic);
        entry.pic = pic;
        entry.cells = cells;
        entry.detail.textContent = '';
      }
      entry.domKey = domKey;
    } else {
      for (const d of list) {
        const slot = entry.cells.get(pathKey(d));
        if (!slot) continue;
        const json = JSON.stringify(d);
        if (json === slot.json) continue;
        slot.json = json;
        slot.d = d;
        paintCell(slot.cell, d, probeGpus, state.gang);
        if (slot.cell.classList.contains('sel')) entry.detail.textContent = detailText(d);
      }
    }
    entry.cluster = c;
  }

  const detailText = (d) => `${domainTitle(d, probeGpus)} · ${d.level || 'domain'} of ${num(d.nodes)} ` +
    `${plural(d.nodes, 'node')}, ${num(d.whole_free_nodes)} wholly free`;

  const matches = (c) => {
    const q = state.q.trim().toLowerCase();
    if (q && ![c.name, c.region, c.role].some((v) => String(v ?? '').toLowerCase().includes(q))) return false;
    if (state.onlyFit && !((Number(c.largest_probe_replicas) || 0) >= state.gang)) return false;
    return true;
  };

  const freeOf = (c) => (c.gpus || []).reduce((s, g) => s + (Number(g.free) || 0), 0);
  const badness = (c) => (!c.connected ? 3 : c.stale ? 2 : c.cordoned ? 1 : 0);
  const sorters = {
    name: (a, b) => collator.compare(a.name, b.name),
    free: (a, b) => freeOf(b) - freeOf(a) || collator.compare(a.name, b.name),
    block: (a, b) => (b.largest_probe_replicas || 0) - (a.largest_probe_replicas || 0) || collator.compare(a.name, b.name),
    health: (a, b) => badness(b) - badness(a) || collator.compare(a.name, b.name),
  };

  /** Order, filter and gang outline: touches only the card nodes, not the cells. */
  function layout() {
    if (!data) return;
    const clusters = (data.clusters || []).slice().sort(sorters[state.sort] || sorters.name);
    let fitCount = 0;
    let usableCount = 0;
    let shown = 0;
    const order = [];
    for (const c of clusters) {
      const entry = cards.get(String(c.name ?? ''));
      if (!entry) continue;
      const fits = (Number(c.largest_probe_replicas) || 0) >= state.gang;
      if (fits) fitCount++;
      if (fits && !unusable(c)) usableCount++;
      entry.el.classList.toggle('gang-fit', fits);
      entry.el.classList.toggle('gang-unusable', fits && Boolean(unusable(c)));
      entry.el.dataset.gangFit = fits ? 'true' : 'false';
      const visible = matches(c);
      entry.el.hidden = !visible;
      if (visible) shown++;
      order.push(entry.el);
    }
    // Re-append only when the order changed (moving 100 cards is cheap but not free).
    const current = [...grid.children];
    if (current.length !== order.length || current.some((el, i) => el !== order[i])) grid.append(...order);
    emptyNote.hidden = shown > 0 || clusters.length === 0;
    gangCount.textContent = `${fitCount} of ${clusters.length} ${plural(clusters.length, 'cluster')} fit it in one domain` +
      (usableCount < fitCount ? ` (${usableCount} schedulable now)` : '');
    gangCount.classList.toggle('none', fitCount === 0);
    gangLegendText.lastChild.textContent = `room for the whole gang (≥${state.gang})`;
  }

  function applyGangToCells() {
    for (const cell of grid.querySelectorAll('.cell')) {
      cell.classList.toggle('gang', Number(cell.dataset.probe) >= state.gang);
    }
  }

  function renderTotals() {
    const totals = Array.isArray(data.totals) ? data.totals : [];
    replaceChildren(totalsBox,
      totals.length ? gpuTable(totals, 'total-free-', 'stack-lg', true) : h('div', {class: 'muted'}, 'No GPUs in the fleet.'));
    const clusters = data.clusters || [];
    const count = (f) => clusters.filter(f).length;
    const healthy = count((c) => c.connected && !c.stale);
    const stale = count((c) => c.connected && c.stale);
    const down = count((c) => !c.connected);
    const cordoned = count((c) => c.cordoned);
    replaceChildren(summary,
      h('span', null, h('strong', null, num(clusters.length)), ` ${plural(clusters.length, 'cluster')}`),
      h('span', {class: 'badge badge-ok'}, `${healthy} healthy`),
      stale ? h('span', {class: 'badge badge-warn'}, `${stale} stale`) : null,
      down ? h('span', {class: 'badge badge-bad'}, `${down} disconnected`) : null,
      cordoned ? h('span', {class: 'badge badge-cordon'}, `${cordoned} cordoned`) : null);
    asOf.textContent = data.evaluate_time ? `as of ${fmtClock(data.evaluate_time)}` : '';
    asOf.title = data.evaluate_time || '';
  }

  function render() {
    renderTotals();
    const seen = new Set();
    for (const c of data.clusters || []) {
      const name = String(c.name ?? '');
      if (seen.has(name)) continue;
      seen.add(name);
      const json = JSON.stringify(c);
      let entry = cards.get(name);
      if (entry && entry.json === json) {
        entry.cluster = c;
        continue;
      }
      if (!entry) {
        entry = newCard(c);
        cards.set(name, entry);
        grid.append(entry.el);
      }
      updateCard(entry, c);
      entry.json = json;
    }
    for (const [name, entry] of cards) {
      if (!seen.has(name)) {
        entry.el.remove();
        cards.delete(name);
      }
    }
    layout();
  }

  async function load() {
    try {
      const {text, data: d} = await get('/api/fleet');
      ctx.clearError('fleet');
      if (text === lastText) return;
      lastText = text;
      data = d || {};
      render();
    } catch (e) {
      ctx.showError('fleet', e);
    }
  }

  // ---- events (delegated) ----
  grid.addEventListener('click', async (ev) => {
    const cell = ev.target.closest('[data-testid="domain"]');
    if (cell) {
      const card = cell.closest('.cluster');
      const detail = card.querySelector('.ddetail');
      const prevSel = card.querySelector('.cell.sel');
      if (prevSel) prevSel.classList.remove('sel');
      if (prevSel === cell) {
        detail.textContent = '';
        return;
      }
      cell.classList.add('sel');
      const entry = cards.get(card.dataset.name);
      let d = null;
      for (const slot of entry ? entry.cells.values() : []) if (slot.cell === cell) d = slot.d;
      detail.textContent = d ? detailText(d) : cell.title;
      return;
    }
    const btn = ev.target.closest('button[data-action]');
    if (!btn) return;
    const name = btn.dataset.cluster;
    const action = btn.dataset.action;
    const reason = window.prompt(`Reason to ${action} cluster ${name}:`, '');
    if (reason === null) return;
    btn.disabled = true;
    try {
      await post(`/api/clusters/${encodeURIComponent(name)}/${action}`, {reason});
      ctx.clearError('cordon');
      poll.now();
    } catch (e) {
      ctx.showError('cordon', e);
      btn.disabled = false;
    }
  });

  gangInput.addEventListener('input', () => {
    const v = parseInt(gangInput.value, 10);
    if (!(v >= 1)) return;
    state.gang = v;
    writeHash();
    applyGangToCells();
    layout();
  });
  onlyFit.addEventListener('change', () => {
    state.onlyFit = onlyFit.checked;
    writeHash();
    layout();
  });
  let searchTimer = null;
  search.addEventListener('input', () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => {
      state.q = search.value;
      writeHash();
      layout();
    }, 120);
  });
  grid.classList.toggle('compact', state.compact);
  compact.addEventListener('change', () => {
    state.compact = compact.checked;
    grid.classList.toggle('compact', state.compact);
    writeHash();
  });
  sortSel.addEventListener('change', () => {
    state.sort = sortSel.value;
    writeHash();
    layout();
  });

  const poll = poller(load, ctx.pollMs);
  return {
    unmount() {
      poll.stop();
      clearTimeout(searchTimer);
    },
  };
}
