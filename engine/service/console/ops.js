// #/ops: /v1/stats (offsets, lag, outcome counts, poison, erased) and /v1/cluster (each
// partition's owner), refreshed every few seconds.
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

function renderCluster(box, cl) {
  clear(box);
  box.append(
    h("h2", { text: "Cluster" }),
    h("p", {}, cl.group === null ? "Single server (no --group): it owns every partition." : `Group ${cl.group}, generation ${cl.generation}.`,
      " This server: ", h("code", { text: cl.self || "?" })),
    table("Partition owners", ["partition", "owner"], Object.entries(cl.owners).map(([p, url]) => [p, url])));
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
