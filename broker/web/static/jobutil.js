// Pieces shared by the jobs list and the job page.
import {h} from './dom.js';
import {num, stateName} from './fmt.js';

export function stateChip(state, props = {}) {
  const name = stateName(state);
  return h('span', {class: `chip st-${name.toLowerCase()}`, title: state || 'JOB_STATE_UNSPECIFIED', ...props}, name);
}

export function setStateChip(el, state) {
  const name = stateName(state);
  el.className = `chip st-${name.toLowerCase()}`;
  el.title = state || 'JOB_STATE_UNSPECIFIED';
  el.textContent = name;
}

/**
 * GPUs a job asks for: sum over pod sets of count × gpu_count (fractional
 * shares as gpu_milli / 1000), plus MIG slices listed separately.
 */
export function gpuSummary(spec) {
  const sets = Array.isArray(spec?.pod_sets) ? spec.pod_sets : [];
  let gpus = 0;
  const mig = new Map();
  const parts = [];
  for (const ps of sets) {
    const count = Number(ps.count) || 0;
    const sh = ps.shape || {};
    const per = Number(sh.gpu_count) || 0;
    const milli = Number(sh.gpu_milli) || 0;
    const share = milli > 0 && milli < 1000 ? milli / 1000 : 1;
    gpus += count * per * share;
    let desc = `${ps.name || 'pods'}: ${count} ×`;
    if (per > 0) desc += ` ${per}${share < 1 ? ` × ${milli}m` : ''} GPU`;
    if (sh.mig_profile) {
      const n = count * (Number(sh.mig_count) || 0);
      mig.set(sh.mig_profile, (mig.get(sh.mig_profile) || 0) + n);
      desc += ` ${sh.mig_count || 0} × MIG ${sh.mig_profile}`;
    }
    if (per === 0 && !sh.mig_profile) desc += ' CPU only';
    const models = Array.isArray(sh.allowed_gpu_models) ? sh.allowed_gpu_models : [];
    if (models.length) desc += ` (${models.join(', ')})`;
    parts.push(desc);
  }
  let text = gpus > 0 || mig.size === 0 ? num(gpus) : '';
  for (const [profile, n] of mig) text += `${text ? ' + ' : ''}${num(n)} × ${profile}`;
  return {gpus, text, title: parts.join('\n')};
}

export function currentAttempt(job) {
  const st = job?.status || {};
  const attempts = Array.isArray(st.attempts) ? st.attempts : [];
  const cur = Number(st.current_attempt) || 0;
  return attempts.find((a) => Number(a.number) === cur) || null;
}

export const jobName = (job) => String(job?.spec?.display_name || '');
