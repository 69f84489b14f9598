// Queues page: fleet-wide queue strip, then per tenant usage vs fair share vs
// demand and a per-GPU-model table (in use, quota, borrowed, pending).
import {get, poller} from './api.js';
import {h, replaceChildren} from './dom.js';
import {num, humanise, fmtClock, collator} from './fmt.js';

const waitLabel = (r) => humanise(r, 'WAIT_REASON_');
const modelLabel = (m) => (m === '' ? 'any model' : m === '*' ? '* (other models)' : m);

function entries(obj) {
  return obj && typeof obj === 'object' ? Object.entries(obj) : [];
}

function waitingChips(waiting, testid) {
  const list = entries(waiting).filter(([, n]) => Number(n) > 0).sort((a, b) => b[1] - a[1]);
  if (!list.length) return h('span', {class: 'muted'}, 'nothing waiting');
  return h('span', {class: 'chips', 'data-testid': testid},
    list.map(([reason, n]) => h('span', {class: 'kv-chip', title: reason, 'data-reason': reason},
      h('span', {class: 'kv-k'}, waitLabel(reason)), h('span', {class: 'kv-v'}, num(n)))));
}

function stat(label, value, testid) {
  return h('div', {class: 'stat'}, h('div', {class: 'stat-label'}, label),
    h('div', {class: 'stat-value', 'data-testid': testid}, value));
}

/** usage (solid) and demand (light) bars with a fair-share marker, one scale for all tenants. */
function shareBar(t, scale) {
  const pct = (v) => `${Math.min(100, (100 * Math.max(0, Number(v) || 0)) / scale)}%`;
  const usage = h('span', {class: 'sb-usage'});
  usage.style.width = pct(t.usage_cost);
  const demand = h('span', {class: 'sb-demand'});
  demand.style.width = pct(t.demand_cost);
  const fair = h('span', {class: 'sb-fair', title: `fair share ${num(t.fair_share_cost)}`});
  fair.style.left = pct(t.fair_share_cost);
  const over = Number(t.usage_cost) > Number(t.fair_share_cost);
  usage.classList.toggle('over', over);
  return h('div', {class: 'sharebar', role: 'img',
    'aria-label': `usage ${num(t.usage_cost)}, fair share ${num(t.fair_share_cost)}, demand ${num(t.demand_cost)}`},
  demand, usage, fair);
}

function tenantModels(t) {
  const keys = new Set();
  for (const f of ['gpus', 'quotas', 'borrowed', 'pending_gpus']) for (const [k] of entries(t[f])) keys.add(k);
  return [...keys].sort((a, b) => (a === '*') - (b === '*') || (a === '') - (b === '') || collator.compare(a, b));
}

function tenantCard(t, scale) {
  const name = String(t.tenant ?? '');
  const quotas = t.quotas || {};
  const hasStar = Object.prototype.hasOwnProperty.call(quotas, '*');
  const rows = tenantModels(t).map((m) => {
    let quota;
    if (Object.prototype.hasOwnProperty.call(quotas, m)) quota = h('span', null, num(quotas[m]));
    else if (hasStar && m !== '') quota = h('span', {class: 'muted', title: 'counted against the "*" quota'}, 'in *');
    else quota = h('span', {class: 'muted', title: 'no quota limit'}, '—');
    const borrowed = Number((t.borrowed || {})[m]) || 0;
    return h('tr', {'data-model': m},
      h('td', {class: 'model'}, modelLabel(m)),
      h('td', {class: 'num'}, num((t.gpus || {})[m] || 0)),
      h('td', {class: 'num'}, quota),
      h('td', {class: `num ${borrowed > 0 ? 'borrowed' : ''}`}, num(borrowed)),
      h('td', {class: 'num'}, num((t.pending_gpus || {})[m] || 0)));
  });
  const table = rows.length
    ? h('table', {class: 'tbl'},
      h('thead', null, h('tr', null, h('th', null, 'GPU model'), h('th', {class: 'num'}, 'In use'),
        h('th', {class: 'num'}, 'Quota'), h('th', {class: 'num'}, 'Borrowed'), h('th', {class: 'num'}, 'Pending'))),
      h('tbody', null, rows))
    : h('div', {class: 'muted small'}, 'No GPUs held, queued or limited.');
  const usage = Number(t.usage_cost) || 0;
  const fair = Number(t.fair_share_cost) || 0;
  return h('section', {class: 'card tenant', 'data-testid': `tenant-${name}`},
    h('div', {class: 'card-head'},
      h('div', {class: 'card-title'}, h('h3', null, name), h('span', {class: 'muted'}, `weight ${num(t.weight)}`)),
      h('div', {class: 'spacer'}),
      h('span', {class: 'queued-count'}, h('strong', {'data-testid': 'tenant-queued'}, num(t.queued)), ' queued')),
    h('div', {class: 'share'},
      shareBar(t, scale),
      h('div', {class: 'share-nums'},
        h('span', {class: 'sn sn-usage'}, 'usage ', h('strong', {'data-testid': 'usage-cost', class: usage > fair ? 'over' : ''}, num(usage))),
        h('span', {class: 'sn sn-fair'}, 'fair share ', h('strong', {'data-testid': 'fair-share-cost'}, num(fair))),
        h('span', {class: 'sn sn-demand'}, 'demand ', h('strong', {'data-testid': 'demand-cost'}, num(t.demand_cost))))),
    table,
    h('div', {class: 'waiting'}, h('span', {class: 'muted'}, 'Waiting: '), waitingChips(t.waiting, 'tenant-waiting')));
}

export function mountQueues(root, ctx) {
  let lastText = null;
  const asOf = h('span', {class: 'muted small', 'data-testid': 'evaluate-time'});
  const strip = h('div', {class: 'card strip', 'data-testid': 'queue-strip'});
  const list = h('div', {class: 'tenant-grid', 'data-testid': 'tenants'});
  const legend = h('div', {class: 'legend'},
    h('span', {class: 'legend-title'}, 'Cost units'),
    h('span', {class: 'legend-item'}, h('span', {class: 'sw sw-usage'}), 'usage (held now)'),
    h('span', {class: 'legend-item'}, h('span', {class: 'sw sw-over'}), 'usage above fair share'),
    h('span', {class: 'legend-item'}, h('span', {class: 'sw sw-demand'}), 'demand (held + queued)'),
    h('span', {class: 'legend-item'}, h('span', {class: 'sw sw-fair'}), 'fair share'));
  root.append(h('div', {class: 'page-head'}, h('h2', null, 'Queues'), asOf), strip, legend, list);

  function render(d) {
    const fleet = d.fleet || {};
    const pending = entries(fleet.pending_gpus).filter(([, n]) => Number(n) > 0)
      .sort((a, b) => collator.compare(a[0], b[0]));
    replaceChildren(strip,
      stat('Queued jobs', num(fleet.queued || 0), 'fleet-queued'),
      h('div', {class: 'stat stat-wide'}, h('div', {class: 'stat-label'}, 'Waiting by reason'),
        waitingChips(fleet.waiting, 'fleet-waiting')),
      h('div', {class: 'stat stat-wide'}, h('div', {class: 'stat-label'}, 'Pending GPUs'),
        pending.length
          ? h('span', {class: 'chips', 'data-testid': 'fleet-pending'}, pending.map(([m, n]) =>
            h('span', {class: 'kv-chip', 'data-model': m}, h('span', {class: 'kv-k'}, modelLabel(m)), h('span', {class: 'kv-v'}, num(n)))))
          : h('span', {class: 'muted'}, 'none')),
      stat('Fleet capacity', num(d.capacity_cost || 0), 'capacity-cost'));
    const tenants = Array.isArray(d.tenants) ? d.tenants : [];
    let scale = 0;
    for (const t of tenants) scale = Math.max(scale, Number(t.usage_cost) || 0, Number(t.fair_share_cost) || 0, Number(t.demand_cost) || 0);
    scale = scale > 0 ? scale * 1.05 : 1;
    replaceChildren(list, tenants.length
      ? tenants.map((t) => tenantCard(t, scale))
      : h('div', {class: 'empty'}, 'No tenants to show.'));
    asOf.textContent = d.evaluate_time ? `as of ${fmtClock(d.evaluate_time)}` : '';
    asOf.title = d.evaluate_time || '';
  }

  async function load() {
    try {
      const {text, data} = await get('/api/queues');
      ctx.clearError('queues');
      if (text === lastText) return;
      lastText = text;
      render(data || {});
    } catch (e) {
      ctx.showError('queues', e);
    }
  }
  const poll = poller(load, ctx.pollMs);
  return {unmount: () => poll.stop()};
}
