// #/api: /openapi.json as a readable reference, one entry per path and method.
import { api } from "./api.js";
import { h } from "./dom.js";

const METHODS = ["get", "put", "post", "delete", "patch"];

function schemaName(schema) {
  if (!schema) return "";
  if (schema.$ref) return schema.$ref.split("/").pop();
  if (schema.type === "array") return `${schemaName(schema.items)}[]`;
  return schema.type || "object";
}

function contentSchemas(content) {
  return Object.entries(content || {}).map(([media, c]) => `${schemaName(c.schema)} (${media})`).join(", ");
}

export function apiPage(view) {
  let alive = true;
  const box = h("div", { testid: "api", class: "api" }, h("p", { class: "status", role: "status", text: "Loading…" }));
  view.append(h("h1", { text: "HTTP API" }), h("p", {}, "From ", h("code", { text: "/openapi.json" }),
    ", the server's own description of its routes."), box);
  api("/openapi.json").then((doc) => {
    if (!alive) return;
    box.replaceChildren(h("p", { class: "dim", text: `${doc.info.title} ${doc.info.version}` }));
    for (const [path, item] of Object.entries(doc.paths)) {
      for (const method of METHODS) {
        const op = item[method];
        if (!op) continue;
        const params = (op.parameters || []).filter((p) => p.in !== "header");
        const body = op.requestBody ? contentSchemas(op.requestBody.content) : "";
        const responses = Object.entries(op.responses || {});
        box.append(h("section", { testid: "api-path", class: "api-path", "data-method": method.toUpperCase(),
          "data-path": path },
          h("h2", {}, h("span", { class: `method m-${method}`, text: method.toUpperCase() }), " ", h("code", { text: path })),
          h("p", { class: "summary", text: op.summary || "" }),
          params.length ? h("table", {}, h("caption", { text: "Parameters" }),
            h("thead", {}, h("tr", {}, ["name", "in", "type", "required", "description"].map((c) => h("th", { scope: "col", text: c })))),
            h("tbody", {}, params.map((p) => h("tr", {}, h("th", { scope: "row" }, h("code", { text: p.name })),
              h("td", { text: p.in }), h("td", { text: schemaName(p.schema) }), h("td", { text: p.required ? "yes" : "no" }),
              h("td", { text: p.description || "" }))))) : null,
          body ? h("p", {}, "Request body: ", h("code", { class: "schema", text: body })) : null,
          h("ul", { class: "responses", "aria-label": "Responses" }, responses.map(([code, r]) => h("li", {},
            h("strong", { text: code }), " ", r.description || "", r.content ? " — " : "",
            r.content ? h("code", { class: "schema", text: contentSchemas(r.content) }) : null)))));
      }
    }
  }, (err) => { box.replaceChildren(h("p", { class: "error", text: `Could not load /openapi.json: ${err.message}` })); });
  return { stop() { alive = false; } };
}
