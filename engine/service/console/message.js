// One stored message as an element: role, time, text, tool calls and results, reasoning and
// metadata (collapsed), external id, assets; a hidden (replaced) one struck through with why.
import { fmtTime, h, pretty } from "./dom.js";

function part(p) {
  switch (p.kind) {
    case "text":
      return h("p", { class: "text", text: p.text });
    case "refusal":
      return h("p", { class: "refusal", text: `Refusal: ${p.text}` });
    case "reasoning":
      return h("details", { class: "reasoning" }, h("summary", { text: "Reasoning" }),
        h("pre", { text: p.text || (p.state ? "(opaque provider state)" : "") }));
    case "tool_call":
      return h("div", { class: "tool-call" },
        h("div", { class: "label" }, "Tool call ", h("code", { text: p.name }), " ", h("span", { class: "dim", text: p.id })),
        h("pre", { class: "args", text: pretty(p.arguments) }));
    case "tool_result": {
      const output = p.output || {};
      const content = (output.content || []).map((c) => (c.kind === "text"
        ? h("pre", { text: c.text })
        : h("p", { class: "dim", text: `${c.kind}: ${(c.media && c.media.mime_type) || ""}` })));
      return h("div", { class: p.is_error ? "tool-result error" : "tool-result" },
        h("div", { class: "label" }, p.is_error ? "Tool error " : "Tool result ", h("code", { text: p.name }), " ",
          h("span", { class: "dim", text: p.id })),
        content,
        output.details !== undefined && output.details !== null
          ? h("details", {}, h("summary", { text: "Details" }), h("pre", { text: pretty(output.details) })) : null);
    }
    case "media": {
      const m = p.media || {};
      return h("p", { class: "media" }, "Media ", h("code", { text: m.mime_type || "" }), " ",
        m.name || m.uri || (m.data ? `${Math.floor((m.data.length * 3) / 4)} bytes inline` : ""));
    }
    default:
      return h("pre", { class: "dim", text: pretty(p) });
  }
}

export function position(pos) {
  const [t, s] = pos.split(":");
  return [Number(t), Number(s)];
}

export function messageElement(stored) {
  const m = stored.message;
  const meta = m.metadata || {};
  const el = h("div", { class: `message role-${m.role}`, testid: "message", "data-message-id": stored.id,
    "data-role": m.role, "data-position": stored.position });
  const head = h("div", { class: "head" },
    h("span", { class: "role", text: m.role }), " ",
    h("time", { datetime: stored.created_at, text: fmtTime(stored.created_at) }), " ",
    h("span", { class: "dim pos", title: "position TURN:SEQ", text: stored.position }));
  if (typeof meta.external_id === "string") {
    head.append(" ", h("span", { class: "external", testid: "external-id", title: "external id", text: `ext: ${meta.external_id}` }));
  }
  el.append(head, ...m.parts.map(part));
  if (stored.assets && stored.assets.length) {
    el.append(h("div", { class: "assets" }, h("span", { class: "label", text: "Assets" }),
      h("ul", {}, stored.assets.map((a) => h("li", {},
        h("code", { text: a.content_hash.slice(0, 19) + "…" }), ` ${a.role} #${a.ordinal}`,
        a.mime ? ` ${a.mime}` : "", a.size_bytes != null ? ` ${a.size_bytes} B` : "", a.name ? ` ${a.name}` : "")))));
  }
  if (Object.keys(meta).length) {
    el.append(h("details", { class: "metadata" }, h("summary", { text: "Metadata" }), h("pre", { text: pretty(meta) })));
  }
  el.append(h("div", { class: "dim id", text: `id ${stored.id}` }));
  if (stored.superseded_by) markHidden(el, stored.superseded_by, stored.reason);
  return el;
}

export function markHidden(el, supersededBy, reason) {
  el.classList.add("hidden-msg");
  if (el.querySelector("[data-testid=replaced-by]")) return;
  el.querySelector(".head").after(h("p", { class: "replaced", testid: "replaced-by",
    text: `Replaced (${reason || "replaced"}) by turn ${supersededBy}` }));
}
