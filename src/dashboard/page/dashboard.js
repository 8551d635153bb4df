// sluicegate's dashboard: asks /dashboard.json every second for what changed and draws
// it. Plain JavaScript, nothing from another origin. Every value from the server is put
// in the page as text (never as markup): keys are whatever clients sent.
'use strict';

(() => {
  const SECONDS = 900;
  const TOKEN = 'sluicegate.admin-token';
  const SVG = 'http://www.w3.org/2000/svg';
  // A route's request series, each a line and a column (annotated: forwarded with
  // RateLimit-Exceeded by a soft limit).
  const ROUTE_KINDS = ['passed', 'annotated', 'delayed', 'refused'];
  const $ = (selector) => document.querySelector(selector);

  // The history held: per route and per limit, one array per series, all `length` long.
  let since = null;
  let length = 0;
  const history = { routes: new Map(), limits: new Map() };
  let timer = null;

  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props)) {
      if (name === 'class') node.className = value;
      else if (name === 'text') node.textContent = value;
      else if (name.startsWith('data-')) node.setAttribute(name, value);
      else node[name] = value;
    }
    node.append(...children.filter((c) => c !== null && c !== undefined));
    return node;
  }

  function authorization() {
    const token = sessionStorage.getItem(TOKEN);
    return token ? { Authorization: 'Bearer ' + token } : {};
  }

  function status(text, kind) {
    const pill = $('#status');
    pill.textContent = text;
    pill.className = 'pill ' + kind;
  }

  function askToken(message) {
    clearTimeout(timer);
    $('#dashboard').hidden = true;
    $('#login').hidden = false;
    $('#login-error').textContent = message;
    status('token needed', '');
    $('#token').focus();
  }

  async function poll() {
    clearTimeout(timer);
    try {
      const url = since === null ? '/dashboard.json' : '/dashboard.json?since=' + since;
      const answer = await fetch(url, { headers: authorization(), cache: 'no-store', credentials: 'omit' });
      if (answer.status === 401) {
        sessionStorage.removeItem(TOKEN);
        since = null;
        askToken('That token was refused.');
        return;
      }
      if (!answer.ok) throw new Error('answered ' + answer.status);
      const state = await answer.json();
      show(state);
      since = state.seq;
      document.body.dataset.seq = state.seq;
      status('live', 'live');
    } catch (error) {
      status('no answer: ' + error.message, 'offline');
    }
    timer = setTimeout(poll, 1000);
  }

  // Keeps the series of `name` in `kept` as `fresh` says: the whole history, or the
  // seconds after the last poll's.
  function follow(kept, name, fresh, keys, full) {
    const old = (!full && kept.get(name)) || {};
    const series = {};
    for (const key of keys) {
      let values = (old[key] || []).concat(fresh[key]);
      if (values.length < length) values = new Array(length - values.length).fill(0).concat(values);
      series[key] = values.slice(-SECONDS);
    }
    kept.set(name, series);
    return series;
  }

  function show(state) {
    length = state.full ? state.seconds : Math.min(SECONDS, length + state.seconds);
    $('#dashboard').hidden = false;
    $('#login').hidden = true;
    const i = state.instance;
    $('#instance').textContent = `${i.version} · up ${duration(i.uptime_s * 1000)}` + (i.file ? ` · ${i.file}` : '');
    showRoutes(state);
    showLimits(state);
    showCandidate(state.candidate);
    showUpstreams(state.upstreams);
    showRedis(state.redis);
    showConfiguration(state.instance);
  }

  // Rows of `container` keyed by `key`: made once by `make`, updated by `update`; the rows
  // of keys no longer listed go. (Updating in place keeps a button under the pointer.)
  function keyed(container, items, key, make, update) {
    const rows = new Map([...container.children].map((row) => [row.dataset.key, row]));
    items.forEach((item, index) => {
      const k = key(item);
      let row = rows.get(k);
      if (!row) {
        row = make(item);
        row.dataset.key = k;
      }
      rows.delete(k);
      update(row, item);
      if (container.children[index] !== row) container.insertBefore(row, container.children[index] || null);
    });
    for (const row of rows.values()) row.remove();
  }

  function showRoutes(state) {
    const names = new Set(state.routes.map((r) => r.name));
    for (const name of history.routes.keys()) if (!names.has(name)) history.routes.delete(name);
    keyed($('#routes tbody'), state.routes, (r) => r.name,
      (r) => el('tr', { 'data-route': r.name },
        el('td', {}, el('span', { class: 'name' }), el('span', { class: 'sub' })),
        el('td', {}, spark(ROUTE_KINDS), el('span', { class: 'sub' })), ...Array.from({ length: 7 }, () => el('td', { class: 'num' }))),
      (row, r) => {
        const s = follow(history.routes, r.name, r, [...ROUTE_KINDS, 'server_errors'], state.full);
        const cells = row.children;
        cells[0].firstChild.textContent = r.name;
        const to = r.upstream ? `upstream ${r.upstream}` : `answers ${r.respond.status}`;
        const grpc = Object.entries(r.grpc).map(([status, n]) => `${status} ${n}`).join(', ');
        cells[0].lastChild.textContent = to + (r.limits.length ? ' · limits: ' + r.limits.map(limitUse).join(', ') : '') +
          (grpc ? ` · gRPC calls: ${grpc}` : '') + (r.held ? ' · ' + held(r.held) : '');
        cells[1].lastChild.textContent = draw(cells[1].firstChild, ROUTE_KINDS.map((k) => s[k]), 'requests per second');
        ROUTE_KINDS.forEach((k, i) => { cells[2 + i].textContent = rate(s[k]); });
        cells[6].textContent = rate(s.server_errors);
        cells[7].textContent = r.latency ? ms(r.latency.p50_ms) : '–';
        cells[8].textContent = r.latency ? ms(r.latency.p99_ms) : '–';
      });
    leftOut('#routes-left-out', state.routes_left_out, 'routes');
  }

  // The keys a route holds after its upstream refused them (upstream_hold).
  function held(h) {
    const keys = h.keys.map((k) => `${k.key} ${k.status} ${duration(k.left_ms)} left`).join(', ');
    return `held by the upstream now: ${h.now}` + (keys ? ` (${keys})` : '') +
      ` · holds ${h.begun}, requests answered from them ${h.answered}`;
  }

  // A route's limit: its name, with the route's own burst and delay if it gives them.
  function limitUse(u) {
    if (typeof u === 'string') return u;
    const delay = u.nodelay ? ', nodelay' : u.delay ? `, delay ${u.delay}` : '';
    return `${u.limit} (burst ${u.burst}${delay})`;
  }

  function showLimits(state) {
    const names = new Set(state.limits.map((l) => l.name));
    for (const name of history.limits.keys()) if (!names.has(name)) history.limits.delete(name);
    keyed($('#limits .cards'), state.limits, (l) => l.name,
      (l) => el('div', { class: 'card', 'data-limit': l.name },
        el('h3', {}, el('span', { text: l.name }), el('span', { class: 'badge scope' }), el('span', { class: 'badge dry', text: 'dry run' })),
        el('div', { class: 'muted words' }),
        spark(),
        el('div', { class: 'sub peak' }),
        el('div', { class: 'stats' }),
        el('h4', { class: 'bans-title' }),
        el('ul', { class: 'bans' }),
        el('h4', { class: 'refused-title', text: 'Refused most in the last minute' }),
        el('ol', { class: 'refused' })),
      (card, l) => {
        const s = follow(history.limits, l.name, l, ['passed', 'delayed', 'rejected'], state.full);
        card.querySelector('.scope').textContent = l.scope;
        card.querySelector('.dry').hidden = !l.dry_run;
        card.querySelector('.refused-title').textContent =
          (l.dry_run ? 'Would have refused most' : 'Refused most') + ' in the last minute';
        const budget = l.money ? (w) => ({ ...w, limit: `${w.limit} ${l.money}` }) : (w) => w;
        const own = l.limit_from;
        const from = own ? (own.header ? `header ${own.header}, ` : own.jwt ? `claim ${own.jwt}, ` : '') : '';
        card.querySelector('.words').textContent = `key ${l.key.join(' + ')} · ${l.windows.map(budget).map(words).join(' and ')}` +
          (l.ban ? ` · ban ${l.ban}` : '') + (own ? ` · own counts from ${from}the operator, ${own.min} to ${own.max}` : '');
        card.querySelector('.peak').textContent =
          draw(card.querySelector('svg'), [s.passed, s.delayed, s.rejected], 'decisions per second');
        const stats = card.querySelector('.stats');
        stats.replaceChildren(...[
          stat('decisions/s', rate(s.passed.map((p, i) => p + s.delayed[i] + s.rejected[i]))),
          stat(l.dry_run ? 'would refuse/s' : 'refused/s', rate(s.rejected)),
          l.scope === 'global' ? stat('keys', 'in Redis') : stat('keys / max_keys', `${l.keys} / ${l.max_keys}`, l.keys / l.max_keys),
          stat('evictions', String(l.evictions)),
          l.missing_key > 0 ? stat('without its key', String(l.missing_key)) : null,
          l.own_counts ? stat('keys given own counts', String(l.own_counts.given)) : null,
          l.own_counts ? stat('decided with own counts (clamped)', `${l.own_counts.applied} (${l.own_counts.clamped})`) : null,
          l.own_counts && l.own_counts.untrusted > 0 ? stat('own counts from untrusted peers, ignored', String(l.own_counts.untrusted)) : null,
          l.in_flight === null ? null : stat('in flight', String(l.in_flight)),
          l.ceiling ? stat('ceiling (learns within min–max)', `${l.ceiling.now} (${l.ceiling.min}–${l.ceiling.max})`, (l.in_flight || 0) / l.ceiling.now) : null,
          l.ceiling && l.ceiling.recent_ms !== null ? stat('held ms: recent / ground', `${l.ceiling.recent_ms.toFixed(1)} / ${l.ceiling.ground_ms.toFixed(1)}`) : null,
          l.queued ? stat('waiting / queue max', `${l.queued.waiting} / ${l.queue.max}`, l.queued.waiting / l.queue.max) : null,
          l.queued ? stat('waits served · refused · left', `${l.queued.served} · ${l.queued.refused} · ${l.queued.left}`) : null].filter(Boolean));
        const title = card.querySelector('.bans-title');
        title.hidden = l.ban === null;
        title.textContent = `Banned now: ${l.banned}` + (l.banned > l.bans.length ? ` (${l.bans.length} with the most time left shown)` : '');
        keyed(card.querySelector('ul.bans'), l.bans, (b) => b.key,
          (b) => el('li', { 'data-ban': b.key }, el('span'), el('button', { type: 'button', text: 'lift', class: 'lift' })),
          (li, b) => {
            li.firstChild.textContent = `${b.key ?? 'a key being banned'} · ${duration(b.left_ms)} left`;
            li.lastChild.onclick = () => lift(l.name, b.key, li.lastChild);
          });
        keyed(card.querySelector('ol.refused'), l.refused_most, (k) => k.key,
          () => el('li', { class: 'refused-key' }),
          (li, k) => { li.textContent = `${k.key} (${k.count})`; });
      });
    leftOut('#limits-left-out', state.limits_left_out, 'limits');
  }

  async function lift(limit, key, button) {
    button.disabled = true;
    const path = `/bans/${encodeURIComponent(limit)}/${encodeURIComponent(key || '')}`;
    try {
      const answer = await fetch(path, { method: 'DELETE', headers: authorization(), credentials: 'omit' });
      if (answer.status !== 204 && answer.status !== 404) throw new Error('answered ' + answer.status);
      poll();
    } catch (error) {
      button.disabled = false;
      status('lifting failed: ' + error.message, 'offline');
    }
  }

  // The live candidate's changes since it was loaded; hidden while there is none.
  function showCandidate(c) {
    const section = $('#candidate');
    section.hidden = !c;
    if (!c) return;
    const changes = c.changes;
    section.querySelector('.about').textContent = `${c.file}, live since ${c.loaded} (${duration(c.seconds * 1000)}): `
      + `${c.requests} requests decided by both, ${changes.newly_refused} it would newly refuse, `
      + `${changes.newly_admitted} newly admit` + c.warnings.map((w) => `; warning: ${w}`).join('');
    const counts = new Map(changes.limits.map((l) => [l.name, l]));
    keyed(section.querySelector('tbody'), c.limit_decisions, (l) => l.limit,
      () => el('tr', {}, el('td'), ...[1, 2, 3, 4].map(() => el('td', { class: 'num' }))),
      (row, l) => {
        const cells = row.children;
        const rejected = (side) => (side ? side.rejected : '–');
        row.dataset.candidateLimit = l.limit;
        cells[0].textContent = l.limit;
        cells[1].textContent = rejected(counts.get(l.limit)?.old);
        cells[2].textContent = rejected(counts.get(l.limit)?.new);
        cells[3].textContent = l.refused;
        cells[4].textContent = l.admitted;
      });
    const list = (selector, items, text) =>
      section.querySelector(selector).replaceChildren(...items.map((item) => el('li', { text: text(item) })));
    const key = (k) => `${k.limit}: ${k.key} (${k.requests})`;
    list('ol.newly-refused', changes.newly_refused_keys, key);
    list('ol.newly-admitted', c.newly_admitted_keys, key);
    list('ol.rerouted', c.rerouted, (r) => `${r.route} → ${r.candidate_route} (${r.requests})`);
  }

  function showUpstreams(upstreams) {
    const rows = upstreams.flatMap((u) => u.servers.map((s) => ({ upstream: u.name, ...s })));
    keyed($('#upstreams tbody'), rows, (s) => s.upstream + ' ' + s.address,
      () => el('tr', {}, el('td'), el('td'), el('td'), el('td', { class: 'num' }), el('td', { class: 'num' }), el('td', { class: 'num' }), el('td', { class: 'num' })),
      (row, s) => {
        const cells = row.children;
        cells[0].textContent = s.upstream;
        cells[1].textContent = s.address;
        cells[2].replaceChildren(s.out
          ? el('span', { class: 'state-out', text: `out for ${duration(s.out.for_ms)}: ${s.out.why}` })
          : el('span', { class: 'state-in', text: 'in use' }));
        cells[3].textContent = s.in_flight;
        // The pool's connections to it: lent now and idle, kept as the load needs.
        cells[4].textContent = `${s.connections.in_use + s.connections.idle} (${s.connections.idle})`;
        cells[5].textContent = s.failures;
        cells[6].textContent = s.check_ms === null ? '–' : ms(s.check_ms);
      });
  }

  function showRedis(redis) {
    const list = $('#redis dl');
    if (!redis) {
      list.replaceChildren(el('dt', { text: 'Redis' }), el('dd', { text: 'not used: no global limits' }));
      return;
    }
    const m = redis.minute;
    const away = redis.unreachable;
    list.replaceChildren(...pairs([
      ['Redis', redis.reach + (away ? ` since ${clock(away.since_ms)}, probed every ${duration(away.probed_every_ms)}` : '')],
      away ? ['last error', away.error] : null,
      ['circuit breaker', redis.breaker_open ? 'open: global limits decided by on_store_error' : 'closed'],
      ['decisions asked of Redis (last minute)', `${m.calls} (${(m.calls / Math.max(1, m.seconds)).toFixed(1)}/s), ${m.errors} failed, ${m.skipped} skipped`],
      ['fallbacks (last minute)', `allow ${m.fallbacks.allow}, deny ${m.fallbacks.deny}, local ${m.fallbacks.local}`],
      ['near-cache hit rate (last minute)', m.near_cache_hit_rate === null ? '–' : `${(m.near_cache_hit_rate * 100).toFixed(1)} % (${m.near_cache_hits})`],
    ]));
  }

  function showConfiguration(i) {
    const reload = (r) => r ? `${clock(r.at_ms)} by ${r.how}: ${r.errors ? 'failed' : 'applied'}` : 'none since start';
    const failed = i.last_failed_reload;
    $('#configuration dl').replaceChildren(...pairs([
      ['file', i.file || 'none (not started from a file)'],
      ['listen', i.listen.join(', ')],
      ['version', i.version],
      ['up', duration(i.uptime_s * 1000)],
      ['log_keys', i.log_keys],
      ['last reload', reload(i.last_reload)],
      ['last failed reload', failed ? reload(failed) : 'none since start'],
      failed ? ['its errors', el('pre', { text: failed.errors })] : null,
    ]));
  }

  function pairs(rows) {
    return rows.filter(Boolean).flatMap(([term, value]) => [el('dt', { text: term }), el('dd', {}, value)]);
  }

  function stat(name, value, share) {
    const meter = share === undefined ? null
      : el('div', { class: 'meter' }, el('span'));
    if (meter) meter.firstChild.style.width = `${Math.min(100, share * 100).toFixed(1)}%`;
    return el('div', {}, el('b', { text: name }), value, meter);
  }

  function leftOut(selector, count, what) {
    const note = $(selector);
    note.hidden = count === 0;
    note.textContent = `${count} more ${what} are not shown here (see /metrics).`;
  }

  // A sparkline with one line per kind, drawn in that order (the first says where 0 is).
  function spark(kinds = ['passed', 'delayed', 'refused']) {
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('class', 'spark');
    svg.setAttribute('viewBox', `0 0 ${SECONDS} 100`);
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.append(document.createElementNS(SVG, 'title'));
    for (const kind of kinds) {
      const line = document.createElementNS(SVG, 'polyline');
      line.setAttribute('class', kind);
      svg.append(line);
    }
    return svg;
  }

  // The series as lines over the last 15 minutes, the newest second at the right edge,
  // on one scale from 0 to their highest value; returns what the scale's top stands for.
  // A series that stayed at 0 is not drawn (its line would lie over the others' at 0,
  // in its own colour: a refusal-coloured line on a route that refused nothing), but for
  // the first, which shows where 0 is.
  function draw(svg, series, what) {
    const top = Math.max(1, ...series.map((values) => Math.max(0, ...values)));
    const lines = svg.querySelectorAll('polyline');
    series.forEach((values, i) => {
      const start = SECONDS - values.length;
      const drawn = i === 0 || values.some((v) => v > 0);
      const points = drawn ? values.map((v, x) => `${start + x},${(100 - (v / top) * 96).toFixed(1)}`) : [];
      lines[i].setAttribute('points', points.join(' '));
    });
    svg.firstChild.textContent = `${what}, last 15 minutes; top of the scale ${top}/s`;
    return `15 min ago … now; top ${top}/s`;
  }

  // The mean per second over the last 10 seconds.
  function rate(values) {
    const last = values.slice(-10);
    if (!last.length) return '0';
    const mean = last.reduce((a, b) => a + b, 0) / last.length;
    return mean >= 10 ? mean.toFixed(0) : mean.toFixed(1);
  }

  function words(w) {
    if (w.rate) return `${w.rate} burst ${w.burst}` + (w.nodelay ? ' nodelay' : w.delay ? ` delay ${w.delay}` : '');
    if (w.concurrency !== undefined) return `concurrency ${w.concurrency}`;
    return `${w.algorithm} ${w.limit} per ${typeof w.window === 'string' ? w.window : calendar(w.window)}`;
  }

  // A calendar window: `month (Europe/Berlin, from day 1)`.
  function calendar(c) {
    return `${c.calendar} (${c.tz}` + (c.reset_day !== undefined ? `, from ${Number.isInteger(c.reset_day) ? 'day ' : ''}${c.reset_day}` : '') + ')';
  }

  function ms(value) {
    return value >= 1000 ? (value / 1000).toFixed(2) + ' s' : value.toFixed(value >= 10 ? 0 : 1) + ' ms';
  }

  function duration(milliseconds) {
    let s = Math.round(milliseconds / 1000);
    const parts = [];
    for (const [unit, size] of [['d', 86400], ['h', 3600], ['m', 60]]) {
      if (s >= size) {
        parts.push(Math.floor(s / size) + unit);
        s %= size;
      }
    }
    if (s || !parts.length) parts.push(s + 's');
    return parts.slice(0, 2).join(' ');
  }

  // In UTC and 24 hours, as the instance's logs write time: not the browser's zone.
  function clock(unixMs) {
    return new Date(unixMs).toISOString().slice(0, 19).replace('T', ' ') + ' UTC';
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('#login').addEventListener('submit', (event) => {
      event.preventDefault();
      const token = $('#token').value;
      $('#token').value = '';
      if (!token) return;
      sessionStorage.setItem(TOKEN, token);
      $('#login').hidden = true;
      poll();
    });
    if (document.body.dataset.token === 'required' && !sessionStorage.getItem(TOKEN)) {
      askToken('');
    } else {
      poll();
    }
  });
})();
