// The Kittiwake web console: reads the admin API (/api/...) once a second and draws it; plain
// DOM and canvas, no framework, nothing fetched from outside the broker.
"use strict";

const ACTION_HEADER = "X-Kittiwake-Action";
const REFRESH_MS = 1000;
const pages = ["overview", "clients", "sessions", "queues", "retained"];
// The queue whose first messages the queues page shows (its Browse button), or null.
let browsing = null;

function show(message, isError) {
  const element = document.getElementById("message");
  element.textContent = message || "";
  element.className = isError ? "error" : "";
}

async function api(path, method) {
  const options = { method: method || "GET", headers: { Accept: "application/json" } };
  if (options.method !== "GET") options.headers[ACTION_HEADER] = "1";
  const response = await fetch(path, options);
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    throw new Error((body && body.error) || `${response.status} ${response.statusText}`);
  }
  return body;
}

function cell(row, value, numeric) {
  const td = document.createElement("td");
  if (value === null || value === undefined) value = "-";
  else if (value === true) value = "yes";
  else if (value === false) value = "no";
  td.textContent = String(value);
  if (numeric) td.className = "number";
  row.appendChild(td);
  return td;
}

// columns: [heading, key or function, numeric]; actions: [label, function(item)]
function fillTable(id, columns, items, actions) {
  const table = document.getElementById(id);
  table.replaceChildren();
  const head = table.createTHead().insertRow();
  for (const [heading] of columns) {
    const th = document.createElement("th");
    th.textContent = heading;
    head.appendChild(th);
  }
  if (actions && actions.length) head.appendChild(document.createElement("th"));
  const body = table.createTBody();
  if (!items.length) {
    const td = cell(body.insertRow(), "none");
    td.colSpan = columns.length + (actions && actions.length ? 1 : 0);
    td.className = "empty";
    return;
  }
  for (const item of items) {
    const row = body.insertRow();
    for (const [, key, numeric] of columns) {
      cell(row, typeof key === "function" ? key(item) : item[key], numeric);
    }
    if (actions && actions.length) {
      const td = cell(row, "");
      for (const [label, act, applies] of actions) {
        if (applies && !applies(item)) continue;
        const button = document.createElement("button");
        button.textContent = label;
        button.onclick = () => act(item);
        td.appendChild(button);
      }
    }
  }
}

async function act(question, path, method, done) {
  if (!window.confirm(question)) return;
  try {
    const answer = await api(path, method);
    show(done(answer), false);
    refresh();
  } catch (error) {
    show(error.message, true);
  }
}

const encode = encodeURIComponent;

function drawGraph(id, samples, inKey, outKey) {
  const canvas = document.getElementById(id);
  canvas.dataset.samples = String(samples.length);
  const context = canvas.getContext("2d");
  const width = canvas.width, height = canvas.height, margin = 40;
  context.clearRect(0, 0, width, height);
  const peak = Math.max(1, ...samples.map(s => Math.max(s[inKey], s[outKey])));
  context.strokeStyle = "#c8d2d8";
  context.fillStyle = "#556";
  context.font = "11px sans-serif";
  context.beginPath();
  context.moveTo(margin, 5); context.lineTo(margin, height - 15); context.lineTo(width, height - 15);
  context.stroke();
  context.fillText(String(peak), 2, 12);
  context.fillText("0", 2, height - 15);
  context.fillText(`${samples.length} s`, width - 40, height - 2);
  const plotWidth = width - margin, plotHeight = height - 25;
  const kept = 300;
  for (const [key, colour] of [[inKey, "#1f77b4"], [outKey, "#e07020"]]) {
    context.strokeStyle = colour;
    context.lineWidth = 2;
    context.beginPath();
    samples.forEach((sample, i) => {
      const x = margin + plotWidth * (kept - samples.length + i) / (kept - 1);
      const y = 5 + plotHeight * (1 - sample[key] / peak);
      if (i === 0) context.moveTo(x, y); else context.lineTo(x, y);
    });
    context.stroke();
  }
}

const renderers = {
  async overview() {
    const [status, samples] = await Promise.all([api("/api/status"), api("/api/throughput")]);
    document.getElementById("broker-version").textContent =
      `kittiwake ${status.version}`;
    const figures = [
      ["Uptime", `${Math.round(status.uptime_seconds)} s`],
      ["Connections", Object.entries(status.connections).map(([k, v]) => `${k} ${v}`).join(", ")],
      ["Sessions", status.sessions],
      ["Subscriptions", status.subscriptions],
      ["Queues", status.queues],
      ["Retained messages", status.retained_messages],
      ["Messages received", status.messages_received],
      ["Messages sent", status.messages_sent],
      ["Messages dropped", status.messages_dropped],
      ["Bytes received", status.bytes_received],
      ["Bytes sent", status.bytes_sent],
    ];
    const list = document.getElementById("status");
    list.replaceChildren();
    for (const [name, value] of figures) {
      const dt = document.createElement("dt"); dt.textContent = name;
      const dd = document.createElement("dd"); dd.textContent = String(value);
      list.append(dt, dd);
    }
    drawGraph("graph-messages", samples, "messages_in", "messages_out");
    drawGraph("graph-bytes", samples, "bytes_in", "bytes_out");
  },
  async clients() {
    const clients = await api("/api/clients");
    fillTable("clients-table", [
      ["Client id", "client_id"], ["Protocol", "protocol"], ["Peer", "peer"], ["User", "user"],
      ["Keepalive", "keepalive", true], ["In flight", "in_flight", true],
    ], clients, [["Disconnect", c => act(`Disconnect ${c.client_id}?`,
      `/api/clients/${encode(c.client_id)}/disconnect`, "POST",
      a => `${a.client_id}: ${a.disconnected} connection(s) closed`)]]);
  },
  async sessions() {
    const [sessions, subscriptions] = await Promise.all([
      api("/api/sessions"), api("/api/subscriptions")]);
    fillTable("sessions-table", [
      ["Client id", "client_id"], ["Connected", "connected"], ["Persistent", "persistent"],
      ["Expires in (s)", s => s.expires_in === null ? null : Math.round(s.expires_in), true],
      ["Subscriptions", "subscriptions", true], ["Queued", "queued", true],
      ["In flight", "in_flight", true],
    ], sessions, [["Delete", s => act(`Delete session ${s.client_id} and its messages?`,
      `/api/sessions/${encode(s.client_id)}`, "DELETE", a => `session ${a.session} deleted`),
      s => !s.connected]]);
    fillTable("subscriptions-table", [
      ["Client id", "client_id"], ["Filter", "topic_filter"], ["QoS", "max_qos", true],
      ["Durable", "durable"], ["Connected", "connected"], ["Share group", "shared_group"],
    ], subscriptions, [["Delete", s => act(
      `Delete the durable subscription ${s.client_id} and its messages?`,
      `/api/sessions/${encode(s.client_id)}`, "DELETE", a => `session ${a.session} deleted`),
      s => s.durable && !s.connected]]);
  },
  async queues() {
    const withSessions = document.getElementById("with-sessions").checked;
    const queues = await api(`/api/queues${withSessions ? "?sessions=1" : ""}`);
    fillTable("queues-table", [
      ["Queue", "name"], ["Kind", "kind"], ["Depth", "depth", true], ["Bytes", "bytes", true],
      ["In flight", "in_flight", true], ["Consumers", "consumers", true],
      ["Expired", "expired", true], ["Dead-lettered", "dead_lettered", true],
    ], queues, [["Browse", q => { browsing = q.name; refresh(); }],
      ["Purge", q => act(`Purge every waiting message of ${q.name}?`,
      `/api/queues/${encode(q.name)}/purge`, "POST",
      a => `queue ${a.queue}: ${a.purged} messages purged`), q => q.kind === "queue"]]);
    const section = document.getElementById("entries");
    section.hidden = browsing === null;
    if (browsing === null) return;
    document.getElementById("entries-queue").textContent = browsing;
    let entries = [];
    try {
      entries = await api(`/api/queues/${encode(browsing)}/entries`);
    } catch (error) {
      browsing = null;  // the queue is gone
      section.hidden = true;
      throw error;
    }
    fillTable("entries-table", [
      ["Message id", "message_id", true], ["Destination", "destination"], ["State", "state"],
      ["Priority", "priority", true], ["Bytes", "bytes", true], ["Persistent", "persistent"],
      ["Deliveries", "delivery_count", true], ["Age (s)", e => e.age.toFixed(1), true],
      ["Expires in (s)", e => e.expires_in === null ? null : Math.round(e.expires_in), true],
    ], entries);
  },
  async retained() {
    const retained = await api("/api/retained");
    fillTable("retained-table", [
      ["Topic", "topic"], ["Bytes", "bytes", true], ["QoS", "qos", true],
      ["Persistent", "persistent"],
      ["Expires in (s)", r => r.expires_in === null ? null : Math.round(r.expires_in), true],
    ], retained);
  },
};

function currentPage() {
  const name = location.hash.replace("#", "");
  return pages.includes(name) ? name : "overview";
}

let refreshing = false;
async function refresh() {
  if (refreshing) return;
  refreshing = true;
  const page = currentPage();
  try {
    await renderers[page]();
    document.body.dataset.loaded = page;
  } catch (error) {
    show(`cannot read the broker: ${error.message}`, true);
  } finally {
    refreshing = false;
  }
}

function route() {
  const page = currentPage();
  for (const name of pages) {
    document.getElementById(`page-${name}`).classList.toggle("active", name === page);
    document.querySelector(`nav a[data-page="${name}"]`).classList.toggle("active", name === page);
  }
  delete document.body.dataset.loaded;
  refresh();
}

window.addEventListener("hashchange", route);
document.getElementById("with-sessions").addEventListener("change", refresh);
route();
setInterval(refresh, REFRESH_MS);
