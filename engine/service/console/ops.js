// #/ops: /v1/stats (offsets, lag, outcome counts, poison, erased) and /v1/cluster?lag=true (each
// partition's owner, and each member with its partitions, its lag on each and a link to its own
// console), refreshed every few seconds. Only this server is asked: it asks the other members.
import { api } from "./api.js";
import { clear, h } from "./dom.js";

const EVERY_MS = 3000;
const COUNTS = ["accepted", "duplicates", "conflicts", "rejected_closed", "corrupt", "precondition_failed",
  "not_replaceable", "cleared", "erased", "fenced", "deleted"];

function table(caption, head, rows) {
  return h("table", {}, h("caption", { text: caption }),
    h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col", text: c })))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c, i) => (i === 0 ? h("th", { scope: "row", text: String(c) })
      : h("td", { text: String(c) })))))));
}

function renderStats(box, s) {
  clear(box);
  const parts = s.end_offsets.map((_, p) => [p, s.applied_offsets[p], s.end_offsets[p], s.lag[p]]);
  box.append(
    h("h2", { text: "Log and projection" }),
    table("Partitions", ["partition", "applied offset", "end offset", "lag"], parts),
    h("h2", { text: "Outcomes" }),
    h("dl", { class: "counts" }, COUNTS.filter((k) => k in s).map((k) => [
      h("dt", { text: k.replaceAll("_", " ") }), h("dd", { "data-count": k, text: String(s[k]) })])),
    h("h2", { text: "Poison records" }),
    s.poison.length
      ? table("Records the projector could not apply", ["position", "reason"], s.poison.map((p) => [p.position, p.reason]))
      : h("p", { "data-count": "poison", text: "None" }));
}

// A member's console, as a plain link (never fetched from here); only http(s) URLs become links.
function memberLink(url) {
  return /^https?:\/\//i.test(url) ? h("a", { href: `${url.replace(/\/+$/, "")}/console/`, text: url }) : h("code", { text: url });
}

// Each owner URL with its partitions, and its lag per partition: `members` of /v1/cluster?lag=true
// (this server asks every member's /v1/stats; the page itself talks to this origin only).
function membersOf(cl) {
  const byUrl = new Map();
  for (const [p, url] of Object.entries(cl.owners).sort((a, b) => Number(a[0]) - Number(b[0]))) {
    if (!byUrl.has(url)) byUrl.set(url, { url, partitions: [], lag: null, reachable: null, error: null });
    byUrl.get(url).partitions.push(Number(p));
  }
  for (const m of Array.isArray(cl.members) ? cl.members : []) {
    const known = byUrl.get(m.url);
    if (known) Object.assign(known, { lag: m.lag || {}, reachable: m.reachable === true, error: m.error || null });
  }
  return byUrl;
}

function lagText(m, p) {
  if (m.reachable === false) return "unreachable";
  return m.lag && m.lag[String(p)] !== undefined ? String(m.lag[String(p)]) : "—";
}

function renderCluster(box, cl) {
  clear(box);
  const members = membersOf(cl);
  const owned = new Set(Object.keys(cl.owners).map(Number));
  const unowned = [];
  for (let p = 0; p < (cl.partitions || 0); p++) if (!owned.has(p)) unowned.push(p);
  const urls = [...members.keys()].sort((a, b) => (a === cl.self ? -1 : b === cl.self ? 1 : a.localeCompare(b)));
  box.append(
    h("h2", { text: "Cluster" }),
    h("p", {}, cl.group === null ? "Single server (no --group): it owns every partition." : `Group ${cl.group}, generation ${cl.generation}.`,
      " This server: ", h("code", { text: cl.self || "?" })),
    h("h3", { text: "Members" }),
    h("ul", { class: "members", "aria-label": "Members" }, urls.map((url) => {
      const self = url === cl.self, m = members.get(url), n = m.partitions.length;
      return h("li", { testid: "member", class: self ? "member self" : "member", "data-url": url, "data-self": self ? "true" : "false",
        "data-reachable": m.reachable === null ? null : String(m.reachable) },
        memberLink(url), self ? h("strong", { class: "self-mark", text: " (this server)" }) : null,
        ` — ${n} partition${n === 1 ? "" : "s"}, lag in records not yet applied: `,
        h("ul", { class: "partitions", "aria-label": `Partitions of ${url}` }, m.partitions.map((p) => {
          const lag = m.lag && m.lag[String(p)] !== undefined ? m.lag[String(p)] : null;
          return h("li", { "data-partition": p }, `${p}`,
            lag !== null ? h("span", { class: "lag", "data-lag": lag, text: ` (lag ${lag})` }) : null);
        })),
        m.reachable === false ? h("p", { class: "error", testid: "member-error", text: `Unreachable: ${m.error || "no answer"}` }) : null);
    })),
    h("p", { class: "error", hidden: !unowned.length, "data-unowned": unowned.join(","), text: `Unowned partitions: ${unowned.join(", ")}` }),
    h("p", { class: "dim note", text: "Each member's lag is its own /v1/stats, asked by this server (at most a second each); a member that did not answer is marked unreachable." }),
    table("Partition owners", ["partition", "owner", "lag"], Object.entries(cl.owners)
      .sort((a, b) => Number(a[0]) - Number(b[0]))
      .map(([p, url]) => [p, url === cl.self ? `${url} (this server)` : url, lagText(members.get(url), Number(p))])));
}

export function opsPage(view) {
  let alive = true, timer = null;
  const stats = h("section", { testid: "stats", class: "stats", "aria-label": "Stats" });
  const cluster = h("section", { testid: "cluster", class: "cluster", "aria-label": "Cluster" });
  const status = h("p", { class: "status", role: "status" });
  async function refresh() {
    try {
      const [s, cl] = await Promise.all([api("/v1/stats"), api("/v1/cluster?lag=true")]);
      if (!alive) return;
      renderStats(stats, s);
      renderCluster(cluster, cl);
      status.textContent = `Updated ${new Date().toLocaleTimeString()} (every ${EVERY_MS / 1000} s)`;
    } catch (err) {
      status.textContent = `Could not refresh: ${err.message}`;
    }
    if (alive) timer = setTimeout(refresh, EVERY_MS);
  }
  view.append(h("h1", { text: "Operations" }), status, stats, cluster);
  refresh();
  return { stop() { alive = false; clearTimeout(timer); } };
}
