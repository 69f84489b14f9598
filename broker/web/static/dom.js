// DOM construction helpers. Every value from the API is untrusted, so nodes
// are built with createElement + textContent only; nothing here parses HTML.

const SVG_NS = 'http://www.w3.org/2000/svg';

function applyProps(el, props) {
  if (!props) return;
  for (const key of Object.keys(props)) {
    const v = props[key];
    if (v === undefined || v === null || v === false) continue;
    if (key === 'class') el.setAttribute('class', v);
    else if (key === 'text') el.textContent = String(v);
    else if (key === 'testid') el.dataset.testid = v;
    else if (key === 'dataset') Object.assign(el.dataset, v);
    else if (key.startsWith('on') && typeof v === 'function') el.addEventListener(key.slice(2), v);
    else if (key === 'style') throw new Error('inline style attributes are blocked by the CSP');
    else if (typeof v === 'boolean') el[key] = v;
    else el.setAttribute(key, String(v));
  }
}

function appendChildren(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) appendChildren(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** h('td', {class: 'num', testid: 'x'}, 'text', childNode, [more]) */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  applyProps(el, props);
  appendChildren(el, children);
  return el;
}

export function svg(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  applyProps(el, props);
  appendChildren(el, children);
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function replaceChildren(el, ...children) {
  clear(el);
  appendChildren(el, children);
  return el;
}

/** An http(s) URL or null: log links come from cluster-published templates. */
export function safeHttpUrl(raw) {
  if (typeof raw !== 'string' || raw === '') return null;
  try {
    const u = new URL(raw, location.href);
    return u.protocol === 'http:' || u.protocol === 'https:' ? u.href : null;
  } catch {
    return null;
  }
}

export function externalLink(url, label) {
  const href = safeHttpUrl(url);
  if (!href) return h('span', {class: 'muted', title: 'not an http(s) link'}, label);
  return h('a', {href, target: '_blank', rel: 'noopener noreferrer', class: 'extlink'}, label);
}

/** Calls fn at most once per `ms`; a call inside the window runs at its end. */
export function throttle(fn, ms) {
  let last = 0;
  let timer = null;
  const wrapped = () => {
    const wait = last + ms - Date.now();
    if (wait <= 0) {
      last = Date.now();
      fn();
    } else if (!timer) {
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn();
      }, wait);
    }
  };
  wrapped.cancel = () => {
    if (timer) clearTimeout(timer);
    timer = null;
  };
  return wrapped;
}
