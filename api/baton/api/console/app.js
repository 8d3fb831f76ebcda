// The Baton console: plain modern JavaScript over the HTTP API (no build step).
//
// Pages (hash routes): #/sessions (submit, and the sessions list with live status),
// #/session/ID (the handoff timeline, tool runs, approvals, conversation, documents; live
// over Server-Sent Events), #/dead-letters and #/workers. Every text that comes from the
// system is set as text, never as HTML. An archived session (read from the archive by the
// API, `archived` in its JSON) carries an "archived" badge, in the list and on its page,
// whose stream ends: nothing in it changes until a new submission restores it.

const main = document.getElementById("main");
// The token lives in this tab's sessionStorage, never in localStorage: it is gone with the
// tab, other tabs of the origin (the API docs at /docs among them, opened with noopener) do
// not share it, and unlike a cookie it is never sent by itself, so a page elsewhere cannot
// make the browser use it. `baton dev` prints the console's address with the token in the
// fragment (#token=...), which never reaches a server: it is taken from there once.
const TOKEN_KEY = "baton.token";
localStorage.removeItem(TOKEN_KEY); // where consoles before this one kept it
if (location.hash.startsWith("#token=")) {
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(location.hash.slice(7)));
  history.replaceState(null, "", `${location.pathname}${location.search}#/sessions`);
}
const state = { token: sessionStorage.getItem(TOKEN_KEY) || "", role: "", stop: null };

// ------------------------------------------------------------------ helpers

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs = {}, text = null) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== null) el.textContent = text;
  return el;
}

function badge(text, cls = "", attrs = {}) { return h("span", { class: `badge ${cls}`, ...attrs }, text); }
function when(v) { return v === null || v === undefined ? "-" : new Date(v).toISOString(); }
function archivedBadge(row) {
  return row.archived ? badge("archived", "st-archived archived", { title: `archived at ${when(row.archived_ms)}` }) : null;
}
function ms(v) {
  if (v === null || v === undefined) return "-";
  return Math.abs(v) >= 10000 ? `${(v / 1000).toFixed(1)} s` : `${Math.round(v)} ms`;
}
function clip(text, n = 160) {
  const t = String(text ?? "").replace(/\s+/g, " ").trim();
  return t.length > n ? t.slice(0, n - 1) + "…" : t;
}
function toast(text, error = false) {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.className = `show${error ? " error" : ""}`;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { el.className = ""; }, error ? 6000 : 2500);
}

class ApiError extends Error {
  constructor(problem) { super(problem.detail || problem.title || "request failed"); this.problem = problem; }
}

function headers(extra = {}) {
  const out = { Accept: "application/json", ...extra };
  if (state.token) out.Authorization = `Bearer ${state.token}`;
  return out;
}

async function api(path, { method = "GET", body, key } = {}) {
  // Every change is sent as JSON: the API refuses any other body for one (a form post
  // from another site, which needs no CORS preflight).
  const extra = method !== "GET" ? { "Content-Type": "application/json" } : {};
  if (method !== "GET" && body === undefined) body = {};
  if (key) extra["Idempotency-Key"] = key;
  const res = await fetch(path, { method, headers: headers(extra),
    body: body !== undefined ? JSON.stringify(body) : undefined });
  const data = await res.json().catch(() => ({ title: res.statusText, status: res.status }));
  if (!res.ok) throw new ApiError(data);
  return data;
}

function ask(title, body) {
  const dlg = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-body").textContent = body;
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => resolve(dlg.returnValue === "yes"), { once: true });
    dlg.returnValue = "";
    dlg.showModal();
  });
}

async function act(title, body, fn, done) {
  if (!(await ask(title, body))) return;
  try {
    await fn();
    toast(done);
  } catch (e) {
    toast(e.message, true);
  }
}

// ------------------------------------------------------------------ Server-Sent Events

// EventSource cannot send an Authorization header, so the stream is read with fetch; on a
// dropped connection it resumes with Last-Event-ID after the last whole change it saw. A
// 204 (an archived session, seen whole) ends it, as it ends an EventSource.
function follow(path, onEvent, onStatus) {
  let lastId = null;
  let stopped = false;
  let controller = null;
  async function once() {
    controller = new AbortController();
    const extra = { Accept: "text/event-stream" };
    if (lastId) extra["Last-Event-ID"] = lastId;
    const res = await fetch(path, { headers: headers(extra), signal: controller.signal });
    if (!res.ok) throw new ApiError(await res.json().catch(() => ({ status: res.status })));
    if (res.status === 204) { stopped = true; return; }
    onStatus(true);
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value;
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        let event = "message", data = "", id = null;
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) event = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
          else if (line.startsWith("id: ")) id = line.slice(4);
        }
        if (data) onEvent(event, JSON.parse(data));
        if (id) lastId = id;
      }
    }
  }
  (async () => {
    while (!stopped) {
      try { await once(); } catch (e) { if (stopped) return; }
      if (stopped) return;
      onStatus(false);
      if (!stopped) await new Promise((r) => setTimeout(r, 1000));
    }
  })();
  return () => { stopped = true; if (controller) controller.abort(); };
}

// ------------------------------------------------------------------ sessions

async function sessionsPage() {
  const filters = { status: "", agent: "", blocked: "", quarantined: "" };
  const table = h("tbody");
  const count = h("span", { class: "muted" });
  const text = h("textarea", { id: "submit-text", placeholder: "What should the agent do?" },
    "Send the approved notice to ada@example.com, grace@example.com, linus@example.com, " +
    "margaret@example.com and barbara@example.com, then summarise.");
  const agent = h("input", { id: "submit-agent", value: "notices", size: 12, "aria-label": "agent" });
  const compat = h("input", { id: "submit-compat", value: "1", size: 3, "aria-label": "compat level" });
  const submit = h("button", { id: "submit-button", class: "primary", type: "submit" }, "Submit");
  const form = h("form", { class: "submit", onsubmit: async (e) => {
    e.preventDefault();
    submit.disabled = true;
    try {
      const key = crypto.randomUUID();
      const out = await api("/v1/submissions", { method: "POST", key,
        body: { text: text.value, agent: agent.value, compat: Number(compat.value) || 1 } });
      location.hash = `#/session/${encodeURIComponent(out.submission.session_id)}`;
    } catch (err) { toast(err.message, true); } finally { submit.disabled = false; }
  } }, text, h("label", {}, "agent ", agent), h("label", {}, "compat ", compat), submit);

  const select = (name, options) => h("select", { "aria-label": name, onchange: (e) => {
    filters[name] = e.target.value; refresh(); } },
    options.map(([v, label]) => h("option", { value: v }, label)));
  const agentFilter = h("input", { placeholder: "agent", size: 10, onchange: (e) => {
    filters.agent = e.target.value.trim(); refresh(); } });
  main.replaceChildren(
    h("h1", {}, "Sessions"),
    h("div", { class: "card" }, h("h2", {}, "Submit"), form),
    h("div", { class: "card" },
      h("div", { class: "filters" },
        select("status", [["", "any status"], ["leased", "leased"], ["pending", "pending"],
          ["blocked", "blocked"], ["failed", "failed"], ["settled", "settled"],
          ["archived", "archived"], ["completed", "archived, completed"],
          ["cancelled", "archived, cancelled"]]),
        agentFilter,
        select("blocked", [["", "blocked or not"], ["true", "blocked"], ["false", "not blocked"]]),
        select("quarantined", [["", "quarantined or not"], ["true", "quarantined"], ["false", "not quarantined"]]),
        count),
      h("table", { id: "sessions" }, h("thead", {}, h("tr", {},
        ["session", "state", "agent", "submissions", "fence", "holder", "blocked"].map((c) => h("th", {}, c)))),
        table)));

  async function refresh() {
    const q = new URLSearchParams(Object.entries(filters).filter(([, v]) => v !== ""));
    try {
      const data = await api(`/v1/sessions?${q}`);
      count.textContent = data.index_range
        ? `${data.matched} shown (older archived ones from the archive's index)`
        : `${data.matched} shown of ${data.total + data.archived_total}` +
          (data.archived_total ? ` (${data.archived_total} archived)` : "");
      table.replaceChildren(...data.sessions.map((row) => h("tr", {
        class: "row-link", "data-session": row.session_id, "data-archived": row.archived ? "true" : null,
        onclick: () => { location.hash = `#/session/${encodeURIComponent(row.session_id)}`; } },
        h("td", { class: "mono" }, row.session_id),
        h("td", {}, row.archived ? archivedBadge(row) : badge(row.state, `st-${row.state}`),
          row.quarantined ? badge("quarantined", "st-quarantined") : null),
        h("td", {}, `${row.agent}@${row.compat ?? "?"}`),
        h("td", {}, row.archived
          ? [row.status ? badge(`newest ${row.status}`, `st-${row.status}`) : null,
            row.submission_count !== null && row.submission_count !== undefined ? `${row.submission_count} in all` : null]
          : Object.entries(row.submissions).map(([k, n]) => badge(`${n} ${k}`, `st-${k}`))),
        h("td", {}, row.fence ?? "-"),
        h("td", { class: "mono" }, row.holder || "-"),
        h("td", {}, row.blocked || ""))));
    } catch (e) { count.textContent = e.message; }
  }
  await refresh();
  const timer = setInterval(refresh, 2000);
  return () => clearInterval(timer);
}

// ------------------------------------------------------------------ one session

const COLORS = { submit: "#6b7280", start: "#6b7280", lease: "#2563eb", takeover: "#dc2626",
  commit: "#1d4ed8", claim: "#059669", reclaim: "#dc2626", complete: "#047857",
  refused: "#b91c1c", cancel: "#d97706", approval: "#059669", partial: "#7c3aed",
  slot_wait: "#ca8a04" };
const ROLE_BG = { brain: "#eef2ff", hands: "#ecfdf5", client: "#f3f4f6", relay: "#fff7ed" };
const FLAG_ROOM = 44; // px between events for a flag's whole word (the widest step)
const ARROWS = { wake: "#2563eb", dispatch: "#059669", takeover: "#dc2626" };

function color(e) {
  if (e.flags.includes("takeover") || e.flags.includes("refused")) return "#dc2626";
  const base = e.kind.split(":")[0];
  return COLORS[base] || "#374151";
}

function drawTimeline(trace) {
  const LEFT = 190, TOP = 50, LANE = 52, n = trace.events.length;
  const step = Math.max(18, Math.min(44, (1100 - LEFT) / Math.max(n, 1)));
  const width = Math.max(LEFT + (n + 1) * step + 40, 1160);
  const height = TOP + trace.lanes.length * LANE + 16;
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "timeline-svg",
    role: "img", "aria-label": "handoff timeline" });
  const laneY = {};
  trace.lanes.forEach((lane, i) => {
    const y = TOP + i * LANE;
    laneY[lane.id] = y + LANE / 2;
    svg.append(s("rect", { x: 0, y, width, height: LANE - 4, fill: ROLE_BG[lane.role] || "#f9fafb" }));
    const label = s("text", { x: 8, y: y + LANE / 2 + 4, "font-size": 12, fill: "#111827",
      "data-lane": lane.label }, clip(lane.label, 28));
    label.append(s("title", {}, `${lane.role} ${lane.label}: ${lane.events || lane.published} ${lane.role === "relay" ? "publishes" : "events"}`));
    svg.append(label);
  });
  const x = (i) => LEFT + (i + 0.5) * step;
  const pos = {};
  trace.events.forEach((e) => { pos[e.index] = [x(e.index), laneY[e.lane]]; });
  for (const hd of trace.handoffs) {
    const a = pos[hd.src], b = pos[hd.dst];
    if (!a || !b) continue;
    const line = s("line", { x1: a[0], y1: a[1], x2: b[0], y2: b[1], stroke: ARROWS[hd.kind] || "#9ca3af",
      "stroke-width": hd.kind === "takeover" ? 2.5 : 1.2, "stroke-dasharray": hd.kind === "takeover" ? "5 3" : "",
      opacity: 0.75, class: `handoff handoff-${hd.kind}` });
    line.append(s("title", {}, `${hd.kind}: ${hd.text} (${ms(hd.ms)})`));
    svg.append(line);
  }
  for (const p of trace.publishes || []) {
    const y = laneY[p.lane];
    if (y === undefined) continue;
    const at = p.source !== null && p.source !== undefined ? p.source + 0.75
      : (p.deliveries.length ? p.deliveries[0] - 0.25 : null);
    if (at === null) continue;
    const px = LEFT + (at + 0.5) * step;
    const dot = s("rect", { x: px - 4, y: y - 4, width: 8, height: 8, fill: "#ea580c", class: "publish" });
    dot.append(s("title", {}, `${p.relay} published row ${p.row_id} (stream seq ${p.stream_seq}); delivered to ${p.deliveries.length} consumer(s)`));
    svg.append(dot);
    for (const d of p.deliveries) {
      const b = pos[d];
      if (b) svg.append(s("line", { x1: px, y1: y, x2: b[0], y2: b[1], stroke: "#ea580c",
        "stroke-width": 1, opacity: 0.5, class: "relay-hop" }));
    }
  }
  for (const e of trace.events) {
    const [cx, cy] = pos[e.index];
    if (cy === undefined) continue;
    const g = s("g", { class: `event kind-${e.kind.split(":")[0]} ${e.flags.map((f) => `flag-${f}`).join(" ")}` });
    g.append(s("circle", { cx, cy, r: e.flags.length ? 7 : 5, fill: color(e),
      stroke: e.flags.includes("confirm") ? "#7c3aed" : "#fff", "stroke-width": e.flags.includes("confirm") ? 3 : 1.5 }));
    if (e.flags.includes("refused")) g.append(s("text", { x: cx - 4, y: cy + 4, fill: "#fff", "font-size": 11 }, "×"));
    for (const [k, f] of e.flags.entries()) {
      // Where events stand closer than a word's width, a flag is its initial (the event's
      // title says it in full): whole words ran into their neighbours' ("takeovertakeover").
      g.append(s("text", { x: cx + 8, y: cy - 9 - k * 11, "font-size": 10,
        fill: f === "confirm" ? "#5b21b6" : f === "approval" ? "#047857" : f === "slot" ? "#854d0e" : "#b91c1c" },
        step >= FLAG_ROOM ? f : f[0].toUpperCase()));
    }
    g.append(s("title", {}, `#${e.index} ${e.kind} ${e.fence} +${ms(e.t_ms)}\n${e.text}`));
    svg.append(g);
  }
  svg.append(s("text", { x: LEFT, y: 18, "font-size": 11, fill: "#6b7280" },
    `${n} receipts over ${ms(trace.duration_ms)}; ` +
    `relays: ${Object.entries(trace.relays).map(([r, k]) => `${r} carried ${k}`).join(", ") || "none yet"}`));
  return svg;
}

function marks(m) {
  return h("span", { class: "marks" }, ["accepted", "completed", "applied"].map((k) =>
    h("span", { class: m[k] ? "mark-on" : "mark-off", title: `${k}${m[k] ? " at " + new Date(m[k]).toISOString() : ""}` },
      m[k] ? "✓" : "·")));
}

async function sessionPage(id) {
  const sid = decodeURIComponent(id);
  const live = h("span", { class: "live", id: "live" }, "live");
  const header = h("div");
  const timeline = h("div", { class: "timeline", id: "timeline" });
  const notable = h("ul", { id: "notable" });
  const eventLog = h("tbody");
  const approvals = h("div", { id: "approvals" });
  const runs = h("tbody", { id: "runs" });
  const tasks = h("tbody");
  const subs = h("tbody");
  const entries = h("div", { class: "entries", id: "entries" });
  const docs = h("div", { id: "documents" });
  const cancel = h("button", { id: "cancel-session", class: "danger", disabled: state.role !== "operate",
    onclick: () => act("Cancel this session?",
      `Every root task of ${sid} is cancelled: running tool runs are stopped and the submissions settle "cancelled".`,
      () => api(`/v1/sessions/${encodeURIComponent(sid)}/cancel`, { method: "POST", body: { reason: "cancelled from the console" } }),
      "cancel committed; a Brain carries it out") }, "Cancel session");

  const archivedMark = h("span", { id: "archived" });
  main.replaceChildren(
    h("h1", {}, "Session ", h("span", { class: "mono" }, sid), " ", archivedMark, " ", live),
    h("div", { class: "card" }, header, h("div", { class: "actions" }, cancel)),
    h("div", { class: "card" }, h("h2", {}, "Handoff timeline"), timeline,
      h("h2", {}, "Takeovers, refusals, confirmations"), notable),
    h("div", { class: "card", id: "approval-card" }, h("h2", {}, "Awaiting approval"), approvals),
    h("div", { class: "card" }, h("h2", {}, "Tool runs"), h("table", {},
      h("thead", {}, h("tr", {}, ["run", "tool", "status", "acc / cmp / app", "attempt", "worker", "outcome"].map((c) => h("th", {}, c)))), runs)),
    h("div", { class: "grid" },
      h("div", { class: "card" }, h("h2", {}, "Conversation"), entries),
      h("div", { class: "card" },
        h("h2", {}, "Submissions"), h("table", {}, subs),
        h("h2", {}, "Tasks"), h("table", {}, tasks),
        h("h2", {}, "Documents"), docs)),
    h("div", { class: "card" }, h("h2", {}, "Live changes"), h("div", { class: "events" },
      h("table", {}, eventLog))));

  async function refresh() {
    const base = `/v1/sessions/${encodeURIComponent(sid)}`;
    const [view, trace, conv] = await Promise.all([api(base), api(`${base}/trace`),
      api(`${base}/entries?start=-200&limit=200`)]);
    const lease = view.lease;
    archivedMark.replaceChildren(archivedBadge(view) || "");
    if (view.archived) archived();
    header.replaceChildren(h("dl", { class: "kv" },
      h("dt", {}, "agent"), h("dd", {}, `${view.agent} (compat ${view.compat})`),
      view.archived ? [h("dt", {}, "archived"), h("dd", {}, badge("archived", "st-archived"),
        `at ${when(view.archived_ms)}: read from the archive; a new submission restores it`)] : [],
      h("dt", {}, "lease"), h("dd", {}, lease.live ? `${lease.holder}, fence ${lease.fence}, ${ms(lease.remaining_ms)} left` : `free (fence ${lease.fence})`),
      h("dt", {}, "commits"), h("dd", {}, `seq ${view.seq}, ${view.receipts} receipts, ${view.entries} entries`),
      view.blocked.level ? [h("dt", {}, "blocked"), h("dd", {}, badge(view.blocked.level, "st-blocked"))] : [],
      view.quarantine ? [h("dt", {}, "quarantined"), h("dd", {}, badge(view.quarantine.quarantine_reason || "yes", "st-quarantined"))] : []));
    timeline.replaceChildren(drawTimeline(trace));
    timeline.scrollLeft = timeline.scrollWidth;
    const flagged = trace.events.filter((e) => e.flags.some((f) => ["takeover", "refused", "confirm", "recovery", "redelivery", "approval", "cancel", "slot"].includes(f)));
    notable.replaceChildren(...(flagged.length ? flagged.map((e) => h("li", { class: "notable" },
      e.flags.map((f) => badge(f, `flag-${f}`)), ` #${e.index} +${ms(e.t_ms)} ${e.text}`))
      : [h("li", { class: "muted" }, "none")]),
      ...Object.entries(trace.relays).map(([r, k]) => h("li", { class: "relay" }, badge("relay", "flag-relay"), ` ${r} carried ${k} message(s)`)));
    const canOperate = state.role === "operate";
    cancel.disabled = !canOperate || view.archived;
    approvals.replaceChildren(...(view.awaiting_approval.length ? view.awaiting_approval.map((a) =>
      h("div", { class: "approval", "data-run": a.run_id },
        h("div", {}, h("div", { class: "mono" }, a.run_id), badge(a.tool), h("div", { class: "muted" }, `waiting ${ms(a.waiting_ms)}`)),
        h("pre", {}, JSON.stringify(a.arguments, null, 2)),
        h("button", { class: "primary approve", disabled: !canOperate, onclick: () => act(`Approve ${a.tool}?`,
          `Run ${a.run_id} is dispatched once with exactly these arguments:\n\n${JSON.stringify(a.arguments, null, 2)}\n\ndigest ${a.digest}`,
          () => api(`/v1/sessions/${encodeURIComponent(sid)}/runs/${encodeURIComponent(a.run_id)}/approve`, { method: "POST", body: { digest: a.digest } }),
          `approved ${a.run_id}`) }, "Approve"),
        h("button", { class: "reject", disabled: !canOperate, onclick: () => act(`Reject ${a.tool}?`,
          `Run ${a.run_id} ends with error "rejected"; the model is told.`,
          () => api(`/v1/sessions/${encodeURIComponent(sid)}/runs/${encodeURIComponent(a.run_id)}/reject`, { method: "POST", body: { reason: "rejected from the console" } }),
          `rejected ${a.run_id}`) }, "Reject")))
      : [h("div", { class: "muted" }, "nothing awaits approval")]));
    runs.replaceChildren(...view.runs.map((r) => h("tr", { "data-run": r.run_id, "data-status": r.status },
      h("td", { class: "mono" }, r.run_id), h("td", {}, r.tool),
      h("td", {}, badge(r.status, `st-${r.status}`),
        r.waiting_for ? h("span", { class: "muted waiting-for" }, ` waiting for ${r.waiting_for}`) : []),
      h("td", {}, marks(r.marks)),
      h("td", {}, `${r.attempt}${r.attempts.length ? ` (${r.attempts.length} ended)` : ""}`),
      h("td", { class: "mono" }, r.worker || "-"),
      h("td", {}, [r.outcome, r.recovery].filter(Boolean).join(": ") || "-"))));
    subs.replaceChildren(...view.submissions.map((x) => h("tr", { "data-submission": x.submission_id },
      h("td", { class: "mono" }, x.submission_id), h("td", {}, badge(x.status, `st-${x.status}`)),
      h("td", {}, clip(x.answer || x.error || "", 300)))));
    tasks.replaceChildren(...view.tasks.map((t) => h("tr", {},
      h("td", { class: "mono" }, t.task_id), h("td", {}, t.kind), h("td", {}, badge(t.state, `st-${t.state}`)),
      h("td", {}, t.blocked || t.reason || t.outcome || ""))));
    entries.replaceChildren(...conv.entries.map((e) => h("div", { class: `entry ${e.kind}${e.is_error ? " error" : ""}` },
      h("div", { class: "muted" }, `${e.index} ${e.kind}${e.tool_name ? " " + e.tool_name : ""}`),
      e.text || "",
      (e.tool_calls || []).map((c) => h("div", { class: "mono" }, `→ ${c.name}(${clip(JSON.stringify(c.arguments), 200)})`)))));
    docs.replaceChildren(...(view.documents.length ? view.documents.map((d) => {
      const pre = h("pre", { class: "mono" }, JSON.stringify(d.value, null, 2));
      const pick = h("select", { "aria-label": `version of ${d.name}`, onchange: async (e) => {
        const doc = await api(`/v1/sessions/${encodeURIComponent(sid)}/documents/${encodeURIComponent(d.name)}?version=${e.target.value}`);
        pre.textContent = JSON.stringify(doc.value, null, 2);
      } }, d.versions.map((v) => h("option", { value: v, selected: v === d.version }, `version ${v}`)));
      return h("div", { class: "document" }, h("strong", {}, d.name), " ", pick, pre);
    }) : [h("div", { class: "muted" }, "no documents")]));
  }

  let pending = null;
  let stop = () => {};
  let ended = false;  // archived: nothing changes until a restore, no stream to follow
  function archived() {
    ended = true;
    stop();
    live.className = "live archived";
    live.textContent = "archived";
  }
  function later() {
    if (pending) return;
    pending = setTimeout(async () => {
      pending = null;
      try { await refresh(); } catch (e) { toast(e.message, true); }
    }, 200);
  }
  try { await refresh(); } catch (e) { toast(e.message, true); }
  if (ended) return () => { clearTimeout(pending); };
  stop = follow(`/v1/sessions/${encodeURIComponent(sid)}/events`, (type, ev) => {
    if (type === "receipt") {
      eventLog.prepend(h("tr", { class: "change" }, h("td", { class: "mono" }, ev.id),
        h("td", {}, `+${ms(ev.t_ms)}`), h("td", { class: "mono" }, ev.worker),
        h("td", {}, ev.flags.map((f) => badge(f, `flag-${f}`)), ev.kind), h("td", {}, clip(ev.text, 200))));
    }
    if (type === "error") toast(ev.detail, true);
    if (type !== "snapshot") later();  // an "archived" event too: the page shows it archived
  }, (on) => {
    if (ended) return;
    live.className = on ? "live on" : "live"; live.textContent = on ? "live" : "reconnecting";
  });
  return () => { stop(); clearTimeout(pending); };
}

// ------------------------------------------------------------------ dead letters, workers

async function deadLettersPage() {
  const body = h("tbody");
  const count = h("p", { class: "muted" });
  main.replaceChildren(h("h1", {}, "Dead letters"), h("div", { class: "card" }, count,
    h("table", { id: "dead-letters" }, h("thead", {}, h("tr", {}, ["id", "source", "session", "reason"].map((c) => h("th", {}, c)))), body)));
  async function refresh() {
    const data = await api("/v1/dead-letters?limit=200");
    count.textContent = `${data.count} kept, newest first`;
    body.replaceChildren(...data.items.map((d) => h("tr", {},
      h("td", { class: "mono" }, d.id), h("td", {}, d.source || "-"),
      h("td", { class: "mono" }, d.session_id ? h("a", { href: `#/session/${encodeURIComponent(d.session_id)}` }, d.session_id) : "-"),
      h("td", {}, clip(d.reason, 400)))));
  }
  try { await refresh(); } catch (e) { toast(e.message, true); }
  const timer = setInterval(() => refresh().catch(() => {}), 5000);
  return () => clearInterval(timer);
}

async function workersPage() {
  const body = h("tbody");
  const levels = h("tbody");
  main.replaceChildren(h("h1", {}, "Workers"),
    h("div", { class: "card" }, h("h2", {}, "Compat levels served"), h("table", { id: "levels" },
      h("thead", {}, h("tr", {}, ["agent", "compat level", "live Brains"].map((c) => h("th", {}, c)))), levels)),
    h("div", { class: "card" }, h("h2", {}, "Services"), h("table", { id: "workers" },
      h("thead", {}, h("tr", {}, ["role", "name", "pid", "last seen", "in flight", "state", "serves"].map((c) => h("th", {}, c)))), body)));
  async function refresh() {
    const data = await api("/v1/workers");
    levels.replaceChildren(...data.levels.map((l) => h("tr", {}, h("td", {}, l.agent), h("td", {}, l.compat),
      h("td", { class: "mono" }, l.brains.join(", ")))));
    body.replaceChildren(...data.services.map((w) => h("tr", { "data-worker": w.name },
      h("td", {}, w.role), h("td", { class: "mono" }, w.name), h("td", {}, w.pid ?? ""),
      h("td", {}, `${ms(w.seen_age_ms)} ago`), h("td", {}, w.inflight ?? 0),
      h("td", {}, w.alive ? badge("alive", "st-settled") : badge("silent", "st-failed")),
      h("td", {}, (w.serves || []).map(([a, c]) => `${a}@${c}`).join(", ") || (w.tools || []).join(", ") || "-"))));
  }
  try { await refresh(); } catch (e) { toast(e.message, true); }
  const timer = setInterval(() => refresh().catch(() => {}), 3000);
  return () => clearInterval(timer);
}

// ------------------------------------------------------------------ routing, token

async function whoami() {
  const role = document.getElementById("role");
  try {
    const me = await api("/v1/whoami");
    state.role = me.role;
    role.textContent = `${me.role} (${me.namespace})`;
  } catch (e) {
    state.role = "";
    role.textContent = e.problem && e.problem.status === 401 ? "token needed" : e.message;
  }
}

async function route() {
  if (state.stop) { state.stop(); state.stop = null; }
  const [, page, arg] = (location.hash || "#/sessions").split("/");
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("active", a.dataset.nav === (page === "session" ? "sessions" : page));
  }
  if (page === "session" && arg) state.stop = await sessionPage(arg);
  else if (page === "dead-letters") state.stop = await deadLettersPage();
  else if (page === "workers") state.stop = await workersPage();
  else state.stop = await sessionsPage();
}

document.getElementById("token").value = state.token;
document.getElementById("token-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  state.token = document.getElementById("token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, state.token);
  await whoami();
  await route();
});
window.addEventListener("hashchange", route);
await whoami();
await route();
