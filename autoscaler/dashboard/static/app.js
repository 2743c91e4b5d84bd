/* The dashboard: reads the admin API with the key the operator typed (kept in this tab's
   sessionStorage, never in the page or its URL), draws the tables and the chart, edits one
   queue's autoscale block (preview = validate's refusals or dry run; apply = a new version),
   rolls back to an earlier version. Everything shown goes through textContent. */
"use strict";
(function () {
  const KEY = "asg-admin-key";
  const NAME = "asg-changed-by";
  const REFRESH_MS = 15000;
  const $ = (id) => document.getElementById(id);
  let newest = null; // the newest config version number
  let editing = null; // {queue, base}
  let timer = null;

  // ---------------------------------------------------------------- helpers

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "–" : String(text);
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function duration(s) {
    if (s === null || s === undefined) return "–";
    s = Math.round(s);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
  }

  function when(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return d.toISOString().replace("T", " ").slice(0, 19) + "Z";
  }

  function ago(iso, now) {
    if (!iso) return "never";
    return duration((new Date(now) - new Date(iso)) / 1000) + " ago";
  }

  function money(x, digits) {
    return x === null || x === undefined ? "–" : `$${Number(x).toFixed(digits || 2)}`;
  }

  function clock(iso, now) {
    // a time of today (UTC) as 13:05:00 UTC, another day's as 2026-12-01 13:05 UTC
    if (!iso) return "–";
    const t = new Date(iso).toISOString();
    const today = t.slice(0, 10) === new Date(now).toISOString().slice(0, 10);
    return (today ? t.slice(11, 19) : t.slice(0, 16).replace("T", " ")) + " UTC";
  }

  const WARM = ["stopping", "stopped", "resuming"];

  function warmText(w) {
    // a queue's warm pool: "1/2 stopped, $0.014/h · 3 hits, 1 miss today"
    if (!w) return "–";
    const shown = w.size || w.stopped || w.stopping || w.resuming || w.hits_today || w.misses_today;
    if (!shown) return "–";
    const moving = [];
    if (w.stopping) moving.push(`${w.stopping} stopping`);
    if (w.resuming) moving.push(`${w.resuming} resuming`);
    return (
      `${w.stopped}/${w.size} stopped` +
      (moving.length ? ` (${moving.join(", ")})` : "") +
      `, ${money(w.storage_per_hour, 3)}/h · ${w.hits_today} hit${w.hits_today === 1 ? "" : "s"}, ` +
      `${w.misses_today} miss${w.misses_today === 1 ? "" : "es"} today`
    );
  }

  function refusalText(r) {
    // the line `autoscaler validate` prints for a refusal: path: cause — fix: fix
    return `${r.field}: ${r.reason}` + (r.fix ? ` — fix: ${r.fix}` : "");
  }

  function detailText(data) {
    if (!data) return "no answer";
    if (typeof data.detail === "string") return data.detail;
    if (Array.isArray(data.detail)) return data.detail.map(refusalText).join("; ");
    return JSON.stringify(data);
  }

  // ---------------------------------------------------------------- the key

  function showLogin(message) {
    sessionStorage.removeItem(KEY);
    if (timer) clearInterval(timer);
    timer = null;
    $("board").hidden = true;
    $("sign-out").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("key").focus();
  }

  async function api(method, path, body) {
    const key = sessionStorage.getItem(KEY);
    if (!key) {
      showLogin("");
      throw new Error("no key");
    }
    const headers = { Authorization: `Bearer ${key}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
    let data = null;
    try {
      data = await res.json();
    } catch (e) {
      data = null;
    }
    if (res.status === 401) {
      showLogin("That key was refused (unknown or revoked). Paste a live admin key.");
      throw new Error("401");
    }
    return { status: res.status, data };
  }

  // ---------------------------------------------------------------- rendering

  function renderQueues(ov) {
    const body = $("queues").querySelector("tbody");
    body.replaceChildren();
    for (const q of ov.queues) {
      const tr = document.createElement("tr");
      tr.dataset.queue = q.queue;
      cell(tr, q.queue, "name");
      const stale = q.reading_stale ? " (stale)" : "";
      cell(tr, q.pending === null ? null : `${q.pending}${stale}`, "num pending");
      cell(tr, q.pending ? duration(q.oldest_age_seconds) : "–", "num");
      cell(tr, q.running, "num");
      cell(tr, `${q.workers.live} (${q.workers.busy} busy)`, "num workers");
      cell(tr, q.workers.booting, "num");
      cell(tr, q.workers.draining, "num");
      cell(tr, warmText(q.warm_pool), "warm");
      cell(tr, q.desired, "num desired");
      const a = q.autoscale;
      const pin = q.manual_target ? `, pinned at ${q.manual_target.workers}` : "";
      cell(tr, a ? `${a.min_workers}..${a.max_workers}${pin}` : "not autoscaled", "bounds");
      cell(tr, a ? `${a.provider} / ${a.gpu} ≤ ${money(a.max_price_per_hour)}/h` : "–");
      cell(tr, q.evaluated_at ? ago(q.evaluated_at, ov.now) : "never");
      const held = q.providers.length
        ? q.providers.map((p) => `${p.provider}: ${p.state}` + (p.until ? ` until ${when(p.until)}` : ""))
        : q.backoffs.map((b) => `backoff on ${b.provider} until ${when(b.until)}`);
      const why = q.why.concat(held);
      cell(tr, why.join("; ") || "–", "why");
      const td = cell(tr, "");
      if (q.configured && a) {
        const b = document.createElement("button");
        b.type = "button";
        b.textContent = "Edit";
        b.className = "edit";
        b.addEventListener("click", () => openEditor(q.queue));
        td.replaceChildren(b);
      }
      body.appendChild(tr);
    }
    if (!ov.queues.length) {
      const tr = document.createElement("tr");
      cell(tr, "no queue yet: apply a config with 'autoscaler apply FILE'").colSpan = 14;
      body.appendChild(tr);
    }
  }

  function renderInstances(ov) {
    const body = $("instances").querySelector("tbody");
    body.replaceChildren();
    for (const m of ov.instances) {
      const tr = document.createElement("tr");
      tr.dataset.launch = m.launch_id;
      cell(tr, m.launch_id.slice(0, 12), "mono");
      cell(tr, m.queue);
      cell(tr, m.provider);
      cell(tr, m.gpu);
      cell(tr, m.state + (m.drain_requested ? " (drain asked)" : ""), `state ${m.state}`);
      const warm = WARM.includes(m.state);
      cell(tr, warm ? "warm pool" : m.busy ? "busy" : "idle");
      cell(tr, m.running_tasks, "num");
      cell(tr, duration(m.idle_seconds), "num");
      cell(tr, duration(m.age_seconds), "num");
      cell(tr, money(m.price_per_hour), "num");
      cell(tr, money(m.cost_so_far), "num");
      cell(tr, warm || m.stopped_at ? money(m.storage_price_per_hour, 3) : "–", "num storage");
      cell(tr, m.stopped_at ? `${clock(m.stopped_at, ov.now)} (${ago(m.stopped_at, ov.now)})` : "–", "stopped-since");
      const left = m.destroy_at ? (new Date(m.destroy_at) - new Date(ov.now)) / 1000 : 0;
      const due = left > 0 ? `in ${duration(left)}` : "due: at the next reconcile";
      cell(tr, m.destroy_at ? `${clock(m.destroy_at, ov.now)} (${due})` : "–", "destroy-at");
      cell(tr, m.last_heartbeat_at ? ago(m.last_heartbeat_at, ov.now) : "never");
      body.appendChild(tr);
    }
    if (!ov.instances.length) {
      const tr = document.createElement("tr");
      cell(tr, "no machine may bill now").colSpan = 15;
      body.appendChild(tr);
    }
  }

  function renderEvents(ov) {
    const body = $("events").querySelector("tbody");
    body.replaceChildren();
    for (const e of ov.events) {
      const tr = document.createElement("tr");
      cell(tr, when(e.at), "mono");
      cell(tr, e.queue);
      cell(tr, `${e.kind} ${e.action}`);
      cell(tr, e.launch_id ? e.launch_id.slice(0, 12) : null, "mono");
      cell(tr, e.reason, "why");
      body.appendChild(tr);
    }
  }

  function renderHeader(ov) {
    const c = ov.config;
    $("config-line").textContent = c
      ? `config version ${c.version} by ${c.changed_by}, ${when(c.changed_at)}`
      : "no config applied yet";
    const s = ov.spend;
    $("spend-line").textContent =
      `spending ${money(s.rate_per_hour)}/h, ${money(s.today)} today` +
      (s.unknown_price ? ` (+${s.unknown_price} machine(s) of unknown price)` : "");
    $("updated").textContent = `updated ${when(ov.now)}`;
  }

  function renderCharts(hist, queues) {
    const box = $("charts");
    box.replaceChildren();
    const from = new Date(hist.since).getTime();
    const to = new Date(hist.now).getTime();
    for (const q of queues) {
      const pts = hist.queues[q.queue] || [];
      const series = [
        { name: "pending", cls: "pending", points: pts.map((p) => ({ t: Date.parse(p.at), v: p.pending })) },
        { name: "workers", cls: "workers", points: pts.map((p) => ({ t: Date.parse(p.at), v: p.workers })) },
      ];
      const svg = window.SvgChart.draw(`queue ${q.queue}`, series, from, to);
      svg.dataset.queue = q.queue;
      box.appendChild(svg);
    }
  }

  function renderBoots(ov) {
    // median and p90 boot per (provider, GPU): the control plane's own times
    const rows = (ov.boots || []).map((b) => ({
      label: `${b.provider} / ${b.gpu || "?"}`,
      median: b.median_seconds,
      p90: b.p90_seconds,
      samples: b.samples,
    }));
    $("boots").replaceChildren(window.SvgChart.bars("boot: median and p90", rows));
  }

  function renderVersions(list) {
    const body = $("versions").querySelector("tbody");
    body.replaceChildren();
    newest = list.length ? list[0].version : null;
    for (const v of list) {
      const tr = document.createElement("tr");
      tr.dataset.version = v.version;
      cell(tr, v.version, "num");
      cell(tr, when(v.changed_at), "mono");
      cell(tr, v.changed_by);
      cell(tr, v.comment, "why");
      const td = cell(tr, v.version === newest ? "running" : "");
      if (v.version !== newest) {
        const b = document.createElement("button");
        b.type = "button";
        b.className = "rollback";
        b.textContent = `Roll back to ${v.version}`;
        b.addEventListener("click", () => rollback(v.version));
        td.replaceChildren(b);
      }
      body.appendChild(tr);
    }
  }

  async function refresh() {
    try {
      const hours = $("hours").value;
      const [ov, hist, vers] = await Promise.all([
        api("GET", "/v1/admin/overview"),
        api("GET", `/v1/admin/history?hours=${encodeURIComponent(hours)}`),
        api("GET", "/v1/admin/config/versions"),
      ]);
      for (const r of [ov, hist, vers]) {
        if (r.status !== 200) throw new Error(detailText(r.data));
      }
      $("load-error").hidden = true;
      renderHeader(ov.data);
      renderQueues(ov.data);
      renderCharts(hist.data, ov.data.queues);
      renderInstances(ov.data);
      renderBoots(ov.data);
      renderEvents(ov.data);
      renderVersions(vers.data);
      document.body.dataset.loaded = String(Date.now());
    } catch (e) {
      if (e.message === "401" || e.message === "no key") return;
      $("load-error").textContent = `could not load: ${e.message}`;
      $("load-error").hidden = false;
    }
  }

  // ---------------------------------------------------------------- editing

  function clearResult() {
    $("refusals").replaceChildren();
    $("changes").replaceChildren();
    $("dry-run").textContent = "";
    $("edit-message").textContent = "";
    $("edit-message").className = "";
  }

  function showRefusals(detail) {
    const ul = $("refusals");
    ul.replaceChildren();
    const list = Array.isArray(detail) ? detail : [{ field: "request", reason: String(detail) }];
    for (const r of list) {
      const li = document.createElement("li");
      li.textContent = refusalText(r);
      ul.appendChild(li);
    }
  }

  function showChanges(changes) {
    const ul = $("changes");
    ul.replaceChildren();
    for (const c of changes) {
      const li = document.createElement("li");
      li.textContent = c;
      ul.appendChild(li);
    }
  }

  async function openEditor(queue) {
    const r = await api("GET", `/v1/admin/queues/${encodeURIComponent(queue)}/autoscale`);
    if (r.status !== 200) {
      $("load-error").textContent = detailText(r.data);
      $("load-error").hidden = false;
      return;
    }
    editing = { queue, base: r.data.version };
    $("edit-queue").textContent = queue;
    $("edit-base").textContent = String(r.data.version);
    $("edit-yaml").value = r.data.yaml;
    $("edit-comment").value = "";
    clearResult();
    $("editor").hidden = false;
    $("editor").scrollIntoView();
    $("edit-yaml").focus();
  }

  async function preview() {
    if (!editing) return;
    clearResult();
    const r = await api("POST", "/v1/admin/config/preview", {
      queue: editing.queue,
      autoscale: $("edit-yaml").value,
    });
    if (r.status === 200) {
      showChanges(r.data.changes.length ? r.data.changes : ["no change"]);
      $("dry-run").textContent = r.data.dry_run;
      $("edit-message").textContent = "valid: this is the dry run; nothing is stored yet";
      $("edit-message").className = "ok";
    } else {
      showRefusals(r.data && r.data.detail);
      $("edit-message").textContent = `refused (${r.status}): nothing is stored`;
      $("edit-message").className = "error";
    }
  }

  async function apply() {
    if (!editing) return;
    clearResult();
    const by = $("edit-by").value.trim() || "dashboard";
    sessionStorage.setItem(NAME, by);
    const r = await api("PUT", `/v1/admin/queues/${encodeURIComponent(editing.queue)}/autoscale`, {
      yaml: $("edit-yaml").value,
      comment: $("edit-comment").value.trim() || null,
      changed_by: by,
      base_version: editing.base,
    });
    if (r.status === 200) {
      showChanges(r.data.changes);
      $("edit-message").textContent = r.data.changed
        ? `recorded as version ${r.data.version}`
        : `nothing changed: version ${r.data.version} runs`;
      $("edit-message").className = "ok";
      editing.base = r.data.version;
      $("edit-base").textContent = String(r.data.version);
      await refresh();
    } else if (r.status === 422 && Array.isArray(r.data.detail)) {
      showRefusals(r.data.detail);
      $("edit-message").textContent = "refused: nothing is stored";
      $("edit-message").className = "error";
    } else {
      $("edit-message").textContent = detailText(r.data);
      $("edit-message").className = "error";
    }
  }

  async function rollback(version) {
    const by = $("edit-by").value.trim() || sessionStorage.getItem(NAME) || "dashboard";
    const msg = $("rollback-message");
    const r = await api("POST", "/v1/admin/config/rollback", {
      version,
      comment: $("rollback-reason").value.trim() || null,
      changed_by: by,
      base_version: newest,
    });
    if (r.status === 200) {
      msg.textContent = `rolled back: version ${version}'s config is now version ${r.data.version}`;
      msg.className = "ok";
      $("rollback-reason").value = "";
      editing = null; // an open edit was made on the version before: start it again
      $("editor").hidden = true;
    } else {
      msg.textContent = `refused: ${detailText(r.data)}`;
      msg.className = "error";
    }
    await refresh();
  }

  // ---------------------------------------------------------------- start

  function start() {
    $("login").hidden = true;
    $("board").hidden = false;
    $("sign-out").hidden = false;
    $("edit-by").value = sessionStorage.getItem(NAME) || "";
    refresh();
    if (!timer) timer = setInterval(refresh, REFRESH_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const key = $("key").value.trim();
      $("key").value = "";
      if (!key) return;
      sessionStorage.setItem(KEY, key);
      start();
    });
    $("sign-out").addEventListener("click", () => showLogin("Signed out."));
    $("hours").addEventListener("change", refresh);
    $("edit-preview").addEventListener("click", preview);
    $("edit-apply").addEventListener("click", apply);
    $("edit-cancel").addEventListener("click", () => {
      editing = null;
      $("editor").hidden = true;
    });
    if (sessionStorage.getItem(KEY)) start();
    else showLogin("");
  });
})();
