// #/ops: /v1/stats (offsets, lag, outcome counts, poison, erased) and /v1/cluster (each
// partition's owner, and each member with its partitions and a link to its own console),
// refreshed every few seconds. Only this server is asked: other members' lag is on their consoles.
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

function lagOf(s, p) {
  return s && Array.isArray(s.lag) && s.lag[p] !== undefined ? s.lag[p] : null;
}

function renderCluster(box, cl, s) {
  clear(box);
  const members = new Map(); // owner URL -> its partitions, in order
  for (const [p, url] of Object.entries(cl.owners).sort((a, b) => Number(a[0]) - Number(b[0]))) {
    if (!members.has(url)) members.set(url, []);
    members.get(url).push(Number(p));
  }
  const owned = new Set(Object.keys(cl.owners).map(Number));
  const unowned = [];
  for (let p = 0; p < (cl.partitions || 0); p++) if (!owned.has(p)) unowned.push(p);
  const urls = [...members.keys()].sort((a, b) => (a === cl.self ? -1 : b === cl.self ? 1 : a.localeCompare(b)));
  const lagCell = (p, url) => (url === cl.self && lagOf(s, p) !== null ? lagOf(s, p) : "—");
  box.append(
    h("h2", { text: "Cluster" }),
    h("p", {}, cl.group === null ? "Single server (no --group): it owns every partition." : `Group ${cl.group}, generation ${cl.generation}.`,
      " This server: ", h("code", { text: cl.self || "?" })),
    h("h3", { text: "Members" }),
    h("ul", { class: "members", "aria-label": "Members" }, urls.map((url) => {
      const self = url === cl.self;
      return h("li", { testid: "member", class: self ? "member self" : "member", "data-url": url, "data-self": self ? "true" : "false" },
        memberLink(url), self ? h("strong", { class: "self-mark", text: " (this server)" }) : null,
        ` — ${members.get(url).length} partition${members.get(url).length === 1 ? "" : "s"}: `,
        h("ul", { class: "partitions", "aria-label": `Partitions of ${url}` }, members.get(url).map((p) => h("li", { "data-partition": p },
          `${p}`, self && lagOf(s, p) !== null ? h("span", { class: "lag", "data-lag": lagOf(s, p), text: ` (lag ${lagOf(s, p)})` }) : null))));
    })),
    h("p", { class: "error", hidden: !unowned.length, "data-unowned": unowned.join(","), text: `Unowned partitions: ${unowned.join(", ")}` }),
    h("p", { class: "dim note", text: "Lag is shown for this server's partitions only: other members' lag is not available from this page, open a member's console for its lag." }),
    table("Partition owners", ["partition", "owner", "lag"], Object.entries(cl.owners)
      .map(([p, url]) => [p, url === cl.self ? `${url} (this server)` : url, lagCell(Number(p), url)])));
}

export function opsPage(view) {
  let alive = true, timer = null;
  const stats = h("section", { testid: "stats", class: "stats", "aria-label": "Stats" });
  const cluster = h("section", { testid: "cluster", class: "cluster", "aria-label": "Cluster" });
  const status = h("p", { class: "status", role: "status" });
  async function refresh() {
    try {
      const [s, cl] = await Promise.all([api("/v1/stats"), api("/v1/cluster")]);
      if (!alive) return;
      renderStats(stats, s);
      renderCluster(cluster, cl, s);
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
