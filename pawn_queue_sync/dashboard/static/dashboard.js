// pawnq dashboard: reads /api/state (the server's last poll of the bucket: refreshing
// costs the bucket nothing) every interval, and the dead letters of the topic opened.
// Everything the bucket holds is put in the page as text (textContent), never as HTML.
"use strict";

const TOKEN_KEY = "pawnq-dashboard-token";
const ui = { data: null, topic: null, letters: [], selected: new Set(), timer: null, paused: false, awaitPoll: 0 };

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "className") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

function takeTokenFromUrl() {
  // #token=... (printed at start): the fragment never reaches a server nor a log
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
}

async function api(path, body) {
  const headers = { "Accept": "application/json" };
  if (token()) headers["X-Pawnq-Token"] = token();
  const opts = { headers, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    opts.method = "POST";
    headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const res = await fetch(path, opts);
  let doc = null;
  try { doc = await res.json(); } catch (e) { doc = null; }
  if (!res.ok) {
    const err = new Error((doc && doc.error) || ("HTTP " + res.status));
    err.status = res.status;
    throw err;
  }
  return doc;
}

function showError(text) {
  $("error").hidden = !text;
  $("error").textContent = text || "";
}

function count(row, field) {
  const v = row[field];
  if (v === null || v === undefined) return "–";
  return (row.exact === false ? "≥ " : "") + v.toLocaleString("en-US");
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 90) return Math.round(seconds) + " s";
  if (seconds < 5400) return Math.round(seconds / 60) + " min";
  if (seconds < 172800) return Math.round(seconds / 3600) + " h";
  return Math.round(seconds / 86400) + " d";
}

function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function chart(points, windowSeconds) {
  // bars of net messages out per second, one per poll (up: draining, down: growing)
  const ns = "http://www.w3.org/2000/svg", w = 160, h = 30, mid = h / 2;
  const svg = document.createElementNS(ns, "svg");
  const title = document.createElementNS(ns, "title");
  title.textContent = "net messages out per second at each poll, the last " +
    Math.round(windowSeconds / 60) + " min (up: draining, down: growing; red: new dead letters)";
  svg.append(title);
  svg.setAttribute("class", "chart");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  const axis = document.createElementNS(ns, "line");
  axis.setAttribute("class", "axis");
  axis.setAttribute("x1", 0); axis.setAttribute("x2", w);
  axis.setAttribute("y1", mid); axis.setAttribute("y2", mid);
  svg.append(axis);
  const top = Math.max(1e-9, ...points.map(p => Math.abs(p[1])));
  for (const [t, net, deadIn] of points) {
    const x = Math.max(0, Math.min(w - 2, ((windowSeconds + t) / windowSeconds) * w));
    const size = Math.max(net === 0 ? 0 : 1, (Math.abs(net) / top) * (mid - 2));
    const bar = document.createElementNS(ns, "rect");
    bar.setAttribute("class", net >= 0 ? "up" : "down");
    bar.setAttribute("x", x.toFixed(1)); bar.setAttribute("width", 2);
    bar.setAttribute("y", (net >= 0 ? mid - size : mid).toFixed(1));
    bar.setAttribute("height", size.toFixed(1));
    svg.append(bar);
    if (deadIn > 0) {
      const mark = document.createElementNS(ns, "rect");
      mark.setAttribute("class", "deadmark");
      mark.setAttribute("x", x.toFixed(1)); mark.setAttribute("y", 0);
      mark.setAttribute("width", 2); mark.setAttribute("height", 3);
      svg.append(mark);
    }
  }
  return svg;
}

function span(points) {
  // the chart's width in seconds: what the history holds, from 1 to 10 minutes
  return points.length ? Math.min(600, Math.max(60, 10 - points[0][0])) : 600;
}

function renderTopics(d) {
  const body = $("topics").tBodies[0];
  body.replaceChildren();
  $("no-topics").hidden = d.topics.length > 0 || !d.polled;
  for (const row of d.topics) {
    const points = (d.history && d.history[row.topic]) || [];
    const last = points.length ? points[points.length - 1][1] : null;
    const rate = el("div", { className: "rate muted" },
      last === null ? "waiting for a second poll" : (last >= 0 ? "+" : "") + last.toFixed(2) + "/s net out");
    const open = el("button", { type: "button", "data-open": row.topic }, "dead letters");
    open.addEventListener("click", () => openLetters(row.topic));
    const dead = el("td", { className: "num" + (row.dead_lettered ? " dead" : ""),
                            "data-field": "dead_lettered" }, count(row, "dead_lettered"));
    body.append(el("tr", { "data-topic": row.topic },
      el("td", {}, row.topic),
      el("td", { "data-field": "kind" }, row.packed ? "packed" : "plain"),
      el("td", { className: "num", "data-field": "pending" }, count(row, "pending")),
      el("td", { className: "num", "data-field": "in_flight" }, count(row, "in_flight")),
      el("td", { className: "num", "data-field": "delayed" }, count(row, "delayed")),
      dead,
      el("td", { className: "num", "data-field": "oldest" }, age(row.oldest_pending_age_seconds)),
      el("td", {}, chart(points, span(points)), rate),
      el("td", {}, open)));
  }
}

function renderConsumers(d) {
  const body = $("consumers").tBodies[0];
  body.replaceChildren();
  $("no-consumers").hidden = d.consumers.length > 0 || !d.polled;
  // consumers_exact false: the registry listing stopped at its bound
  $("consumers-cut").hidden = d.consumers_exact !== false;
  $("consumers-cut").textContent =
    `The first ${d.consumers.length} consumers of more (the registry listing stopped at its bound).`;
  for (const c of d.consumers) {
    body.append(el("tr", { "data-consumer": c.id },
      el("td", {}, c.name || "(unreadable entry)"),
      el("td", { className: "muted" }, String(c.id).slice(0, 8)),
      el("td", {}, when(c.last_seen)),
      el("td", { className: c.alive ? "alive" : "gone", "data-field": "alive" },
         c.alive ? "alive" : "dead")));
  }
}

function renderHeader(d) {
  $("store").textContent = d.store;
  $("mode").textContent = d.actions ? "actions allowed" : "read-only";
  $("mode").className = "badge" + (d.actions ? " actions" : "");
  const ago = d.age_seconds === null ? "not polled yet" : "polled " + Math.round(d.age_seconds) + " s ago";
  const cost = d.requests_last_poll === null ? "" : " · " + d.requests_last_poll + " requests a poll";
  $("status").textContent = ago + " · the bucket is read every " + d.interval_seconds +
    " s while a page is open" + cost + " · " + d.polls + " polls";
  $("token-form").hidden = !((d.actions || d.reads_need_token) && !token());
  $("letter-actions").hidden = !d.actions;
}

function renderLetters() {
  const body = $("letter-table").tBodies[0];
  body.replaceChildren();
  const actions = ui.data && ui.data.actions;
  for (const dl of ui.letters) {
    const box = el("input", { type: "checkbox", checked: ui.selected.has(dl.key), "data-select": dl.key });
    box.addEventListener("change", () => {
      if (box.checked) ui.selected.add(dl.key); else ui.selected.delete(dl.key);
      updateSelection();
    });
    const buttons = el("td", {});
    if (actions) {
      const redrive = el("button", { type: "button", "data-redrive": dl.key, disabled: !dl.redrivable }, "Redrive");
      redrive.addEventListener("click", () => act("redrive", { keys: [dl.key] }, "redrive this dead letter"));
      const purge = el("button", { type: "button", className: "danger", "data-purge": dl.key }, "Purge");
      purge.addEventListener("click", () => act("purge", { letters: { [dl.key]: dl.etag } }, "delete this dead letter"));
      buttons.append(redrive, " ", purge);
    }
    const payload = dl.payload === null ? el("span", { className: "muted" }, "(not a readable message)")
      : el("pre", { className: "payload" }, dl.payload + (dl.payload_cut ? " (cut)" : ""));
    body.append(el("tr", { "data-key": dl.key },
      el("td", {}, box),
      el("td", { className: "muted" }, dl.id || dl.key),
      el("td", { "data-field": "reason" }, dl.reason),
      el("td", { className: "num" }, dl.delivery_count === null ? "–" : dl.delivery_count),
      el("td", {}, when(dl.dead_lettered_at)),
      el("td", { "data-field": "payload" }, payload),
      buttons));
  }
  const row = ui.data && ui.data.topics.find(t => t.topic === ui.topic);
  const total = row ? row.dead_lettered : ui.letters.length;
  $("letters-count").textContent = "(" + (total > ui.letters.length
    ? "showing the first " + ui.letters.length + " of " + total : total) + ")";
  updateSelection();
}

function updateSelection() {
  const shown = new Set(ui.letters.map(dl => dl.key));
  for (const key of [...ui.selected]) if (!shown.has(key)) ui.selected.delete(key);
  $("redrive-selected").disabled = $("purge-selected").disabled = ui.selected.size === 0;
  $("select-all").checked = ui.letters.length > 0 && ui.selected.size === ui.letters.length;
}

async function loadLetters() {
  if (!ui.topic) return;
  const doc = await api("/api/dead-letters?topic=" + encodeURIComponent(ui.topic));
  ui.letters = doc.letters;
  renderLetters();
}

async function openLetters(topic) {
  ui.topic = topic;
  ui.selected.clear();
  $("letters").hidden = false;
  $("letters-topic").textContent = topic;
  $("action-result").textContent = "";
  try { await loadLetters(); showError(""); } catch (e) { showError("dead letters: " + e.message); }
}

async function act(action, what, question) {
  if (action === "purge" && !confirm("Really " + question + "? This cannot be undone.")) return;
  $("action-result").textContent = action + ": working…";
  try {
    const result = await api("/api/" + action, Object.assign({ topic: ui.topic }, what));
    $("action-result").textContent = action === "redrive"
      ? result.moved.length + " moved back, " + Object.keys(result.skipped).length + " skipped, " +
        Object.keys(result.failed).length + " failed"
      : result.deleted + " deleted" + (result.kept.length ? ", " + result.kept.length + " kept (changed since shown)" : "");
    ui.selected.clear();
    ui.awaitPoll = result.poll;  // the poll that shows it comes within seconds: ask sooner
    await refresh();
  } catch (e) {
    $("action-result").textContent = action + " refused: " + e.message;
    if (e.status === 403 && /token/.test(e.message)) $("token-form").hidden = false;
  }
}

async function refresh(again) {
  clearTimeout(ui.timer);
  let wait = 5;
  try {
    ui.data = await api("/api/state");
    wait = ui.data.polls < ui.awaitPoll ? 1 : Math.max(2, ui.data.interval_seconds);
    renderHeader(ui.data);
    renderTopics(ui.data);
    renderConsumers(ui.data);
    if (ui.topic) await loadLetters();
    showError(ui.data.error ? "last poll failed: " + ui.data.error : "");
    document.body.dataset.polls = String(ui.data.polls);
  } catch (e) {
    showError("cannot read the dashboard: " + e.message);
    if (e.status === 401) $("token-form").hidden = false;
  }
  // a hidden tab (another tab in front, a minimised window) stops asking, so the poller
  // goes idle behind it; it asks again as soon as it is shown
  if (document.hidden) ui.paused = true;
  else if (again !== false) ui.timer = setTimeout(refresh, wait * 1000);
}

function start() {
  takeTokenFromUrl();
  $("token-form").addEventListener("submit", ev => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token-input").value.trim());
    $("token-input").value = "";
    refresh();
  });
  $("select-all").addEventListener("change", () => {
    ui.selected = new Set($("select-all").checked ? ui.letters.map(dl => dl.key) : []);
    renderLetters();
  });
  $("redrive-selected").addEventListener("click", () =>
    act("redrive", { keys: [...ui.selected] }, "redrive the selected dead letters"));
  $("purge-selected").addEventListener("click", () => {
    const letters = {};
    for (const dl of ui.letters) if (ui.selected.has(dl.key)) letters[dl.key] = dl.etag;
    act("purge", { letters }, "delete the " + ui.selected.size + " selected dead letter(s)");
  });
  $("redrive-all").addEventListener("click", () => act("redrive", { all: true }, "redrive every dead letter"));
  $("purge-all").addEventListener("click", () =>
    act("purge", { all: true }, "delete EVERY dead letter of " + ui.topic));
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && ui.paused) { ui.paused = false; refresh(); }
  });
  refresh();
}

document.addEventListener("DOMContentLoaded", start);
