// The on-call console's page. Everything a record carries (payloads, keys, headers,
// errors) was written by strangers, so every value goes into the page as text
// (textContent, createElement, setAttribute of plain attributes), never as HTML: nothing
// in a record can run as script or change the page. No inline script or style (the CSP
// forbids both), no library: plain DOM and SVG.
'use strict';

const state = { csrf: null, user: null, roles: [], timer: null };
const REFRESH_MS = 5000;

// ------------------------------------------------------------------ DOM helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'text') node.textContent = String(v);
    else if (k === 'class') node.className = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'text') node.textContent = String(v);
    else node.setAttribute(k, String(v));
  }
  return node;
}

function text(v) {
  if (v === null || v === undefined) return '';
  if (typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

function when(ts) {
  if (!ts) return '';
  const d = new Date(ts);
  return isNaN(d) ? String(ts) : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

function table(id, columns, rows) {
  const head = el('tr', {}, ...columns.map((c) => el('th', { text: c.title })));
  const body = rows.map((row) => el('tr', {}, ...columns.map((c) => {
    const v = c.cell ? c.cell(row) : text(row[c.key]);
    const td = el('td', { class: c.cls || null });
    td.append(v instanceof Node ? v : document.createTextNode(v));
    return td;
  })));
  return el('table', { id }, el('thead', {}, head), el('tbody', {}, ...body));
}

function say(message, kind) {
  const s = document.getElementById('status');
  s.textContent = message || '';
  s.className = kind || '';
}

// ------------------------------------------------------------------ the API

async function api(method, path, body) {
  const headers = {};
  if (method !== 'GET') {
    headers['X-CSRF-Token'] = state.csrf || '';
    headers['Content-Type'] = 'application/json';
  }
  const res = await fetch(path, {
    method, headers, credentials: 'same-origin', cache: 'no-store',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await res.json(); } catch (e) { data = null; }
  if (res.status === 401 && path !== '/api/session') {
    showSignIn((data && data.error) || 'Your session ended: sign in again.');
    throw new Error('signed out');
  }
  if (!res.ok) {
    const err = new Error((data && data.error) || ('HTTP ' + res.status));
    err.status = res.status;
    err.hint = data && data.hint;
    throw err;
  }
  return data;
}

function failed(err) {
  if (err.message === 'signed out') return;
  say((err.status ? err.status + ': ' : '') + err.message + (err.hint ? ' (' + err.hint + ')' : ''), 'error');
}

// ------------------------------------------------------------------ sign-in

function showSignIn(message) {
  stopRefresh();
  state.csrf = null;
  document.getElementById('nav').hidden = true;
  document.getElementById('who').hidden = true;
  document.getElementById('page').hidden = true;
  document.getElementById('signin-page').hidden = false;
  say(message || '', message ? 'error' : '');
}

async function loadSession() {
  const s = await api('GET', '/api/session');
  state.csrf = s.csrf;
  state.user = s.user;
  state.roles = s.roles;
  document.getElementById('who-user').textContent = s.user;
  document.getElementById('who-roles').textContent = s.roles.length ? '(' + s.roles.join(', ') + ')' : '(no wal_delivery role)';
  document.getElementById('nav').hidden = false;
  document.getElementById('who').hidden = false;
  document.getElementById('signin-page').hidden = true;
  document.getElementById('page').hidden = false;
}

async function signIn(event) {
  event.preventDefault();
  const user = document.getElementById('signin-user').value;
  const password = document.getElementById('signin-password');
  try {
    await api('POST', '/api/session', { user, password: password.value });
    password.value = '';
    await loadSession();
    say('Signed in as ' + user + '.', 'ok');
    route();
  } catch (err) {
    password.value = '';
    failed(err);
  }
}

async function signOut() {
  try { await api('POST', '/api/signout'); } catch (err) { /* ended anyway */ }
  showSignIn('');
  say('Signed out.', 'ok');
}

// ------------------------------------------------------------------ pages

function stopRefresh() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
}

function page(title, ...children) {
  const p = document.getElementById('page');
  p.replaceChildren(el('h2', { text: title }), ...children);
  return p;
}

function params() {
  const hash = location.hash.slice(1);
  const q = hash.indexOf('?');
  return { name: q < 0 ? hash : hash.slice(0, q), query: new URLSearchParams(q < 0 ? '' : hash.slice(q + 1)) };
}

function route() {
  stopRefresh();
  if (!state.csrf) return;
  const { name, query } = params();
  const parts = name.split('/');
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('current', a.id === 'nav-' + parts[0]);
  const pages = {
    'overview': () => overviewPage(),
    'dead-letters': () => deadLettersPage(query),
    'dead-letter': () => deadLetterPage(parts[1]),
    'destinations': () => destinationsPage(),
    'destination': () => destinationPage(decodeURIComponent(parts[1] || '')),
    'archive': () => archivePage(),
    'audit': () => auditPage(),
  };
  (pages[parts[0]] || pages.overview)();
}

// A bar chart in SVG: one bar per time slot (epoch ms), its value as the bar's tooltip,
// a time label every `every` bars. Drawn with createElementNS: no inline script or style.
function barChart(id, slots, values, opts) {
  const max = Math.max(opts.min || 1, ...values);
  const step = opts.barWidth + 2, W = slots.length * step, H = opts.height || 120;
  const chart = svg('svg', { id, class: 'chart', width: W + 40, height: H + 30, viewBox: `0 0 ${W + 40} ${H + 30}` });
  chart.append(svg('text', { x: 2, y: 10, text: opts.format(max) }));
  values.forEach((v, i) => {
    const h = Math.round((v / max) * H);
    const bar = svg('rect', { class: opts.cls || 'bar', x: 30 + i * step, y: H - h + 12, width: opts.barWidth, height: h });
    bar.append(svg('title', { text: `${new Date(slots[i]).toISOString().slice(11, 16)}Z: ${opts.format(v)}` }));
    chart.append(bar);
    if (i % opts.every === 0) chart.append(svg('text', { x: 30 + i * step, y: H + 26, text: new Date(slots[i]).toISOString().slice(11, 16) }));
  });
  return chart;
}

// The time slots of a chart: `n` slots of `ms` each, the last one holding `now`.
function slotsUntil(now, ms, n) {
  const last = Math.floor(new Date(now).getTime() / ms) * ms;
  const slots = [];
  for (let i = n - 1; i >= 0; i--) slots.push(last - i * ms);
  return slots;
}

function sumAt(rows, slots, key, field) {
  const by = new Map();
  for (const r of rows) {
    const t = new Date(r[key]).getTime();
    by.set(t, (by.get(t) || 0) + Number(r[field]));
  }
  return slots.map((t) => by.get(t) || 0);
}

// Dead letters per hour over the last 24 hours, all topics.
function hourChart(id, perHour, now) {
  const slots = slotsUntil(now, 3600e3, 24);
  return barChart(id, slots, sumAt(perHour, slots, 'hour', 'dead_letters'), { barWidth: 20, every: 4, format: String });
}

// Per topic over the last hours, per 5 minutes: deliveries per second and failed attempts.
// The busiest topics first, at most 8 (the tables above list them all).
function topicCharts(o) {
  const hours = Number(o.chart_hours) || 6;
  const slots = slotsUntil(o.now, 300e3, hours * 12);
  const byTopic = new Map();
  for (const b of o.deliveries_per_5_minutes) {
    if (!byTopic.has(b.topic)) byTopic.set(b.topic, []);
    byTopic.get(b.topic).push(b);
  }
  const total = (rows) => rows.reduce((n, b) => n + Number(b.delivered) + Number(b.failed), 0);
  const topics = [...byTopic.entries()].sort((x, y) => total(y[1]) - total(x[1])).slice(0, 8);
  const box = el('div', { id: 'topic-charts' });
  if (!topics.length) box.append(el('p', { class: 'muted', text: `No deliveries in the last ${hours} hours.` }));
  topics.forEach(([topic, rows], i) => {
    box.append(el('div', { class: 'topic-chart', 'data-topic': topic },
      el('h4', { text: topic }),
      el('div', { class: 'chart-pair' },
        el('figure', {}, el('figcaption', { text: 'deliveries per second' }),
          barChart('chart-delivered-' + i, slots, sumAt(rows, slots, 'at', 'delivered').map((n) => n / 300),
            { barWidth: 6, every: 12, cls: 'bar-ok', min: 0.01, format: (v) => v.toFixed(v < 10 ? 2 : 0) })),
        el('figure', {}, el('figcaption', { text: 'failed attempts per 5 minutes' }),
          barChart('chart-failed-' + i, slots, sumAt(rows, slots, 'at', 'failed'),
            { barWidth: 6, every: 12, format: String })))));
  });
  return box;
}

function destinationLink(name) {
  if (!name) return '';
  return el('a', { href: '#destination/' + encodeURIComponent(name), text: name });
}

function breakerCell(d) {
  return el('span', { class: 'breaker-' + d.breaker, text: d.breaker + (d.breaker === 'closed' ? '' : ' (paused)') });
}

async function overviewPage() {
  const holder = page('Overview', el('p', { class: 'muted', text: 'Refreshes every 5 seconds. Rates are over the last 5 minutes; counts reach the database up to 10 seconds late.' }));
  const body = el('div', { id: 'overview' });
  holder.append(body);
  let charts = null, hourly = null, refreshes = 0;
  const draw = async () => {
    let o;
    // The charts read hours of counts: once a minute is enough for them.
    const withChart = refreshes++ % 12 === 0;
    try { o = await api('GET', '/api/overview' + (withChart ? '' : '?chart=no')); } catch (err) { return failed(err); }
    if (withChart) {
      hourly = hourChart('chart-dead-letters', o.dead_letters_per_hour, o.now);
      charts = topicCharts(o);
    }
    const capped = (n) => (Number(n) >= o.count_cap ? (o.count_cap - 1).toLocaleString('en') + '+' : String(n));
    body.replaceChildren(
      el('h3', { text: 'Topics' }),
      table('topics', [
        { title: 'topic', key: 'topic' },
        { title: 'waiting to ship', key: 'waiting', cls: 'num' },
        { title: 'oldest waiting', cell: (t) => text(t.oldest_waiting_age) },
        { title: 'delivered /s', key: 'delivered_per_second', cls: 'num' },
        { title: 'delivered (5 min)', key: 'delivered_5m', cls: 'num' },
        { title: 'failed attempts (5 min)', key: 'failed_5m', cls: 'num' },
        { title: 'failed attempts (1 h)', key: 'failed_last_hour', cls: 'num' },
        { title: 'unresolved dead letters', cls: 'num', cell: (t) => el('a', { href: '#dead-letters?topic=' + encodeURIComponent(t.topic), text: capped(t.unresolved_dead_letters) }) },
        { title: 'dead letters last hour', key: 'dead_letters_last_hour', cls: 'num' },
      ], o.topics),
      el('h3', { text: `Per topic, last ${o.chart_hours} hours per 5 minutes (UTC)` }),
      charts,
      el('h3', { text: 'Dead letters per hour (all topics, UTC)' }),
      hourly,
      el('h3', { text: 'Destinations' }),
      table('destinations', [
        { title: 'destination', cell: (d) => destinationLink(d.destination) },
        { title: 'state', cell: breakerCell },
        { title: 'since', cell: (d) => when(d.since) },
        { title: 'next probe', cell: (d) => d.breaker === 'closed' ? '' : (d.next_probe_at ? when(d.next_probe_at) : 'none: held until resumed') },
        { title: 'delivered /s', key: 'delivered_per_second', cls: 'num' },
        { title: 'failed attempts (5 min)', key: 'failed_5m', cls: 'num' },
        { title: 'failed attempts (1 h)', key: 'failed_last_hour', cls: 'num' },
        { title: 'dead-lettered (1 h)', key: 'dead_lettered_last_hour', cls: 'num' },
        { title: 'retry steps waiting (1/2/3)', cell: (d) => (d.backlog || []).map((n) => n === null ? '-' : n).join(' / ') },
        { title: 'last error', cls: 'error-text', cell: (d) => text(d.last_error) },
        { title: 'pause reason', cls: 'error-text', cell: (d) => text(d.pause_reason) },
      ], o.destinations),
      el('p', { class: 'muted', text: 'As of ' + when(o.now) }));
  };
  await draw();
  state.timer = setInterval(draw, REFRESH_MS);
}

const FILTERS = ['topic', 'destination', 'reason', 'since', 'until', 'key', 'state'];

function filterQuery(query) {
  const q = new URLSearchParams();
  for (const f of FILTERS) if (query.get(f)) q.set(f, query.get(f));
  return q;
}

async function deadLettersPage(query) {
  const form = el('form', { class: 'filters', id: 'filters' });
  for (const f of FILTERS) {
    let input;
    if (f === 'state') {
      input = el('select', { name: f, id: 'filter-' + f },
        ...['unresolved', 'resolved', 'all'].map((s) => el('option', { value: s, text: s, selected: (query.get(f) || 'unresolved') === s })));
    } else {
      input = el('input', { name: f, id: 'filter-' + f, value: query.get(f) || '',
        placeholder: f === 'since' || f === 'until' ? '2026-01-01 00:00' : (f === 'key' ? 'idempotency key' : (f === 'reason' ? 'part of the error' : '')) });
    }
    form.append(el('label', {}, f + ' ', input));
  }
  form.append(el('button', { type: 'submit', id: 'filter-apply', text: 'Filter' }));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const f of FILTERS) { const v = form.elements[f].value.trim(); if (v) q.set(f, v); }
    location.hash = 'dead-letters?' + q.toString();
  });
  const note = el('input', { id: 'bulk-note', placeholder: 'note for resolve (how it was handled)' });
  const count = el('span', { id: 'match-count', class: 'muted' });
  const actions = el('div', { class: 'actions' },
    el('button', { type: 'button', id: 'select-all', text: 'Select all shown', onclick: () => { for (const c of document.querySelectorAll('input.pick')) c.checked = true; } }),
    el('button', { type: 'button', id: 'bulk-replay', text: 'Replay selected', onclick: () => bulk('replay', note.value) }),
    el('button', { type: 'button', id: 'bulk-resolve', text: 'Resolve selected', onclick: () => bulk('resolve', note.value) }),
    el('button', { type: 'button', id: 'filter-replay', text: 'Replay all matching', onclick: () => bulkByFilter('replay', query, note.value) }),
    el('button', { type: 'button', id: 'filter-resolve', text: 'Resolve all matching', onclick: () => bulkByFilter('resolve', query, note.value) }),
    note, ' ', count);
  const rows = el('tbody', { id: 'dead-letter-rows' });
  const more = el('button', { type: 'button', id: 'more', text: 'Older', hidden: true });
  page('Dead letters', form, actions,
    el('table', { id: 'dead-letters' }, el('thead', {}, el('tr', {}, ...['', 'id', 'failed at', 'topic', 'destination', 'idempotency key', 'attempts', 'reason', 'state'].map((t) => el('th', { text: t })))), rows),
    more);
  const fq = filterQuery(query);
  api('GET', '/api/dead-letters/count?' + fq.toString()).then((c) => { count.textContent = c.count + ' match'; }).catch(failed);
  const load = async (before) => {
    const q = filterQuery(query);
    if (before) q.set('before', before);
    let res;
    try { res = await api('GET', '/api/dead-letters?' + q.toString()); } catch (err) { return failed(err); }
    for (const d of res.dead_letters) {
      rows.append(el('tr', { 'data-id': d.id },
        el('td', {}, el('input', { type: 'checkbox', class: 'pick', value: d.id, 'aria-label': 'select ' + d.id })),
        el('td', {}, el('a', { href: '#dead-letter/' + d.id, text: d.id })),
        el('td', { text: when(d.failed_at) }),
        el('td', { text: d.topic }),
        el('td', {}, destinationLink(d.destination)),
        el('td', { class: 'key', text: d.idempotency_key }),
        el('td', { class: 'num', text: d.attempts }),
        el('td', { class: 'error-text', text: d.last_error }),
        el('td', { text: d.resolved_at ? 'resolved: ' + text(d.resolution) : (d.replay_requested_at ? 'replaying' : 'unresolved') })));
    }
    more.hidden = !res.next_before;
    more.onclick = () => load(res.next_before);
  };
  await load(null);
}

async function bulk(action, note) {
  const ids = [...document.querySelectorAll('input.pick:checked')].map((c) => Number(c.value));
  if (!ids.length) return say('Select dead letters first.', 'error');
  if (action === 'resolve' && !note.trim()) return say('Resolving needs a note saying how they were handled.', 'error');
  if (!window.confirm(`${action === 'replay' ? 'Replay' : 'Resolve'} ${ids.length} dead letter${ids.length === 1 ? '' : 's'}?`)) return;
  try {
    const r = await api('POST', '/api/dead-letters/' + action, action === 'replay' ? { ids } : { ids, note });
    say(`${action === 'replay' ? 'Replayed' : 'Resolved'} ${r.count} of ${ids.length}.`, 'ok');
    route();
  } catch (err) { failed(err); }
}

// Replay or resolve every unresolved dead letter the filter matches, however many: the
// API's bulk filter (topic, destination, since for replay, until). The confirmation says
// how many match now; the answer says how many changed (audited as one entry).
async function bulkByFilter(action, query, note) {
  const filter = {};
  for (const f of ['topic', 'destination', 'since', 'until']) if (query.get(f)) filter[f] = query.get(f);
  const other = ['reason', 'key'].filter((f) => query.get(f));
  if ((query.get('state') || 'unresolved') !== 'unresolved') other.push('state');
  if (action === 'resolve' && filter.since) other.push('since');
  if (other.length) return say(`${action === 'replay' ? 'Replay' : 'Resolve'} by filter takes topic, destination, ${action === 'replay' ? 'since, ' : ''}until and unresolved entries only; clear ${other.join(', ')} or select entries instead.`, 'error');
  if (action === 'resolve' && !note.trim()) return say('Resolving needs a note saying how they were handled.', 'error');
  const q = new URLSearchParams(filter);
  let n;
  try { n = (await api('GET', '/api/dead-letters/count?' + q.toString())).count; } catch (err) { return failed(err); }
  if (!n) return say('No unresolved dead letter matches.', 'error');
  const described = Object.keys(filter).length ? Object.entries(filter).map(([k, v]) => `${k} ${v}`).join(', ') : 'no filter: every unresolved dead letter';
  if (!window.confirm(`${action === 'replay' ? 'Replay' : 'Resolve'} all ${n} unresolved dead letter${n === 1 ? '' : 's'} matching ${described}?`)) return;
  try {
    const r = await api('POST', '/api/dead-letters/' + action, action === 'replay' ? { filter } : { filter, note });
    say(`${action === 'replay' ? 'Replayed' : 'Resolved'} ${r.count} dead letter${r.count === 1 ? '' : 's'} matching ${described}.`, 'ok');
    route();
  } catch (err) { failed(err); }
}

// A payload as the stranger wrote it, shown as text only: pretty JSON when it is JSON,
// text as is, anything else as hex; a cut payload says so and offers the whole download.
function payloadView(id, p) {
  const box = el('div', { id: 'payload' });
  let shown;
  if (p.kind === 'text') {
    shown = p.text;
    if (!p.truncated) {
      try { shown = JSON.stringify(JSON.parse(p.text), null, 2); } catch (e) { shown = p.text; }
    }
  } else {
    const lines = [];
    for (let i = 0; i < p.hex.length; i += 32) {
      const chunk = p.hex.slice(i, i + 32);
      lines.push((i / 2).toString(16).padStart(8, '0') + '  ' + chunk.replace(/(..)/g, '$1 ').trim());
    }
    shown = lines.join('\n');
  }
  box.append(el('p', { class: 'muted', text: `${p.kind === 'text' ? 'Text' : 'Binary, as hex'}; ${p.bytes} bytes` + (p.truncated ? `, first ${p.shown_bytes} shown` : '') }));
  box.append(el('pre', { class: 'payload', id: 'payload-text', text: shown }));
  box.append(el('a', { id: 'payload-download', href: `/api/dead-letters/${encodeURIComponent(id)}/payload`, download: `dead-letter-${id}.bin`, text: p.truncated ? 'Download the whole payload' : 'Download' }));
  return box;
}

async function deadLetterPage(id) {
  let d;
  try { d = await api('GET', '/api/dead-letters/' + encodeURIComponent(id)); } catch (err) { page('Dead letter ' + id); return failed(err); }
  const fields = el('dl', { class: 'fields', id: 'dead-letter-fields' });
  for (const k of ['id', 'origin', 'topic', 'destination', 'idempotency_key', 'message_key', 'content_type', 'attempts', 'last_error', 'failed_at', 'resolved_at', 'resolution', 'replay_requested_at', 'replays', 'outbox_id', 'kafka_topic', 'kafka_partition', 'kafka_offset', 'archive_object', 'restored_at']) {
    fields.append(el('dt', { text: k }), el('dd', { 'data-field': k, text: k.endsWith('_at') ? when(d[k]) : text(d[k]) }));
  }
  const note = el('input', { id: 'resolve-note', placeholder: 'how it was handled' });
  const open = !d.resolved_at;
  page('Dead letter ' + d.id, fields,
    el('h3', { text: 'Headers' }), el('pre', { class: 'payload', id: 'headers', text: JSON.stringify(d.headers, null, 2) }),
    el('h3', { text: 'Payload' }), payloadView(d.id, d.payload),
    el('div', { class: 'actions' },
      el('button', { type: 'button', id: 'replay', disabled: !open, text: 'Replay', onclick: async () => {
        if (!window.confirm('Replay dead letter ' + d.id + '?')) return;
        try { const r = await api('POST', `/api/dead-letters/${d.id}/replay`); say('Replayed: ' + r.outcome, 'ok'); route(); } catch (err) { failed(err); }
      } }),
      note,
      el('button', { type: 'button', id: 'resolve', disabled: !open, text: 'Resolve', onclick: async () => {
        try { await api('POST', `/api/dead-letters/${d.id}/resolve`, { note: note.value }); say('Resolved.', 'ok'); route(); } catch (err) { failed(err); }
      } })));
}

async function destinationsPage() {
  let list;
  try { list = await api('GET', '/api/destinations'); } catch (err) { page('Destinations'); return failed(err); }
  page('Destinations', table('destination-list', [
    { title: 'destination', cell: (d) => destinationLink(d.destination) },
    { title: 'state', cell: breakerCell },
    { title: 'since', cell: (d) => when(d.since) },
    { title: 'last error', cls: 'error-text', cell: (d) => text(d.last_error) },
  ], list));
}

async function destinationPage(name) {
  let d;
  try { d = await api('GET', '/api/destinations/' + encodeURIComponent(name)); } catch (err) { page('Destination ' + name); return failed(err); }
  const s = d.status;
  const reason = el('input', { id: 'pause-reason', placeholder: 'why (shown to others)' });
  const act = (what, body) => async () => {
    if (!window.confirm(`${what === 'pause' ? 'Pause' : 'Resume'} ${name}?`)) return;
    try {
      const r = await api('POST', `/api/destinations/${encodeURIComponent(name)}/${what}`, body ? body() : undefined);
      say(r.changed ? `${what === 'pause' ? 'Paused' : 'Resumed'} ${name}.` : `${name} was already ${what === 'pause' ? 'held' : 'running'}.`, 'ok');
      route();
    } catch (err) { failed(err); }
  };
  page('Destination ' + name,
    el('dl', { class: 'fields', id: 'destination-fields' },
      el('dt', { text: 'state' }), el('dd', { id: 'destination-state' }, breakerCell(s)),
      el('dt', { text: 'since' }), el('dd', { text: when(s.since) }),
      el('dt', { text: 'pause reason' }), el('dd', { text: text(s.pause_reason) }),
      el('dt', { text: 'next probe' }), el('dd', { text: s.breaker === 'closed' ? '' : (s.next_probe_at ? when(s.next_probe_at) : 'none: held until resumed') }),
      el('dt', { text: 'last error' }), el('dd', { text: text(s.last_error) + (s.last_error_at ? ' at ' + when(s.last_error_at) : '') }),
      el('dt', { text: 'last success' }), el('dd', { text: when(s.last_success_at) })),
    el('div', { class: 'actions' }, reason,
      el('button', { type: 'button', id: 'pause', text: 'Pause', onclick: act('pause', () => ({ reason: reason.value })) }),
      el('button', { type: 'button', id: 'resume', text: 'Resume', disabled: s.breaker === 'closed', onclick: act('resume') })),
    el('h3', { text: 'Retry steps' }),
    table('steps', [
      { title: 'step', key: 'step' }, { title: 'waiting', key: 'backlog', cls: 'num' },
      { title: 'consecutive failures', key: 'consecutive_failures', cls: 'num' },
      { title: 'delivered', key: 'delivered', cls: 'num' }, { title: 'failed', key: 'failed', cls: 'num' },
      { title: 'last error', key: 'last_error', cls: 'error-text' }, { title: 'reported', cell: (r) => when(r.reported_at) },
    ], d.steps),
    el('h3', { text: 'Pause history' }),
    table('history', [
      { title: 'when', cell: (h) => when(h.at) }, { title: 'who', key: 'who' }, { title: 'action', key: 'action' },
      { title: 'what', cls: 'error-text', cell: (h) => text(h.target) },
    ], d.history),
    el('h3', { text: 'Recent dead letters' }),
    table('recent-dead-letters', [
      { title: 'id', cell: (r) => el('a', { href: '#dead-letter/' + r.id, text: r.id }) },
      { title: 'failed at', cell: (r) => when(r.failed_at) }, { title: 'topic', key: 'topic' },
      { title: 'idempotency key', key: 'idempotency_key' }, { title: 'attempts', key: 'attempts', cls: 'num' },
      { title: 'reason', key: 'last_error', cls: 'error-text' }, { title: 'resolved', cell: (r) => when(r.resolved_at) },
    ], d.dead_letters));
}

// The archive's objects, newest day first, a page at a time by keyset (the last day and
// object shown), like the dead letters.
async function archivePage() {
  const rows = el('tbody', { id: 'archive-rows' });
  const more = el('button', { type: 'button', id: 'archive-more', text: 'Older', hidden: true });
  const shown = el('p', { id: 'archive-shown', class: 'muted' });
  page('Archive', el('p', { class: 'muted', text: 'Objects in S3 that hold archived dead letters, by the day of their first entry.' }),
    el('table', { id: 'archive' }, el('thead', {}, el('tr', {}, ...['day', 'object', 'ids', 'entries', 'archived at', ''].map((t) => el('th', { text: t })))), rows),
    more, shown);
  const load = async (next) => {
    let res;
    const q = next ? '?' + new URLSearchParams({ before_day: next.day, before_object: next.object }).toString() : '';
    try { res = await api('GET', '/api/archive' + q); } catch (err) { return failed(err); }
    for (const o of res.objects) {
      rows.append(el('tr', { 'data-object': o.object },
        el('td', { text: o.day }), el('td', { class: 'error-text', text: o.object }),
        el('td', { text: o.first_id + ' to ' + o.last_id }), el('td', { class: 'num', text: o.entries }),
        el('td', { text: when(o.archived_at) }),
        el('td', {}, el('button', { type: 'button', class: 'restore', text: 'Restore', onclick: async () => {
          if (!window.confirm('Restore ' + o.entries + ' dead letters from ' + o.object + '?')) return;
          try { const r = await api('POST', '/api/archive/restore', { object: o.object }); say(`Restored ${r.restored}, reactivated ${r.reactivated}, already present ${r.already_present}.`, 'ok'); } catch (err) { failed(err); }
        } }))));
    }
    more.hidden = !res.next;
    more.onclick = () => load(res.next);
    shown.textContent = `${rows.children.length} object${rows.children.length === 1 ? '' : 's'} shown` + (res.next ? '; older ones follow.' : '.');
  };
  await load(null);
}

async function auditPage() {
  const rows = el('tbody', { id: 'audit-rows' });
  const more = el('button', { type: 'button', id: 'audit-more', text: 'Older', hidden: true });
  page('Audit log', el('table', { id: 'audit' }, el('thead', {}, el('tr', {}, ...['when', 'who', 'action', 'what', 'count'].map((t) => el('th', { text: t })))), rows), more);
  const load = async (before) => {
    let res;
    try { res = await api('GET', '/api/audit' + (before ? '?before=' + before : '')); } catch (err) { return failed(err); }
    for (const a of res.entries) rows.append(el('tr', {}, el('td', { text: when(a.at) }), el('td', { text: a.who }), el('td', { text: a.action }), el('td', { class: 'error-text', text: text(a.target) }), el('td', { class: 'num', text: a.count })));
    more.hidden = !res.next_before;
    more.onclick = () => load(res.next_before);
  };
  await load(null);
}

// ------------------------------------------------------------------ start

document.addEventListener('DOMContentLoaded', async () => {
  document.getElementById('signin-form').addEventListener('submit', signIn);
  document.getElementById('signout').addEventListener('click', signOut);
  window.addEventListener('hashchange', route);
  try {
    await loadSession();
    route();
  } catch (err) {
    showSignIn('');
  }
});
