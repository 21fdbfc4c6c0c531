// The outbox console: polls /ui/api/overview, draws the charts as inline SVG, browses dead
// letters and asks `why`. Every value from the server goes in through textContent, never as
// HTML: payloads, headers and errors are untrusted text.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const actions = document.body.dataset.actions === "on";
  const every = Math.min(Math.max(Number(document.body.dataset.refreshMs) || 5000, 500), 5000);
  const HOUR = 3600e3;
  let samples = [];
  let lastT = 0;
  let started = null;
  let lastDead = null;
  let shown = null;
  let following = null; // the id the why box keeps telling, until it is delivered

  const num = (n) => (n == null ? "\u2013" : Number(n).toLocaleString("en"));
  const secs = (s) =>
    s == null ? "\u2013"
      : s < 1 ? (s * 1000).toFixed(s < 0.01 ? 1 : 0) + " ms"
      : s < 120 ? s.toFixed(1) + " s"
      : s < 7200 ? (s / 60).toFixed(1) + " min"
      : (s / 3600).toFixed(1) + " h";
  const rate = (r) => (r == null ? "\u2013" : r < 10 ? r.toFixed(2) : r.toFixed(0));
  const when = (t) => (t ? String(t).replace("T", " ").replace(/\.\d+/, "") : "\u2013");

  async function api(path, options) {
    const response = await fetch(path, Object.assign({ credentials: "same-origin", headers: { accept: "application/json" } }, options));
    let data = null;
    try { data = await response.json(); } catch (_) { /* not JSON */ }
    if (!response.ok) {
      const error = new Error((data && data.error) || response.status + " " + response.statusText);
      error.data = data;
      error.status = response.status;
      throw error;
    }
    return data;
  }

  function cell(row, value, className) {
    const td = row.insertCell();
    td.textContent = value == null ? "\u2013" : String(value);
    if (className) td.className = className;
    return td;
  }

  function button(label, className, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    if (className) b.className = className;
    b.addEventListener("click", onClick);
    return b;
  }

  const SVG = "http://www.w3.org/2000/svg";
  function draw(key, format) {
    const svg = $("c-" + key);
    svg.replaceChildren();
    const points = samples.filter((s) => s[key] != null);
    if (points.length < 2) {
      $("c-" + key + "-max").textContent = points.length ? format(points[0][key]) : "";
      return;
    }
    const t0 = points[0].t;
    const span = Math.max(points[points.length - 1].t - t0, 1);
    const top = Math.max(...points.map((s) => s[key]));
    const scale = top > 0 ? top * 1.1 : 1;
    const xy = points.map((s) => [((s.t - t0) / span) * 300, 79 - (s[key] / scale) * 76]);
    const line = xy.map(([x, y]) => x.toFixed(1) + "," + y.toFixed(1)).join(" ");
    const area = document.createElementNS(SVG, "polygon");
    area.setAttribute("class", "area");
    area.setAttribute("points", "0,80 " + line + " 300,80");
    const path = document.createElementNS(SVG, "polyline");
    path.setAttribute("class", "line");
    path.setAttribute("points", line);
    path.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(area, path);
    $("c-" + key + "-max").textContent = "now " + format(points[points.length - 1][key]) + " \u00b7 max " + format(top);
  }

  function renderSinks(sinks, subscriptions) {
    const body = $("sinks").tBodies[0];
    body.replaceChildren();
    for (const s of sinks) {
      const row = body.insertRow();
      cell(row, s.name);
      cell(row, s.kind);
      const down = s.healthy === false || s.up === false;
      const state = s.healthy == null && s.up == null ? "unknown" : down ? "down" : "up";
      cell(row, state, down ? "bad" : state === "up" ? "ok" : "");
      cell(row, when(s.checked_at));
      cell(row, s.error || "", "reason");
    }
    const subs = $("subscriptions");
    subs.hidden = !subscriptions || subscriptions.length === 0;
    if (!subs.hidden) {
      const tbody = subs.querySelector("tbody");
      tbody.replaceChildren();
      for (const s of subscriptions) {
        const row = tbody.insertRow();
        cell(row, s.name);
        cell(row, s.sink);
        cell(row, s.state);
        cell(row, s.detail || "");
      }
    }
  }

  // `[canary]`: one tile, the worst of its destinations. Lost or out of order is red until
  // the relay restarts (the counters only grow); a destination that cannot be read back says so.
  function renderCanary(c) {
    const tile = $("canary");
    tile.hidden = !c;
    if (!c) return;
    const ds = c.destinations || [];
    const lost = ds.reduce((a, d) => a + d.lost, 0);
    const disorder = ds.reduce((a, d) => a + d.out_of_order, 0);
    const readable = ds.filter((d) => d.readable);
    const latencies = readable.map((d) => d.last_latency_seconds).filter((v) => v != null);
    const state = $("canary-state");
    let detail;
    if (lost || disorder) {
      state.textContent = (lost ? lost + " lost" : "") + (lost && disorder ? ", " : "") + (disorder ? disorder + " out of order" : "");
      state.className = "bad";
      detail = "canary: probes lost or out of order since start";
    } else if (latencies.length) {
      state.textContent = secs(Math.max(...latencies));
      state.className = "ok";
      detail = "canary: last probe commit\u2192visible";
    } else {
      state.textContent = c.written ? "waiting" : "\u2013";
      state.className = "";
      detail = ds.length && readable.length === 0 && ds.every((d) => d.readable === false)
        ? "canary: the destination cannot be read back (consumer-side canary)"
        : "canary: waiting for the first probe";
    }
    const inFlight = ds.reduce((a, d) => a + d.in_flight, 0);
    $("canary-detail").textContent = detail + " \u00b7 " + num(c.written) + " written, " + num(inFlight) + " in flight";
    tile.title = ds.map((d) => (d.subscription || "sink") + " (" + d.kind + "): " + d.arrived + " arrived, " + d.lost + " lost, " + d.out_of_order + " out of order" + (d.problem ? "; " + d.problem : "")).join("\n");
  }

  async function poll() {
    try {
      const o = await api("/ui/api/overview?after=" + lastT);
      if (started !== o.started) {
        started = o.started;
        samples = [];
      }
      samples = samples.concat(o.samples).filter((s) => s.t > o.now - HOUR);
      if (samples.length) lastT = samples[samples.length - 1].t;
      const latest = o.latest || {};
      $("pending").textContent = num(latest.pending);
      $("retrying").textContent = num(latest.retrying);
      $("dead").textContent = num(latest.dead);
      $("oldest").textContent = secs(latest.oldest_age);
      $("published").textContent = num(o.published);
      $("rate").textContent = rate(o.window.rate);
      $("p99").textContent = secs(o.window.p99);
      draw("pending", num);
      draw("oldest_age", secs);
      draw("rate", rate);
      draw("p99", secs);
      $("span").dataset.seconds = String(o.window.seconds);
      $("span").textContent = samples.length
        ? "charts: the last " + secs(o.window.seconds) + " (one sample per " + secs(o.refresh_ms / 1000) + "; at most an hour)"
        : "charts: waiting for the first sample";
      const ready = o.ready.database && o.ready.sink;
      $("ready").textContent = ready ? "ready" : !o.ready.database ? "database unreachable" : "broker unreachable";
      $("ready").className = "badge " + (ready ? "ok" : "bad");
      if (o.source) $("source").textContent = o.source.label + " " + o.source.table;
      if (o.config) {
        $("generation").textContent = "config " + o.config.generation;
        $("reload").hidden = !(actions && o.config.reloadable);
      }
      renderSinks(o.sinks, o.subscriptions);
      renderCanary(o.canary);
      $("updated").textContent = "updated " + new Date(o.now).toLocaleTimeString();
      document.body.classList.remove("stale");
      if (latest.dead !== undefined && latest.dead !== lastDead) {
        lastDead = latest.dead;
        loadDead();
      }
      if (following) tell(following);
    } catch (e) {
      $("updated").textContent = "cannot reach the relay: " + e.message;
      document.body.classList.add("stale");
    }
    setTimeout(poll, every);
  }

  function say(text, bad) {
    $("message").textContent = text;
    $("message").className = bad ? "bad" : "";
  }

  async function loadDead() {
    const form = $("dead-filter");
    const query = new URLSearchParams({ type: form.type.value.trim(), aggregate: form.aggregate.value.trim(), limit: "200" });
    try {
      const data = await api("/ui/api/dead?" + query);
      const body = $("dead-list").tBodies[0];
      body.replaceChildren();
      for (const d of data.dead_letters) {
        const row = body.insertRow();
        row.dataset.id = d.id;
        row.insertCell().append(button(d.id, "link id", () => show(d.id)));
        cell(row, d.aggregate_type + "/" + d.aggregate_id);
        cell(row, d.event_type);
        cell(row, d.attempts);
        cell(row, when(d.dead_lettered_at));
        cell(row, d.reason, "reason");
        const last = row.insertCell();
        if (actions) last.append(button("retry", "retry", () => retry(d.id)));
      }
      $("dead-empty").hidden = data.dead_letters.length > 0;
    } catch (e) {
      say("dead letters: " + e.message, true);
    }
  }

  async function show(id) {
    try {
      const data = await api("/ui/api/events/" + encodeURIComponent(id));
      shown = id;
      $("detail-text").textContent = data.lines.join("\n");
      $("detail-retry").hidden = !(actions && data.event.state === "dead");
      $("detail").hidden = false;
    } catch (e) {
      say(e.message, true);
    }
  }

  async function retry(id) {
    try {
      const data = await api("/ui/api/dead/retry", {
        method: "POST",
        headers: { accept: "application/json", "content-type": "application/json", "x-outbox-csrf": csrf },
        body: JSON.stringify({ ids: [id] }),
      });
      say(data.retried.length + " dead letter(s) put back in line" + (data.not_dead.length ? "; not dead: " + data.not_dead.join(", ") : ""));
      if (shown === id) show(id);
      loadDead();
    } catch (e) {
      say("retry refused: " + e.message, true);
    }
  }

  async function purge(event) {
    event.preventDefault();
    const form = $("purge");
    const olderThan = form.older_than.value.trim();
    const type = form.type.value.trim();
    if (!window.confirm("Delete dead letters dead-lettered more than " + olderThan + " ago" + (type ? " of type " + type : "") + "?")) return;
    try {
      const data = await api("/ui/api/dead/purge", {
        method: "POST",
        headers: { accept: "application/json", "content-type": "application/json", "x-outbox-csrf": csrf },
        body: JSON.stringify({ older_than: olderThan, event_type: type || null }),
      });
      say(data.purged + " dead letter(s) deleted");
      loadDead();
    } catch (e) {
      say("purge refused: " + e.message, true);
    }
  }

  // Reads the relay's configuration file again (as SIGHUP does): the answer lists the changed
  // keys (secrets as ***), or says why the file was refused (the old one keeps running).
  async function reload() {
    try {
      const data = await api("/ui/api/reload", {
        method: "POST",
        headers: { accept: "application/json", "content-type": "application/json", "x-outbox-csrf": csrf },
        body: "{}",
      });
      const changed = data.changes.map((c) => c.key).join(", ");
      say("configuration generation " + data.generation + (changed ? ": " + changed : ": nothing changed"));
      poll();
    } catch (e) {
      say("reload refused: " + e.message, true);
    }
  }

  function why(event) {
    if (event) event.preventDefault();
    const id = $("why-id").value.trim();
    if (id) tell(id);
  }

  // Tells event `id`'s story in the why box, and keeps telling it at every refresh until it
  // is delivered (a retried dead letter, an event waiting on backoff) or another is asked.
  async function tell(id) {
    const out = $("why-text");
    following = id;
    try {
      const data = await api("/ui/api/why/" + encodeURIComponent(id));
      if (following !== id) return;
      out.textContent = data.lines.join("\n");
      out.className = "";
      if (data.story.verdict && data.story.verdict.verdict === "delivered") following = null;
    } catch (e) {
      if (following !== id) return;
      const notes = (e.data && e.data.notes) || [];
      out.textContent = notes.concat(["error: " + e.message]).join("\n");
      out.className = "bad";
      following = null;
    }
    out.dataset.answers = String(Number(out.dataset.answers || 0) + 1);
  }

  $("dead-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    loadDead();
  });
  $("detail-retry").addEventListener("click", () => shown && retry(shown));
  $("detail-why").addEventListener("click", () => {
    $("why-id").value = shown || "";
    why();
  });
  $("why-form").addEventListener("submit", why);
  $("purge").hidden = !actions;
  $("purge").addEventListener("submit", purge);
  $("reload").addEventListener("click", reload);
  poll();
})();
