// Job page: header, why it waits, request, state timeline, attempts with
// replicas and log links; live via /api/events?job_id=.
import {get, post, poller, liveStream, ApiError} from './api.js';
import {h, replaceChildren, externalLink, throttle} from './dom.js';
import {
  num, fmtTime, fmtSpan, age, between, humanise, stripPrefix, stateName, parseDuration,
  pathSegments, plural, TERMINAL_STATES,
} from './fmt.js';
import {stateChip, gpuSummary, jobName} from './jobutil.js';
import {lastJobsHash} from './jobs.js';

const dash = () => h('span', {class: 'muted'}, '—');

function timeCell(ts) {
  if (!ts) return dash();
  return h('span', {title: ts}, fmtTime(ts));
}

function kv(label, value, testid) {
  return [h('dt', null, label), h('dd', testid ? {'data-testid': testid} : null, value === '' || value === null || value === undefined ? dash() : value)];
}

function bytes(n) {
  const v = Number(n) || 0;
  if (v <= 0) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let x = v;
  while (x >= 1024 && i < units.length - 1) {
    x /= 1024;
    i++;
  }
  return `${num(Math.round(x * 10) / 10)} ${units[i]}`;
}

function domainText(att) {
  const segs = pathSegments(att.domain);
  if (!segs.length) return '';
  const p = segs.map((s) => (s === null ? '(none)' : s)).join('/');
  return att.domain_level ? `${p} (${att.domain_level})` : p;
}

function attemptNodes(att) {
  const fromReplicas = (att.replicas || []).map((r) => r.node).filter(Boolean);
  const src = fromReplicas.length ? fromReplicas : (att.assignments || []).map((a) => a.node).filter(Boolean);
  return [...new Set(src)].sort();
}

function nodesCell(nodes) {
  if (!nodes.length) return dash();
  const shown = nodes.slice(0, 2).join(', ');
  return h('span', {title: nodes.join('\n'), 'data-nodes': String(nodes.length)},
    shown, nodes.length > 2 ? h('span', {class: 'muted'}, ` +${nodes.length - 2} more`) : null);
}

function outcomeChip(outcome) {
  const name = stripPrefix(outcome, 'ATTEMPT_OUTCOME_');
  if (name === 'UNSPECIFIED') return h('span', {class: 'chip oc-active', 'data-testid': 'attempt-outcome'}, 'ACTIVE');
  return h('span', {class: `chip oc-${name.toLowerCase()}`, 'data-testid': 'attempt-outcome', title: outcome}, name);
}

function linkList(links) {
  if (!links.length) return null;
  return h('span', {class: 'links'}, links.map((l) => externalLink(l.url, l.name || 'link')));
}

function replicaTable(att) {
  const links = Array.isArray(att.log_links) ? att.log_links : [];
  const replicas = (Array.isArray(att.replicas) ? att.replicas : []).slice()
    .sort((a, b) => String(a.pod_set).localeCompare(String(b.pod_set)) || (a.index || 0) - (b.index || 0));
  if (!replicas.length) {
    const planned = Array.isArray(att.assignments) ? att.assignments : [];
    if (!planned.length) return h('div', {class: 'muted small'}, 'No replicas reported.');
    return h('table', {class: 'tbl tbl-sub'},
      h('thead', null, h('tr', null, h('th', null, 'Pod set'), h('th', {class: 'num'}, 'Index'), h('th', null, 'Planned node'))),
      h('tbody', null, planned.map((a) => h('tr', null,
        h('td', null, a.pod_set || ''), h('td', {class: 'num'}, num(a.index || 0)), h('td', {class: 'mono'}, a.node || '')))));
  }
  const phases = new Map();
  for (const r of replicas) {
    const ph = stripPrefix(r.phase, 'REPLICA_PHASE_');
    phases.set(ph, (phases.get(ph) || 0) + 1);
  }
  const summary = h('div', {class: 'replica-sum', 'data-testid': 'replica-summary'},
    `${num(replicas.length)} ${plural(replicas.length, 'replica')}: `,
    [...phases].map(([ph, n]) => h('span', {class: `chip ph-${ph.toLowerCase()}`}, `${num(n)} ${ph}`)));
  return [summary, h('div', {class: 'table-wrap replicas'}, h('table', {class: 'tbl tbl-sub'},
    h('thead', null, h('tr', null,
      h('th', null, 'Pod set'), h('th', {class: 'num'}, 'Index'), h('th', null, 'Pod'), h('th', null, 'Node'),
      h('th', null, 'Phase'), h('th', {class: 'num'}, 'Exit'), h('th', null, 'Reason'), h('th', {class: 'num'}, 'Restarts'),
      h('th', null, 'Started'), h('th', null, 'Finished'), h('th', null, 'Logs'))),
    h('tbody', null, replicas.map((r) => {
      const phase = stripPrefix(r.phase, 'REPLICA_PHASE_');
      const mine = links.filter((l) => l.pod_set && l.pod_set === r.pod_set && Number(l.index) === Number(r.index || 0));
      return h('tr', {'data-testid': `replica-${r.pod_set || ''}-${r.index || 0}`},
        h('td', null, r.pod_set || ''),
        h('td', {class: 'num'}, num(r.index || 0)),
        h('td', {class: 'mono'}, r.pod_name || ''),
        h('td', {class: 'mono'}, r.node || ''),
        h('td', null, h('span', {class: `chip ph-${phase.toLowerCase()}`}, phase)),
        h('td', {class: 'num'}, r.exit_code === undefined || r.exit_code === null ? '' : String(r.exit_code)),
        h('td', {title: r.message || ''}, r.reason || '', r.message ? h('span', {class: 'muted'}, ` ${r.message}`) : null),
        h('td', {class: 'num'}, num(r.restart_count || 0)),
        h('td', null, r.start_time ? h('span', {title: r.start_time}, fmtTime(r.start_time)) : ''),
        h('td', null, r.finish_time ? h('span', {title: r.finish_time}, fmtTime(r.finish_time)) : ''),
        h('td', null, linkList(mine)));
    }))))];
}

function attemptsSection(st, openState) {
  const attempts = Array.isArray(st.attempts) ? st.attempts.slice() : [];
  if (!attempts.length) return h('div', {class: 'empty small'}, 'No attempts yet.');
  attempts.sort((a, b) => (b.number || 0) - (a.number || 0));
  const cur = Number(st.current_attempt) || 0;
  const tbody = h('tbody');
  for (const a of attempts) {
    const n = Number(a.number) || 0;
    const nodes = attemptNodes(a);
    const ran = between(a.running_time, a.end_time) ?? (a.running_time && !a.end_time ? (Date.now() - new Date(a.running_time)) / 1000 : null);
    const open = openState.has(n) ? openState.get(n) : n === cur;
    tbody.append(h('tr', {'data-testid': `attempt-${n}`, class: `attempt-row ${n === cur ? 'current' : ''}`},
      h('td', {class: 'num'}, h('button', {type: 'button', class: 'btn-disclose', 'data-attempt': String(n),
        'aria-expanded': open ? 'true' : 'false', title: 'Show replicas and logs'}, open ? '▾' : '▸'), ` ${n}`),
      h('td', null, a.cluster || ''),
      h('td', {class: 'mono'}, domainText(a)),
      h('td', null, a.gpu_model || ''),
      h('td', null, nodesCell(nodes)),
      h('td', null, outcomeChip(a.outcome)),
      h('td', {class: 'num'}, a.exit_code === undefined || a.exit_code === null ? '' : String(a.exit_code)),
      h('td', {class: 'msg', title: a.outcome_message || ''}, a.outcome_message || ''),
      h('td', null, timeCell(a.reserve_time)),
      h('td', null, a.running_time ? timeCell(a.running_time) : dash()),
      h('td', null, a.end_time ? timeCell(a.end_time) : dash()),
      h('td', {class: 'num'}, ran !== null ? fmtSpan(ran) : '')));
    const links = (Array.isArray(a.log_links) ? a.log_links : []).filter((l) => !l.pod_set && (l.index === undefined || l.index === null));
    const rej = a.rejection && a.rejection.reason && a.rejection.reason !== 'DISPATCH_REJECT_REASON_UNSPECIFIED' ? a.rejection : null;
    const detail = h('div', {class: 'attempt-detail'},
      h('div', {class: 'meta'},
        a.namespace ? h('span', null, 'namespace ', h('code', null, a.namespace)) : null,
        a.rendezvous_address ? h('span', null, 'rendezvous ', h('code', null, a.rendezvous_address)) : null,
        a.dispatch_time ? h('span', {title: a.dispatch_time}, `dispatched ${fmtTime(a.dispatch_time)}`) : null,
        a.accept_time ? h('span', {title: a.accept_time}, `accepted ${fmtTime(a.accept_time)}`) : null,
        a.start_time ? h('span', {title: a.start_time}, `started ${fmtTime(a.start_time)}`) : null,
        a.spent_retry ? h('span', {class: 'warn-text'}, 'spent a retry') : null,
        links.length ? h('span', {'data-testid': 'attempt-links'}, 'logs: ', linkList(links)) : null),
      rej ? h('div', {class: 'rejection'},
        h('strong', null, `Rejected: ${stripPrefix(rej.reason, 'DISPATCH_REJECT_REASON_')}`), ' ', rej.message || '',
        (rej.nodes || []).length ? h('span', {class: 'muted'}, ` · nodes: ${rej.nodes.join(', ')}`) : null) : null,
      replicaTable(a));
    tbody.append(h('tr', {class: 'attempt-detail-row', 'data-detail-for': String(n), hidden: !open},
      h('td', {colspan: '12'}, detail)));
  }
  return h('div', {class: 'table-wrap'}, h('table', {class: 'tbl attempts-tbl', 'data-testid': 'attempts'},
    h('thead', null, h('tr', null,
      h('th', {class: 'num'}, '#'), h('th', null, 'Cluster'), h('th', null, 'Domain'), h('th', null, 'GPU model'),
      h('th', null, 'Nodes'), h('th', null, 'Outcome'), h('th', {class: 'num'}, 'Exit'), h('th', null, 'Message'),
      h('th', null, 'Reserved'), h('th', null, 'Running'), h('th', null, 'Ended'), h('th', {class: 'num'}, 'Ran for'))),
    tbody));
}

function timeline(st) {
  const hist = Array.isArray(st.history) ? st.history : [];
  if (!hist.length) return h('div', {class: 'empty small'}, 'No history in this view.');
  const steps = h('ol', {class: 'steps', 'data-testid': 'timeline'});
  hist.forEach((t, i) => {
    const prev = i > 0 ? hist[i - 1] : null;
    const dt = prev ? between(prev.time, t.time) : null;
    steps.append(h('li', {class: 'step', title: [t.reason, t.message].filter(Boolean).join(': ')},
      i > 0 ? h('span', {class: 'step-gap'}, dt !== null ? fmtSpan(dt) : '') : null,
      stateChip(t.to_state),
      h('span', {class: 'step-time'}, t.time ? fmtTime(t.time).slice(11) : '')));
  });
  const table = h('table', {class: 'tbl hist-tbl'},
    h('thead', null, h('tr', null, h('th', null, 'Time'), h('th', null, 'Transition'), h('th', {class: 'num'}, 'Attempt'),
      h('th', null, 'Reason'), h('th', null, 'Actor'), h('th', null, 'Message'))),
    h('tbody', null, hist.slice().reverse().map((t) => h('tr', {'data-testid': 'transition'},
      h('td', {class: 'nowrap'}, timeCell(t.time)),
      h('td', {class: 'nowrap'},
        t.from_state && t.from_state !== 'JOB_STATE_UNSPECIFIED' ? [stateChip(t.from_state), h('span', {class: 'arrow'}, '→')] : null,
        stateChip(t.to_state)),
      h('td', {class: 'num'}, t.attempt ? num(t.attempt) : ''),
      h('td', null, t.reason || ''),
      h('td', {class: 'mono'}, t.actor || ''),
      h('td', {class: 'msg-wrap'}, t.message || '')))));
  return [steps, h('div', {class: 'table-wrap'}, table)];
}

function whyWaits(st) {
  const qi = st.queue_info || {};
  const verdicts = Array.isArray(qi.clusters) ? qi.clusters : [];
  const pos = qi.position === undefined || qi.position === null ? null : Number(qi.position);
  const reason = qi.reason && qi.reason !== 'WAIT_REASON_UNSPECIFIED' ? humanise(qi.reason, 'WAIT_REASON_') : 'not evaluated yet';
  return h('section', {class: 'card why', 'data-testid': 'why-waits'},
    h('h3', null, 'Why it waits'),
    h('div', {class: 'why-main'},
      h('span', {class: 'chip chip-wait', 'data-testid': 'wait-reason', title: qi.reason || ''}, reason),
      h('span', {class: 'why-msg', 'data-testid': 'wait-message'}, qi.message || '')),
    h('div', {class: 'meta'},
      pos !== null ? h('span', {'data-testid': 'queue-position'},
        pos === 0 ? 'next in line' : `${num(pos)} ${plural(pos, 'job')} ahead`) : null,
      qi.quota ? h('span', null, 'quota ', h('code', null, qi.quota)) : null,
      qi.next_eligible_time ? h('span', {title: qi.next_eligible_time}, `eligible from ${fmtTime(qi.next_eligible_time)}`) : null,
      qi.evaluate_time ? h('span', {title: qi.evaluate_time}, `evaluated ${age(qi.evaluate_time)} ago`) : null,
      st.held ? h('span', {class: 'warn-text'}, `held by ${st.held_by || '?'}`) : null),
    verdicts.length ? h('div', {class: 'table-wrap'}, h('table', {class: 'tbl', 'data-testid': 'verdicts'},
      h('thead', null, h('tr', null, h('th', null, 'Cluster'), h('th', null, 'Verdict'), h('th', null, 'Detail'), h('th', null, 'Fit reason'))),
      h('tbody', null, verdicts.map((v) => {
        const r = stripPrefix(v.reason, 'CLUSTER_VERDICT_REASON_');
        const fit = v.fit_reason && v.fit_reason !== 'FIT_REASON_UNSPECIFIED' ? stripPrefix(v.fit_reason, 'FIT_REASON_') : '';
        return h('tr', {'data-testid': `verdict-${v.cluster || ''}`},
          h('td', null, v.cluster || ''),
          h('td', null, h('span', {class: `chip vd-${r === 'FITS' ? 'fits' : 'no'}`, 'data-testid': 'verdict-reason'}, r)),
          h('td', {class: 'msg-wrap'}, v.message || ''),
          h('td', {class: 'mono small'}, fit));
      })))) : h('div', {class: 'muted small'}, 'No per-cluster verdicts yet.'));
}

function requestSection(spec) {
  const sets = Array.isArray(spec.pod_sets) ? spec.pod_sets : [];
  const g = gpuSummary(spec);
  const topo = spec.topology || {};
  const sel = spec.cluster_selector || {};
  const where = [
    (sel.clusters || []).length ? `clusters ${sel.clusters.join(', ')}` : '',
    (sel.regions || []).length ? `regions ${sel.regions.join(', ')}` : '',
    (sel.roles || []).length ? `roles ${sel.roles.join(', ')}` : '',
  ].filter(Boolean).join(' · ');
  const maxRt = parseDuration(spec.max_runtime);
  return h('section', {class: 'card'},
    h('h3', null, 'Request ', h('span', {class: 'muted'}, `· ${g.text || '0'} GPUs`)),
    h('div', {class: 'meta'},
      h('span', null, `framework ${spec.framework && spec.framework !== 'FRAMEWORK_UNSPECIFIED'
        ? humanise(spec.framework, 'FRAMEWORK_') : 'plain (default)'}`),
      topo.required_level ? h('span', null, 'one ', h('strong', null, topo.required_level), ' required') : null,
      topo.preferred_level ? h('span', null, `prefers one ${topo.preferred_level}`) : null,
      spec.min_available !== undefined && spec.min_available !== null ? h('span', null, `elastic, min ${num(spec.min_available)} replicas`) : null,
      where ? h('span', null, where) : null,
      maxRt !== null ? h('span', null, `max runtime ${fmtSpan(maxRt)}`) : null,
      spec.preemptible ? h('span', null, 'preemptible') : h('span', null, 'not preemptible')),
    h('div', {class: 'table-wrap'}, h('table', {class: 'tbl'},
      h('thead', null, h('tr', null, h('th', null, 'Pod set'), h('th', {class: 'num'}, 'Replicas'), h('th', {class: 'num'}, 'GPUs each'),
        h('th', null, 'GPU models'), h('th', {class: 'num'}, 'CPU each'), h('th', {class: 'num'}, 'Memory each'), h('th', null, ''))),
      h('tbody', null, sets.map((ps) => {
        const sh = ps.shape || {};
        let each = num(sh.gpu_count || 0);
        if (Number(sh.gpu_milli) > 0 && Number(sh.gpu_milli) < 1000) each += ` × ${sh.gpu_milli}m`;
        if (sh.mig_profile) each = `${num(sh.mig_count || 0)} × ${sh.mig_profile}`;
        return h('tr', null,
          h('td', null, ps.name || ''),
          h('td', {class: 'num'}, num(ps.count || 0)),
          h('td', {class: 'num'}, each),
          h('td', null, (sh.allowed_gpu_models || []).join(', ') || h('span', {class: 'muted'}, 'any')),
          h('td', {class: 'num'}, Number(sh.cpu_milli) ? `${num(Number(sh.cpu_milli) / 1000)}` : ''),
          h('td', {class: 'num'}, bytes(sh.memory_bytes)),
          h('td', {class: 'muted'}, ps.fixed_count ? 'fixed count' : ''));
      })))));
}

export function mountJob(root, ctx, route) {
  const id = route.id;
  let lastText = null;
  let lastLoad = 0;
  const openState = new Map(); // attempt number -> open, once the user toggled it

  const liveEl = h('span', {class: 'live', 'data-testid': 'live'}, 'live: connecting');
  const body = h('div', {class: 'job-body'}, h('div', {class: 'loading'}, 'Loading…'));
  const flash = h('div', {class: 'flash', 'data-testid': 'cancel-result', hidden: true});
  root.append(
    h('div', {class: 'page-head'},
      h('nav', {class: 'crumbs'}, h('a', {href: lastJobsHash, 'data-testid': 'back-to-jobs'}, 'Jobs'), h('span', null, '›'),
        h('span', {class: 'mono'}, id)),
      h('div', {class: 'spacer'}), liveEl),
    flash, body);

  function render(j) {
    const spec = j.spec || {};
    const st = j.status || {};
    const state = st.state || 'JOB_STATE_UNSPECIFIED';
    const terminal = TERMINAL_STATES.has(state);
    let cancel = null;
    if (!terminal) {
      const cancelling = state === 'JOB_STATE_CANCELLING';
      cancel = h('button', {type: 'button', class: 'btn btn-danger', 'data-testid': 'cancel-job', disabled: cancelling,
        title: cancelling ? 'Cancel already requested' : 'Cancel this job'}, cancelling ? 'Cancelling…' : 'Cancel job');
      cancel.addEventListener('click', onCancel);
    }
    const band = spec.priority_band || 'default band';
    const name = jobName(j);
    const head = h('section', {class: 'card job-head'},
      h('div', {class: 'job-title'},
        h('h2', {class: 'mono', 'data-testid': 'job-id'}, String(j.job_id ?? id)),
        stateChip(state, {'data-testid': 'job-state'}),
        st.held ? h('span', {class: 'chip chip-held', title: `held by ${st.held_by || '?'}`}, 'held') : null,
        h('div', {class: 'spacer'}), cancel),
      name ? h('div', {class: 'job-name', 'data-testid': 'job-name'}, name) : null,
      st.message ? h('div', {class: 'muted'}, st.message) : null,
      h('dl', {class: 'kv'},
        kv('Tenant', spec.tenant || '', 'job-tenant'),
        kv('Queue', spec.queue || ''),
        kv('Priority', `${band} / ${num(spec.priority || 0)}`, 'job-priority'),
        kv('Created', st.create_time ? h('span', {title: st.create_time}, `${fmtTime(st.create_time)} (${age(st.create_time)} ago)`) : '', 'job-created'),
        kv('Updated', st.update_time ? h('span', {title: st.update_time}, fmtTime(st.update_time)) : ''),
        kv('Job set', spec.job_set_id ? h('a', {href: `#/jobs?job_set=${encodeURIComponent(spec.job_set_id)}`}, spec.job_set_id) : ''),
        kv('Attempt', `${num(st.current_attempt || 0)} · ${num(st.infra_retries || 0)} infra ${plural(st.infra_retries || 0, 'retry', 'retries')}`),
        kv('Revision', st.revision ? String(st.revision) : '')));
    replaceChildren(body,
      head,
      state === 'JOB_STATE_QUEUED' ? whyWaits(st) : null,
      h('section', {class: 'card'}, h('h3', null, 'Attempts'), attemptsSection(st, openState)),
      h('section', {class: 'card'}, h('h3', null, 'State history'), timeline(st)),
      requestSection(spec));
  }

  async function onCancel(ev) {
    const btn = ev.currentTarget;
    if (!window.confirm(`Cancel job ${id}?`)) return;
    btn.disabled = true;
    try {
      const {data} = await post(`/api/jobs/${encodeURIComponent(id)}/cancel`, {reason: 'cancelled from the fleet view'});
      ctx.clearError('cancel');
      const newState = data?.state || data?.job?.status?.state || '';
      flash.hidden = false;
      replaceChildren(flash, data?.already_terminal ? 'The job had already ended: ' : 'Cancel requested. The job is now ',
        stateChip(newState), '.');
      const chip = body.querySelector('.job-head [data-testid="job-state"]');
      if (chip && newState) replaceChildren(chip, stateName(newState));
      if (chip && newState) chip.className = `chip st-${stateName(newState).toLowerCase()}`;
      lastText = null;
      load();
    } catch (e) {
      ctx.showError('cancel', e);
      btn.disabled = false;
    }
  }

  body.addEventListener('click', (ev) => {
    const b = ev.target.closest('button[data-attempt]');
    if (!b) return;
    const n = Number(b.dataset.attempt);
    const row = body.querySelector(`tr[data-detail-for="${n}"]`);
    if (!row) return;
    row.hidden = !row.hidden;
    openState.set(n, !row.hidden);
    b.textContent = row.hidden ? '▸' : '▾';
    b.setAttribute('aria-expanded', row.hidden ? 'false' : 'true');
  });

  async function load() {
    try {
      const {text, data} = await get(`/api/jobs/${encodeURIComponent(id)}`);
      lastLoad = Date.now();
      ctx.clearError('job');
      if (text === lastText) return;
      lastText = text;
      render(data?.job || {});
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        // Nothing to follow: stop asking (each 404 would be another console error too).
        ctx.clearError('job');
        poll.stop();
        live.close();
        liveEl.hidden = true;
        flash.hidden = true;
        replaceChildren(body, h('div', {class: 'empty', 'data-testid': 'job-not-found'},
          'No such job, or not one you may see. ', h('a', {href: lastJobsHash}, 'Back to the jobs')));
        return;
      }
      ctx.showError('job', e);
    }
  }
  const refetch = throttle(load, 300);
  const live = liveStream(`/api/events?job_id=${encodeURIComponent(id)}`, liveEl, {job: () => refetch()});
  const poll = poller(async () => {
    if (live.isOpen() && Date.now() - lastLoad < 15000) return;
    await load();
  }, ctx.pollMs);

  return {
    unmount() {
      poll.stop();
      refetch.cancel();
      live.close();
    },
  };
}
