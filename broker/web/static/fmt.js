// Formatting of numbers, enum names, times and durations.

const nf0 = new Intl.NumberFormat('en-US', {maximumFractionDigits: 0});
const nf2 = new Intl.NumberFormat('en-US', {maximumFractionDigits: 2});
export const collator = new Intl.Collator('en', {numeric: true, sensitivity: 'base'});

export function num(v) {
  const n = Number(v);
  if (!Number.isFinite(n)) return '—';
  return Number.isInteger(n) ? nf0.format(n) : nf2.format(n);
}

export function stripPrefix(s, prefix) {
  if (typeof s !== 'string' || s === '') return 'UNSPECIFIED';
  return s.startsWith(prefix) ? s.slice(prefix.length) : s;
}

/** "WAIT_REASON_QUOTA_EXCEEDED" -> "quota exceeded" */
export function humanise(s, prefix) {
  return stripPrefix(s, prefix).toLowerCase().replace(/_/g, ' ');
}

export const stateName = (s) => stripPrefix(s, 'JOB_STATE_');

export const TERMINAL_STATES = new Set(['JOB_STATE_SUCCEEDED', 'JOB_STATE_FAILED', 'JOB_STATE_CANCELLED']);

export const JOB_STATES = [
  'JOB_STATE_QUEUED', 'JOB_STATE_RESERVED', 'JOB_STATE_DISPATCHED', 'JOB_STATE_ACCEPTED',
  'JOB_STATE_STARTING', 'JOB_STATE_RUNNING', 'JOB_STATE_SUCCEEDED', 'JOB_STATE_FAILED',
  'JOB_STATE_CANCELLING', 'JOB_STATE_CANCELLED', 'JOB_STATE_PREEMPTED', 'JOB_STATE_LOST',
];

/** RFC 3339 string -> Date, or null when absent / the zero timestamp. */
export function parseTime(ts) {
  if (typeof ts !== 'string' || ts === '') return null;
  const d = new Date(ts);
  if (Number.isNaN(d.getTime()) || d.getTime() <= 0) return null;
  return d;
}

const pad = (n) => String(n).padStart(2, '0');

export function fmtTime(ts) {
  const d = ts instanceof Date ? ts : parseTime(ts);
  if (!d) return '';
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function fmtClock(ts) {
  const d = ts instanceof Date ? ts : parseTime(ts);
  if (!d) return '';
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** Seconds -> compact span: "850 ms", "4.2 s", "5m 03s", "3h 04m", "2d 5h". */
export function fmtSpan(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return '';
  const s = Math.max(0, seconds);
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${pad(Math.floor(s % 60))}s`;
  const hr = Math.floor(m / 60);
  if (hr < 48) return `${hr}h ${pad(m % 60)}m`;
  return `${Math.floor(hr / 24)}d ${hr % 24}h`;
}

/** Age of a timestamp in whole seconds and up: "8s", "5m 03s", "3h 04m", "2d 5h". */
export function age(ts, now = Date.now()) {
  const d = ts instanceof Date ? ts : parseTime(ts);
  if (!d) return '';
  const s = Math.max(0, (now - d.getTime()) / 1000);
  return s < 60 ? `${Math.floor(s)}s` : fmtSpan(s);
}

/** protobuf JSON Duration ("1.5s") -> seconds, or null. */
export function parseDuration(s) {
  if (typeof s !== 'string') return null;
  const m = /^(-?\d+(?:\.\d+)?)s$/.exec(s);
  return m ? Number(m[1]) : null;
}

export function between(a, b) {
  const x = parseTime(a);
  const y = parseTime(b);
  if (!x || !y) return null;
  return (y.getTime() - x.getTime()) / 1000;
}

export const plural = (n, word, pl = `${word}s`) => (Number(n) === 1 ? word : pl);

/** TopologyPath JSON -> list of segment values (null for an absent label). */
export function pathSegments(path) {
  const segs = (path && Array.isArray(path.segments)) ? path.segments : [];
  return segs.map((s) => (s && typeof s.value === 'string' ? s.value : null));
}
