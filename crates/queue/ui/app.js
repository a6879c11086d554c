// kjob-queue's web view. No framework, no build step: the page reads the admin port's JSON
// (../api/v1/..., relative, so it works behind kube-apiserver's service proxy prefix) every
// POLL_MS and rebuilds the parts that changed. Everything from Redis (Job names are user
// input) reaches the page through textContent or a DOM attribute, never as HTML.
"use strict";

// How often a page refreshes itself.
const POLL_MS = 2000;
const SVG_NS = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);

// An element with properties (className, href, title, ...) and children (strings become text).
function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v !== undefined && v !== null) e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    e.append(typeof c === "string" || typeof c === "number" ? String(c) : c);
  }
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function setText(id, text) {
  const e = $(id);
  const t = text === null || text === undefined ? "" : String(text);
  if (e.textContent !== t) e.textContent = t;
}

// "4.2 s", "3 m 05 s", "1 h 02 m".
function dur(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "–";
  const s = Math.max(0, seconds);
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  if (s < 3600) return Math.floor(s / 60) + " m " + String(Math.floor(s % 60)).padStart(2, "0") + " s";
  return Math.floor(s / 3600) + " h " + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + " m";
}

function clock(unixMs) {
  if (unixMs === null || unixMs === undefined) return "–";
  return new Date(unixMs).toLocaleTimeString([], { hour12: false });
}

function jobHref(key) {
  const [ns, ...rest] = key.split("/");
  return "#/jobs/" + encodeURIComponent(ns) + "/" + encodeURIComponent(rest.join("/"));
}

function replaceRows(tbody, rows) {
  tbody.replaceChildren(...rows);
}

// ---- fetching -----------------------------------------------------------------------------

class HttpError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || "HTTP " + status);
    this.status = status;
    this.code = body && body.error && body.error.code;
  }
}

async function getJson(path) {
  const resp = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
  let body = null;
  try {
    body = await resp.json();
  } catch (_) {
    body = null;
  }
  if (!resp.ok) throw new HttpError(resp.status, body);
  return body;
}

function status(ok, text) {
  const s = $("status");
  s.className = ok ? "status" : "status bad";
  s.textContent = text;
}

// Marks a page rendered: the first time since the document loaded (a performance mark the
// browser test reads as the page's load time) and every time (a counter it waits on).
function rendered(kind) {
  const b = document.body;
  if (!performance.getEntriesByName("kjob-rendered").length) performance.mark("kjob-rendered");
  b.dataset.page = kind;
  b.dataset.renders = String(Number(b.dataset.renders || 0) + 1);
}

// ---- overview -----------------------------------------------------------------------------

function drawChart(v) {
  const box = $("chart");
  const W = Math.max(box.clientWidth, 300);
  const H = box.clientHeight || 190;
  const pad = { l: 44, r: 10, t: 8, b: 22 };
  const now = v.now_unix_ms;
  const points = v.series.map((p) => ({ t: p.at_unix_ms, ready: p.ready, delayed: p.delayed, leased: p.leased }));
  // The right edge is now: the depth read with this answer.
  points.push({ t: now, ready: v.depth.ready, delayed: v.depth.delayed, leased: v.depth.leased });
  // The span the samples cover (a replica that just started has only a few), at least a
  // minute, at most the window.
  const fullMs = v.window_seconds * 1000;
  const spanMs = Math.min(fullMs, Math.max(60000, now - points[0].t));
  const max = Math.max(1, ...points.map((p) => Math.max(p.ready, p.delayed, p.leased)));
  const top = niceCeil(max);
  const x = (t) => pad.l + ((t - (now - spanMs)) / spanMs) * (W - pad.l - pad.r);
  const y = (n) => pad.t + (1 - n / top) * (H - pad.t - pad.b);

  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "queue depth over the last minutes" });
  for (const f of [0, 0.5, 1]) {
    const n = Math.round(top * f);
    s.append(svg("line", { class: "axis", x1: pad.l, x2: W - pad.r, y1: y(n), y2: y(n) }));
    const label = svg("text", { class: "tick", x: pad.l - 6, y: y(n) + 4, "text-anchor": "end" });
    label.textContent = String(n);
    s.append(label);
  }
  // Five time ticks, in whole minutes or seconds.
  const stepS = spanMs >= 300000 ? Math.ceil(spanMs / 5 / 60000) * 60 : Math.ceil(spanMs / 5 / 10000) * 10;
  for (let back = 0; back * 1000 <= spanMs; back += stepS) {
    const label = svg("text", { class: "tick", x: x(now - back * 1000), y: H - 6, "text-anchor": back === 0 ? "end" : "middle" });
    label.textContent = back === 0 ? "now" : "−" + (stepS % 60 === 0 ? back / 60 + " min" : back + " s");
    s.append(label);
  }
  for (const series of ["delayed", "leased", "ready"]) {
    const pts = points.filter((p) => p.t >= now - spanMs).map((p) => `${x(p.t).toFixed(1)},${y(p[series]).toFixed(1)}`);
    if (pts.length === 1) pts.unshift(`${(x(now) - 2).toFixed(1)},${pts[0].split(",")[1]}`);
    s.append(svg("polyline", { class: "line " + series, points: pts.join(" ") }));
  }
  box.replaceChildren(s);
  const have = (now - points[0].t) / 1000;
  setText("chart-window", have < v.window_seconds - v.sample_period_seconds
    ? "since this replica started, " + dur(have) + " ago"
    : "last " + Math.round(v.window_seconds / 60) + " minutes");
}

function niceCeil(n) {
  const p = Math.pow(10, Math.floor(Math.log10(n)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= n) return m * p;
  return 10 * p;
}

function renderOverview(v) {
  const d = v.depth;
  setText("ov-ready", d.ready.toLocaleString());
  setText("ov-delayed", d.delayed.toLocaleString());
  setText("ov-leased", d.leased.toLocaleString());
  setText("ov-oldest", d.oldest_ready_age_seconds === null ? "none waiting" : "oldest waits " + dur(d.oldest_ready_age_seconds));
  setText("ov-failing", d.failing ? d.failing.toLocaleString() + " in request backoff" : "none failing");
  setText("ov-lease-age", d.oldest_lease_age_seconds === null ? "no lease held" : "oldest held " + dur(d.oldest_lease_age_seconds));
  setText("ov-workers", v.workers.length.toLocaleString());
  setText("ov-namespaces", v.namespaces_total.toLocaleString() + " namespace" + (v.namespaces_total === 1 ? "" : "s") + " with work");
  drawChart(v);

  replaceRows($("ns-table").tBodies[0], v.namespaces.map((r) => el("tr", {},
    el("td", {}, r.namespace),
    el("td", { className: "num" }, r.ready.toLocaleString()),
    el("td", { className: "num" }, r.delayed.toLocaleString()),
    el("td", { className: "num" }, r.leased.toLocaleString()),
    el("td", { className: "num" }, r.oldest_ready_age_seconds === null ? "–" : dur(r.oldest_ready_age_seconds)),
    el("td", { className: "num" }, r.syncs_per_second.toFixed(2)))));
  $("ns-empty").hidden = v.namespaces.length > 0;
  setText("ns-note", v.namespaces_total > v.namespaces.length
    ? `top ${v.namespaces.length} of ${v.namespaces_total}` + (v.namespaces_truncated ? " (lower bounds)" : "")
    : "");

  replaceRows($("workers-table").tBodies[0], v.workers.map((w) => el("tr", {},
    el("td", {}, w.worker),
    el("td", { className: "num" }, w.leases.toLocaleString()),
    el("td", { className: "keys" }, ...w.keys.map((k) =>
      el("a", { href: jobHref(k.key), title: "leased " + dur(k.age_seconds) + " ago" }, k.key))))));
  $("workers-empty").hidden = v.workers.length > 0;
  setText("workers-note", v.workers_truncated ? "from a sample of the leases" : "");
}

// ---- Job page -----------------------------------------------------------------------------

const OUTCOMES = { forget: "succeeded", error: "failed", requeue_after: "asked to sync again" };

function historyRow(h) {
  let event, details = [];
  let cls = "";
  if (h.event === "enqueued") {
    event = "enqueued";
    if (h.delay_seconds > 0) details.push("delayed " + dur(h.delay_seconds));
    if (h.observations > 0) details.push(h.observations + " pod observation" + (h.observations === 1 ? "" : "s"));
  } else if (h.event === "lease_expired") {
    event = "lease expired";
    cls = "err";
    details.push(h.expiries_in_a_row + " in a row without a Done" + (h.poisoned ? ", sent to backoff" : ""));
  } else {
    event = "sync " + (OUTCOMES[h.outcome] || h.outcome);
    if (h.outcome === "error") cls = "err";
    if (h.leased_at_unix_ms) details.push("took " + dur((h.at_unix_ms - h.leased_at_unix_ms) / 1000));
    if (h.requeue_delay_seconds !== null && h.requeue_delay_seconds !== undefined) details.push("again in " + dur(h.requeue_delay_seconds));
  }
  const detail = el("td", {}, details.join(" · "));
  if (h.error) detail.append(el("div", { className: "err" }, h.error));
  return el("tr", { className: "event-" + h.event },
    el("td", { title: new Date(h.at_unix_ms).toISOString() }, clock(h.at_unix_ms)),
    el("td", { className: cls }, event),
    el("td", {}, h.worker || "–"),
    detail);
}

function badge(state) {
  const b = $("job-state");
  b.className = "badge " + state;
  b.textContent = state;
}

function renderJob(x) {
  $("job-missing").hidden = true;
  $("job-body").hidden = false;
  badge(x.state);
  const r = $("job-reason");
  r.className = "reason " + x.state;
  r.textContent = x.reason;
  r.title = x.reason_code;

  if (x.due_in_seconds !== null) {
    setText("job-due", "in " + dur(x.due_in_seconds));
    setText("job-due-at", "at " + clock(x.due_unix_ms));
  } else if (x.state === "ready") {
    setText("job-due", "now");
    setText("job-due-at", x.ready ? "waiting " + dur(x.ready.age_seconds) + ", position " + (x.ready.position + 1) + " of " + x.ready.namespace_ready : "");
  } else {
    setText("job-due", "–");
    setText("job-due-at", x.state === "leased" ? "syncing now" : "not scheduled");
  }
  const b = x.backoff;
  setText("job-failures", String(b.failures));
  setText("job-next-delay", b.failures > 0 ? "next error waits " + dur(b.next_delay_seconds) : "no request backoff");
  setText("job-pod-failures", b.pod_failures === null ? "0" : String(b.pod_failures));
  setText("job-pod-backoff", b.pod_backoff_remaining_seconds > 0 ? "pods held back " + dur(b.pod_backoff_remaining_seconds) : "no pod backoff");
  if (x.expectations) {
    const e = x.expectations;
    setText("job-expect", e.satisfied ? "satisfied" : `${Math.max(0, e.add)} creates / ${Math.max(0, e.del)} deletes`);
    setText("job-expect-age", "set " + dur(e.age_seconds) + " ago");
  } else {
    setText("job-expect", "none");
    setText("job-expect-age", "");
  }
  if (x.lease) {
    setText("job-lease", x.lease.holder);
    setText("job-lease-sub", "held " + dur(x.lease.age_seconds) + ", ends in " + dur(x.lease.ends_in_seconds) + (x.lease.dirty ? " · added again" : ""));
  } else {
    setText("job-lease", "not leased");
    setText("job-lease-sub", x.lease_expiries ? x.lease_expiries + " lease(s) expired in a row" : "");
  }
  if (x.last_sync) {
    const l = x.last_sync;
    setText("job-last", OUTCOMES[l.outcome] || l.outcome);
    setText("job-last-sub", dur(l.ago_seconds) + " ago by " + l.worker + (l.error ? ": " + l.error : ""));
  } else {
    setText("job-last", "none on record");
    setText("job-last-sub", "");
  }
  const rows = x.history.slice().reverse().map(historyRow);
  replaceRows($("history").tBodies[0], rows);
  $("history-empty").hidden = rows.length > 0;
}

function renderMissing(key, err) {
  $("job-body").hidden = true;
  const m = $("job-missing");
  m.hidden = false;
  const b = $("job-state");
  b.className = "badge absent";
  if (err.status === 404) {
    b.textContent = "unknown";
    m.replaceChildren(
      el("strong", {}, "Job " + key + " is not known to the queue. "),
      "It was never queued, or it finished and was forgotten long ago. Check the namespace and the name; ",
      el("a", { href: "#/search" }, "search again"), ".");
  } else if (err.status === 400) {
    b.textContent = "invalid";
    m.replaceChildren(el("strong", {}, "Not a valid Job name. "), err.message);
  } else {
    throw err;
  }
}

// ---- routing and polling ------------------------------------------------------------------

function route() {
  const h = location.hash.replace(/^#/, "") || "/";
  const job = /^\/jobs\/([^/]+)\/([^/]+)$/.exec(h);
  if (job) {
    let ns, name;
    try {
      ns = decodeURIComponent(job[1]);
      name = decodeURIComponent(job[2]);
    } catch (_) {
      return { kind: "search" };
    }
    return { kind: "job", ns, name };
  }
  if (h === "/search") return { kind: "search" };
  return { kind: "overview" };
}

const pages = {
  overview: {
    async load() {
      renderOverview(await getJson("../api/v1/overview"));
    },
  },
  job: {
    async load(r) {
      const key = r.ns + "/" + r.name;
      try {
        renderJob(await getJson("../api/v1/jobs/" + encodeURIComponent(r.ns) + "/" + encodeURIComponent(r.name)));
      } catch (e) {
        if (!(e instanceof HttpError)) throw e;
        renderMissing(key, e);
      }
    },
  },
  search: {
    async load() {
      const v = await getJson("../api/v1/namespaces");
      const names = v.namespaces.map((n) => n.namespace);
      const box = $("search-namespaces");
      // Each fills the namespace field.
      const chip = (n) => {
        const b = el("button", { type: "button", className: "chip", title: "search in " + n }, n);
        b.addEventListener("click", () => {
          $("search-namespace").value = n;
          $("search-name").focus();
        });
        return b;
      };
      box.replaceChildren(...(names.length ? [el("span", { className: "muted" }, "Namespaces with work:")] : []),
        ...names.slice(0, 40).map(chip));
    },
  },
};

let generation = 0;
let timer = null;

async function refresh(gen, r) {
  try {
    await pages[r.kind].load(r);
    if (gen !== generation) return;
    status(true, "updated " + clock(Date.now()));
    rendered(r.kind);
  } catch (e) {
    if (gen !== generation) return;
    status(false, e instanceof HttpError ? e.message : "kjob-queue unreachable");
    if (r.kind === "search") rendered(r.kind);
  }
  if (gen === generation) timer = setTimeout(() => refresh(gen, r), POLL_MS);
}

function show() {
  const r = route();
  generation += 1;
  clearTimeout(timer);
  for (const k of Object.keys(pages)) $("page-" + k).hidden = k !== r.kind;
  $("nav-overview").classList.toggle("active", r.kind === "overview");
  $("nav-search").classList.toggle("active", r.kind === "search");
  if (r.kind === "job") {
    setText("job-ns", r.ns);
    setText("job-key", r.name);
    document.title = r.ns + "/" + r.name + " · kjob queue";
  } else {
    document.title = (r.kind === "search" ? "Find a Job" : "Overview") + " · kjob queue";
  }
  refresh(generation, r);
}

function goToJob(form, errorId) {
  const ns = form.elements.namespace.value.trim();
  const name = form.elements.name.value.trim();
  if (!ns || !name) {
    if (errorId) {
      $(errorId).hidden = false;
      $(errorId).textContent = "Enter both the namespace and the name.";
    }
    return;
  }
  location.hash = "#/jobs/" + encodeURIComponent(ns) + "/" + encodeURIComponent(name);
}

document.addEventListener("DOMContentLoaded", () => {
  $("quick-search").addEventListener("submit", (e) => {
    e.preventDefault();
    goToJob(e.target, null);
  });
  $("search").addEventListener("submit", (e) => {
    e.preventDefault();
    goToJob(e.target, "search-error");
  });
  window.addEventListener("hashchange", show);
  window.addEventListener("resize", () => {
    if (route().kind === "overview") show();
  });
  show();
});
