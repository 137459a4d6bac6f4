// The jobfence dashboard page: polls /api/state every 2 s, counts time left down between
// polls, shows the schedules of the schedulers and the outboxes it was given, and (when the
// server allows actions) asks for a confirmation before each action.
// Every value from the server is put in the page as text, never as HTML.
"use strict";

const POLL_MS = 2000;
const TICK_MS = 250;

const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;
const ACTIONS = meta("jobfence-actions") === "1";
const TOKEN = meta("jobfence-token");

let lastSignature = null;
let inFlight = false;
let again = false; // a refresh asked for while one was in flight runs after it
// the cells counting down: [element, deadline (performance.now() ms) or null, key]
let countdowns = [];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "onclick") node.addEventListener("click", value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

function show(value) {
  return value === null || value === undefined ? "?" : String(value);
}

function formatLeft(ms) {
  if (ms === null) return "no ttl";
  if (ms <= 0) return "expired";
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${Math.floor(s % 60)}s`;
  return `${Math.floor(m / 60)}h ${m % 60}m`;
}

function formatIn(ms) {
  if (ms === null) return "";
  return ms <= 0 ? "due" : `in ${formatLeft(ms)}`;
}

function tick() {
  const now = performance.now();
  for (const entry of countdowns) {
    const [cell, deadline, , format] = entry;
    cell.textContent = (format || formatLeft)(deadline === null ? null : deadline - now);
  }
}

function countdownCell(key, seconds, fetchedAt) {
  const cell = el("td", { class: "num left" });
  countdowns.push([cell, seconds === null ? null : fetchedAt + seconds * 1000, key]);
  return cell;
}

// The time to a schedule's next fire, counting down ("in 42.0s", then "due").
function nextCell(key, schedule, fetchedAt) {
  const left = el("span", { class: "muted next-in" });
  const seconds = schedule.next_in;
  countdowns.push([left, seconds === null ? null : fetchedAt + seconds * 1000, key, formatIn]);
  return el("td", { class: "next" }, el("span", { class: "next-at" }, schedule.next_at || "none"),
    " ", left);
}

// The state without what changes at every poll (time left), to re-render only on change.
function signature(state) {
  return JSON.stringify(state, (key, value) =>
    key === "expires_in" || key === "generated_at" || key === "age" || key === "next_in" ||
    key === "oldest_pending"
      ? undefined
      : value,
  );
}

function lockKey(targetId, name) {
  return `lock:${targetId}:${name}`;
}

function claimKey(targetId, key) {
  return `claim:${targetId}:${key}`;
}

function scheduleKey(schedulerId, name) {
  return `schedule:${schedulerId}:${name}`;
}

// New deadlines for the cells already on the page (same rows, new time left).
function updateDeadlines(state, fetchedAt) {
  const seconds = new Map();
  for (const target of state.targets) {
    for (const lock of (target.locks && target.locks.items) || []) {
      seconds.set(lockKey(target.id, lock.name), lock.expires_in);
    }
    const inbox = target.inbox || {};
    for (const claim of [...(inbox.items || []), ...(inbox.in_progress || [])]) {
      seconds.set(claimKey(target.id, claim.key), claim.expires_in);
    }
  }
  for (const source of state.schedulers || []) {
    for (const schedule of source.schedules || []) {
      seconds.set(scheduleKey(source.id, schedule.name), schedule.next_in);
    }
  }
  for (const entry of countdowns) {
    if (seconds.has(entry[2])) {
      const s = seconds.get(entry[2]);
      entry[1] = s === null ? null : fetchedAt + s * 1000;
    }
  }
}

// -- confirmation and actions -------------------------------------------------------------

const dialog = document.getElementById("confirm");
let answer = null;

function confirmAction(text) {
  document.getElementById("confirm-text").textContent = text;
  dialog.showModal();
  return new Promise((resolve) => {
    answer = resolve;
  });
}

function closeDialog(result) {
  if (dialog.open) dialog.close();
  if (answer) {
    const resolve = answer;
    answer = null;
    resolve(result);
  }
}

document.getElementById("confirm-ok").addEventListener("click", () => closeDialog(true));
document.getElementById("confirm-cancel").addEventListener("click", () => closeDialog(false));
dialog.addEventListener("cancel", () => closeDialog(false)); // Escape

function say(text, isError) {
  const message = document.getElementById("message");
  message.textContent = text;
  message.className = isError ? "error" : "ok";
  message.hidden = false;
}

async function act(question, path, body, describe) {
  if (!(await confirmAction(question))) return;
  try {
    const response = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Jobfence-Token": TOKEN },
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    const result = await response.json();
    if (!response.ok) say(`${path}: ${result.error || response.status}`, true);
    else say(describe(result), result.outcome === "failed"); // a triggered fire can fail
  } catch (error) {
    say(`${path}: ${error}`, true);
  }
  refresh();
}

function button(label, onclick, extra) {
  return el("button", { type: "button", class: "danger", onclick, ...(extra || {}) }, label);
}

// -- the panels ---------------------------------------------------------------------------

function errorLine(panel) {
  return el("p", { class: "error", role: "alert" }, panel.error);
}

function table(headers, rows, extra) {
  const head = el("tr", null, ...headers.map((h) => el("th", { scope: "col" }, h)));
  return el("table", extra || null, el("thead", null, head), el("tbody", null, ...rows));
}

function locksPanel(target, fetchedAt) {
  const panel = target.locks;
  const section = el("section", { class: "panel locks" }, el("h3", null, "locks"));
  if (panel.status === "unsupported") {
    section.append(el("p", { class: "muted" }, `the ${target.backend} backend has no locks`));
    return section;
  }
  if (panel.status === "error") {
    section.append(errorLine(panel));
    return section;
  }
  section.querySelector("h3").append(
    el("span", { class: "muted" }, ` namespace ${panel.namespace}: ${panel.items.length}` +
      (panel.truncated ? "+" : "") + " held"),
  );
  if (!panel.items.length) {
    section.append(el("p", { class: "muted empty" }, "no lock held"));
    return section;
  }
  const headers = ["name", "holder", "token", "time left"];
  if (ACTIONS) headers.push("");
  const rows = panel.items.map((lock) => {
    const row = el(
      "tr",
      { "data-lock": lock.name },
      el("td", { class: "name" }, lock.name),
      el("td", { class: "owner" }, lock.owner === null ? "(not recorded)" : lock.owner),
      el("td", { class: "num token" }, show(lock.token)),
      countdownCell(lockKey(target.id, lock.name), lock.expires_in, fetchedAt),
    );
    if (ACTIONS) {
      const question =
        `Break lock ${lock.name} held by ${lock.owner || "(unknown owner)"} ` +
        `token ${show(lock.token)}?`;
      row.append(
        el(
          "td",
          null,
          button("Break", () =>
            act(question, "/api/locks/break", { target: target.id, name: lock.name }, (r) =>
              r.broken ? `broke ${lock.name}` : `${lock.name} was no longer held`,
            ),
          ),
        ),
      );
    }
    return row;
  });
  section.append(table(headers, rows));
  return section;
}

function claimRows(target, claims, fetchedAt) {
  return claims.map((claim) => {
    const row = el(
      "tr",
      { "data-claim": claim.key, class: claim.stuck ? "stuck" : null },
      el("td", { class: "name" }, claim.key),
      el("td", null, claim.state + (claim.stuck ? " (stuck)" : "")),
      el("td", { class: "owner" }, show(claim.owner)),
      el("td", { class: "num" }, show(claim.attempt)),
      el("td", null, claim.claimed_at || ""),
      countdownCell(claimKey(target.id, claim.key), claim.expires_in, fetchedAt),
    );
    if (ACTIONS) {
      const question =
        `Forget inbox key ${claim.key} (${claim.state}, owner ${show(claim.owner)}) ` +
        `in table ${target.inbox.table}?`;
      row.append(
        el(
          "td",
          null,
          button("Forget", () =>
            act(question, "/api/inbox/forget", { target: target.id, key: claim.key }, (r) =>
              r.forgotten ? `forgot ${claim.key}` : `${claim.key} was already gone`,
            ),
          ),
        ),
      );
    }
    return row;
  });
}

function inboxPanel(target, fetchedAt) {
  const panel = target.inbox;
  const section = el("section", { class: "panel inbox" }, el("h3", null, "inbox claims"));
  if (panel.status === "unsupported") {
    section.append(el("p", { class: "muted" }, `the ${target.backend} backend has no inbox`));
    return section;
  }
  if (panel.status === "error") {
    section.append(errorLine(panel));
    return section;
  }
  section.querySelector("h3").append(el("span", { class: "muted" }, ` table ${panel.table}`));
  if (!panel.available) {
    section.append(el("p", { class: "muted unavailable" }, "claims: not available"));
  } else {
    const counts = Object.entries(panel.counts);
    const stuck = panel.items.length;
    section.append(
      el(
        "p",
        { class: "counts" },
        counts.length
          ? counts
              .map(([state, n]) => {
                const more = panel.truncated[state] ? "+" : "";
                return `${state.replace("_", " ")}: ${n}${more}`;
              })
              .join(", ")
          : "no records",
        stuck ? `; stuck: ${stuck}` : "",
      ),
    );
    const claims = [...panel.items, ...panel.in_progress];
    if (claims.length) {
      const headers = ["key", "state", "owner", "attempt", "claimed at", "time left"];
      if (ACTIONS) headers.push("");
      section.append(table(headers, claimRows(target, claims, fetchedAt)));
    }
  }
  if (ACTIONS) {
    const question = `Purge the expired records of inbox table ${panel.table} at ${target.url}?`;
    section.append(
      button("Purge expired", () =>
        act(question, "/api/inbox/purge", { target: target.id }, (r) =>
          `purged ${r.purged} record(s)`,
        ),
      ),
    );
  }
  return section;
}

function queuePanel(target, queue) {
  const section = el(
    "section",
    { class: "panel queue", "data-queue": queue.name },
    el("h3", null, `queue ${queue.name}`),
  );
  if (queue.status === "unsupported") {
    section.append(el("p", { class: "muted" }, `the ${target.backend} backend has no queues`));
    return section;
  }
  if (queue.status === "error") {
    section.append(errorLine(queue));
    return section;
  }
  const counts = el(
    "tr",
    null,
    el("td", { class: "num ready" }, show(queue.ready)),
    el("td", { class: "num delayed" }, show(queue.delayed)),
    el("td", { class: "num in-flight" }, show(queue.in_flight)),
    el("td", { class: "num dead" }, show(queue.dead)),
  );
  section.append(table(["ready", "delayed", "in flight", "dead"], [counts], { class: "counts" }));
  if (!queue.dead_letters.length) return section;
  const headers = ["dead letter", "deliveries", "dead at", "error"];
  if (ACTIONS) headers.push("");
  const rows = queue.dead_letters.map((dead) => {
    const row = el(
      "tr",
      { "data-dead": dead.id },
      el("td", { class: "name" }, dead.id),
      el("td", { class: "num" }, show(dead.deliveries)),
      el("td", null, dead.dead_at ? new Date(dead.dead_at * 1000).toISOString() : ""),
      el("td", { class: "error-text" }, dead.error || ""),
    );
    if (ACTIONS) {
      const question = `Requeue dead letter ${dead.id} of queue ${queue.name} at ${target.url}?`;
      row.append(
        el(
          "td",
          null,
          button("Requeue", () =>
            act(
              question,
              "/api/queues/requeue",
              { target: target.id, queue: queue.name, ids: [dead.id] },
              (r) => `requeued ${r.requeued} message(s)`,
            ),
          ),
        ),
      );
    }
    return row;
  });
  section.append(table(headers, rows, { class: "dead-letters" }));
  if (ACTIONS) {
    const question =
      `Requeue all ${show(queue.dead)} dead letters of queue ${queue.name} at ${target.url}?`;
    section.append(
      button("Requeue all", () =>
        act(
          question,
          "/api/queues/requeue",
          { target: target.id, queue: queue.name, ids: null },
          (r) => `requeued ${r.requeued} message(s)`,
        ),
      ),
    );
  }
  return section;
}

// -- schedules ------------------------------------------------------------------------------

function lagText(lag) {
  return lag === null || lag === undefined ? "" : `lag ${lag.toFixed(3)} s`;
}

function fireText(fire) {
  if (!fire) return "never";
  const parts = [fire.slot || fire.key, fire.outcome];
  if (fire.manual) parts.push("(triggered)");
  if (fire.pod) parts.push(`by ${fire.pod}`);
  const lag = lagText(fire.lag);
  if (lag) parts.push(lag);
  return parts.join(" ");
}

function countsText(schedule) {
  const seen = Object.entries(schedule.outcomes)
    .filter(([, n]) => n > 0)
    .map(([outcome, n]) => `${n} ${outcome}`);
  return `last ${schedule.read} record(s): ${seen.length ? seen.join(", ") : "none"}`;
}

function scheduleActions(source, schedule) {
  const where = `schedule ${schedule.name} of ${source.label}`;
  const body = { scheduler: source.id, name: schedule.name };
  const cells = [];
  if (schedule.paused) {
    cells.push(
      button("Resume", () =>
        act(`Resume ${where}?`, "/api/schedules/resume", body, (r) =>
          r.was_paused ? `resumed ${schedule.name}` : `${schedule.name} was not paused`,
        ),
      ),
    );
  } else {
    cells.push(
      button("Pause", () =>
        act(`Pause ${where} on every process?`, "/api/schedules/pause", body, (r) =>
          r.was_paused ? `${schedule.name} was paused already` : `paused ${schedule.name}`,
        ),
      ),
    );
  }
  cells.push(" ");
  cells.push(
    button("Trigger", () =>
      act(`Fire ${where} once now, in the dashboard's process?`,
        "/api/schedules/trigger", body, (r) =>
          `${schedule.name}: ${r.outcome} ${r.key}` + (r.error ? `: ${r.error}` : ""),
      ),
    ),
  );
  return el("td", { class: "actions" }, ...cells);
}

function historyTable(schedule) {
  const rows = schedule.history.map((fire) =>
    el(
      "tr",
      { "data-fire": fire.key, class: `outcome-${fire.outcome}` },
      el("td", { class: "name" }, (fire.slot || "?") + (fire.manual ? " (triggered)" : "")),
      el("td", { class: "outcome" }, fire.outcome),
      el("td", { class: "owner" }, show(fire.pod)),
      el("td", null, fire.fired_at || ""),
      el("td", { class: "num" }, fire.lag === null ? "" : `${fire.lag.toFixed(3)} s`),
      el("td", { class: "error-text" }, fire.error || ""),
    ),
  );
  return table(["slot", "outcome", "pod", "fired at", "lag", "note"], rows, {
    class: "history",
    "data-history": schedule.name,
  });
}

function schedulesPanel(source, fetchedAt) {
  const section = el(
    "section",
    { class: "panel schedules" },
    el("h3", null, "schedules", el("span", { class: "muted" }, ` pod ${source.pod}`)),
  );
  if (source.status === "error") {
    section.append(errorLine(source));
    return section;
  }
  if (!source.schedules.length) {
    section.append(el("p", { class: "muted empty" }, "no schedule"));
    return section;
  }
  const headers = ["name", "spec", "time zone", "state", "next fire", "last fire", "misses",
    "records"];
  if (ACTIONS) headers.push("");
  const rows = source.schedules.map((schedule) => {
    const row = el(
      "tr",
      { "data-schedule": schedule.name, class: schedule.paused ? "paused" : null },
      el("td", { class: "name" }, schedule.name),
      el("td", { class: "spec" }, schedule.spec),
      el("td", { class: "tz" }, schedule.tz),
      el("td", { class: "state" }, schedule.paused ? "paused" : "active"),
      nextCell(scheduleKey(source.id, schedule.name), schedule, fetchedAt),
      el("td", { class: "last" }, fireText(schedule.last)),
      el("td", { class: "num misses" }, show(schedule.misses)),
      el("td", { class: "counts" }, countsText(schedule)),
    );
    if (ACTIONS) row.append(scheduleActions(source, schedule));
    return row;
  });
  section.append(table(headers, rows, { class: "schedules" }));
  for (const schedule of source.schedules) {
    if (!schedule.history.length) continue;
    section.append(
      el("h4", null, `${schedule.name}: newest records`),
      historyTable(schedule),
    );
  }
  return section;
}

function schedulerArticle(source, fetchedAt) {
  return el(
    "article",
    { class: "scheduler", "data-scheduler": String(source.id) },
    el(
      "h2",
      null,
      `scheduler ${source.label}`,
      el("span", { class: "muted" }, source.url ? ` ${source.url}` : ""),
    ),
    schedulesPanel(source, fetchedAt),
  );
}

// -- outboxes -------------------------------------------------------------------------------

function ageText(seconds) {
  return seconds === null || seconds === undefined ? "nothing waiting" : formatLeft(seconds * 1000);
}

// The oldest unpublished row's age changes at every poll: set in place, not re-rendered.
function updateOutboxAges(state) {
  for (const source of state.outboxes || []) {
    const cell = document.querySelector(`article[data-outbox="${source.id}"] .oldest-pending`);
    if (cell && source.status === "ok") cell.textContent = ageText(source.oldest_pending);
  }
}

function outboxRetry(source, ids, question) {
  return act(question, "/api/outbox/retry", { outbox: source.id, ids }, (r) =>
    `retried ${r.retried} dead row(s)`,
  );
}

function outboxPanel(source) {
  const section = el("section", { class: "panel outbox" }, el("h3", null, "outbox"));
  if (source.status === "error") {
    section.append(errorLine(source));
    return section;
  }
  const counts = source.counts;
  section.append(
    table(
      ["pending", "claimed", "published", "dead", "oldest unpublished"],
      [
        el(
          "tr",
          null,
          el("td", { class: "num pending" }, show(counts.pending)),
          el("td", { class: "num claimed" }, show(counts.claimed)),
          el("td", { class: "num published" }, show(counts.published)),
          el("td", { class: "num dead" }, show(counts.dead)),
          el("td", { class: "num oldest-pending" }, ageText(source.oldest_pending)),
        ),
      ],
      { class: "counts" },
    ),
  );
  if (source.queues.length) {
    const rows = source.queues.map((queue) =>
      el(
        "tr",
        { "data-outbox-queue": queue.name },
        el("td", { class: "name" }, queue.name),
        el("td", { class: "num pending" }, show(queue.pending)),
        el("td", { class: "num claimed" }, show(queue.claimed)),
      ),
    );
    section.append(
      el("h4", null, "unpublished rows by queue" + (source.queues_truncated ? " (first rows)" : "")),
      table(["queue", "pending", "claimed"], rows, { class: "outbox-queues counts" }),
    );
  }
  if (!source.dead.length) return section;
  const headers = ["dead row", "queue", "key", "attempts", "error"];
  if (ACTIONS) headers.push("");
  const rows = source.dead.map((dead) => {
    const row = el(
      "tr",
      { "data-outbox-dead": dead.id },
      el("td", { class: "name" }, dead.id),
      el("td", { class: "name queue" }, dead.queue),
      el("td", { class: "name key" }, dead.key === null ? "" : dead.key),
      el("td", { class: "num attempts" }, show(dead.attempts)),
      el("td", { class: "error-text" }, dead.error || ""),
    );
    if (ACTIONS) {
      const question =
        `Retry dead row ${dead.id} (queue ${dead.queue}, ${show(dead.attempts)} attempts) ` +
        `of outbox ${source.table} at ${source.url}?`;
      row.append(el("td", null, button("Retry", () => outboxRetry(source, [dead.id], question))));
    }
    return row;
  });
  section.append(
    el("h4", null, source.dead_truncated ? `newest ${source.dead.length} dead rows` : "dead rows"),
    table(headers, rows, { class: "outbox-dead" }),
  );
  if (ACTIONS) {
    const question =
      `Retry all ${show(counts.dead)} dead rows of outbox ${source.table} at ${source.url}?`;
    section.append(button("Retry all dead", () => outboxRetry(source, null, question)));
  }
  return section;
}

function outboxArticle(source) {
  return el(
    "article",
    { class: "outbox", "data-outbox": String(source.id) },
    el("h2", null, `outbox ${source.table}`, el("span", { class: "muted" }, ` ${source.url}`)),
    outboxPanel(source),
  );
}

function render(state, fetchedAt) {
  countdowns = [];
  const main = document.getElementById("targets");
  const schedulers = (state.schedulers || []).map((s) => schedulerArticle(s, fetchedAt));
  const sections = state.targets.map((target) =>
    el(
      "article",
      { class: "target", "data-target": String(target.id) },
      el("h2", null, target.url, el("span", { class: "muted" }, ` ${target.backend}`)),
      locksPanel(target, fetchedAt),
      inboxPanel(target, fetchedAt),
      ...target.queues.map((queue) => queuePanel(target, queue)),
    ),
  );
  const outboxes = (state.outboxes || []).map((o) => outboxArticle(o));
  main.replaceChildren(...sections, ...schedulers, ...outboxes);
}

async function refresh() {
  if (inFlight) {
    again = true;
    return;
  }
  inFlight = true;
  const failure = document.getElementById("fetch-error");
  try {
    const response = await fetch("/api/state", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const state = await response.json();
    const fetchedAt = performance.now();
    const sig = signature(state);
    if (sig !== lastSignature) {
      render(state, fetchedAt);
      lastSignature = sig;
    } else {
      updateDeadlines(state, fetchedAt);
      updateOutboxAges(state);
    }
    tick();
    failure.hidden = true;
    document.getElementById("updated").textContent =
      `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    failure.textContent = `cannot reach the dashboard server: ${error.message}`;
    failure.hidden = false;
  } finally {
    inFlight = false;
    if (again) {
      again = false;
      refresh();
    }
  }
}

document.getElementById("mode").textContent = ACTIONS ? "actions allowed" : "read-only";
document.getElementById("mode").classList.add(ACTIONS ? "actions" : "read-only");
document.getElementById("refresh").addEventListener("click", refresh);
setInterval(refresh, POLL_MS);
setInterval(tick, TICK_MS);
refresh();
