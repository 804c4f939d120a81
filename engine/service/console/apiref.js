// #/api: /openapi.json as a readable reference, one entry per path and method: its summary,
// parameters, the fields of its request body and 200 response schemas ($refs into
// components.schemas resolved one level deep) and any examples the document gives.
import { api } from "./api.js";
import { h, pretty } from "./dom.js";

const METHODS = ["get", "put", "post", "delete", "patch"];
const REF = "#/components/schemas/";

function refName(ref) {
  return ref.split("/").pop();
}

function schemaName(schema) {
  if (!schema) return "";
  if (schema.$ref) return refName(schema.$ref);
  if (schema.type === "array") return `${schemaName(schema.items)}[]`;
  return schema.type || "object";
}

// A field's type in one line: refs by name, unions with |, arrays as T[], consts and enums by value.
function typeOf(schema) {
  if (!schema || typeof schema !== "object") return "any";
  if (schema.$ref) return refName(schema.$ref);
  if (schema.anyOf || schema.oneOf) return (schema.anyOf || schema.oneOf).map(typeOf).join(" | ");
  if (schema.allOf) return schema.allOf.map(typeOf).join(" & ");
  if ("const" in schema) return JSON.stringify(schema.const);
  if (Array.isArray(schema.enum)) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  const types = Array.isArray(schema.type) ? schema.type : [schema.type || (schema.properties ? "object" : "any")];
  return types.map((t) => {
    if (t === "array") return `${typeOf(schema.items)}[]`;
    if (t === "object" && schema.additionalProperties && typeof schema.additionalProperties === "object") {
      return `{[key]: ${typeOf(schema.additionalProperties)}}`;
    }
    return schema.format ? `${t} (${schema.format})` : t;
  }).join(" | ");
}

// One level of $ref: a schema of components.schemas (or an array of one) by name and body.
function resolve(doc, schema) {
  const schemas = (doc.components && doc.components.schemas) || {};
  const lookup = (s) => (s && typeof s.$ref === "string" && s.$ref.startsWith(REF) ? schemas[refName(s.$ref)] || null : null);
  if (!schema) return { name: "", target: null, array: false };
  if (schema.$ref) return { name: refName(schema.$ref), target: lookup(schema), array: false };
  if (schema.type === "array" && schema.items && schema.items.$ref) {
    return { name: refName(schema.items.$ref), target: lookup(schema.items), array: true };
  }
  return { name: "", target: schema, array: schema.type === "array" };
}

function examplesOf(...holders) {
  const out = [];
  for (const x of holders) {
    if (!x || typeof x !== "object") continue;
    if ("example" in x) out.push({ label: "", value: x.example });
    if (Array.isArray(x.examples)) for (const v of x.examples) out.push({ label: "", value: v });
    else if (x.examples && typeof x.examples === "object") {
      for (const [name, e] of Object.entries(x.examples)) {
        if (e && typeof e === "object" && "value" in e) out.push({ label: e.summary || name, value: e.value });
        else if (e && typeof e === "object" && e.externalValue) out.push({ label: e.summary || name, value: e.externalValue });
      }
    }
  }
  return out;
}

// A query or path parameter's example(s), after its description.
function paramExample(p) {
  const ex = examplesOf(p, p.schema).map((e) => JSON.stringify(e.value)).join(", ");
  return ex ? h("span", { class: "dim", "data-example": "", text: `${p.description ? " " : ""}e.g. ${ex}` }) : null;
}

function exampleBlocks(list) {
  return list.map((e) => h("div", { class: "example", testid: "api-example" },
    h("p", { class: "label", text: e.label ? `Example: ${e.label}` : "Example" }),
    h("pre", { text: pretty(e.value) })));
}

function fieldsTable(target) {
  const required = new Set(Array.isArray(target.required) ? target.required : []);
  const props = Object.entries(target.properties || {});
  return h("table", { class: "fields" }, h("caption", { text: "Fields" }),
    h("thead", {}, h("tr", {}, ["field", "type", "required", "description"].map((c) => h("th", { scope: "col", text: c })))),
    h("tbody", {}, props.map(([name, p]) => {
      const ex = examplesOf(p).map((e) => JSON.stringify(e.value)).join(", ");
      return h("tr", { "data-field": name }, h("th", { scope: "row" }, h("code", { text: name })),
        h("td", {}, h("code", { text: typeOf(p) })), h("td", { text: required.has(name) ? "yes" : "no" }),
        h("td", {}, (p && p.description) || "", ex ? h("span", { class: "dim", text: `${p && p.description ? " " : ""}e.g. ${ex}` }) : null));
    })));
}

// One block per media type of a request body or a 200 response: schema name, description, fields, examples.
function schemaBlocks(doc, kind, title, content) {
  return Object.entries(content || {}).map(([media, c]) => {
    const { name, target, array } = resolve(doc, c && c.schema);
    const label = name ? `${name}${array ? "[]" : ""}` : typeOf(c && c.schema);
    const hasFields = target && target.properties && Object.keys(target.properties).length;
    return h("div", { testid: "api-schema", class: "api-schema", "data-kind": kind, "data-media": media, "data-schema": name || null },
      h("h3", {}, `${title}: `, h("code", { class: "schema", text: label }), ` (${media})`),
      target && target.description ? h("p", { class: "dim description", text: target.description }) : null,
      hasFields ? fieldsTable(target)
        : h("p", { class: "dim", text: target ? `Type: ${typeOf(target)}` : "No schema given." }),
      exampleBlocks(examplesOf(c, c && c.schema, target && target !== (c && c.schema) ? target : null)));
  });
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
        const responses = Object.entries(op.responses || {});
        const ok = op.responses && op.responses["200"];
        box.append(h("section", { testid: "api-path", class: "api-path", "data-method": method.toUpperCase(),
          "data-path": path },
          h("h2", {}, h("span", { class: `method m-${method}`, text: method.toUpperCase() }), " ", h("code", { text: path })),
          h("p", { class: "summary", text: op.summary || "" }),
          params.length ? h("table", {}, h("caption", { text: "Parameters" }),
            h("thead", {}, h("tr", {}, ["name", "in", "type", "required", "description"].map((c) => h("th", { scope: "col", text: c })))),
            h("tbody", {}, params.map((p) => h("tr", {}, h("th", { scope: "row" }, h("code", { text: p.name })),
              h("td", { text: p.in }), h("td", { text: schemaName(p.schema) }), h("td", { text: p.required ? "yes" : "no" }),
              h("td", {}, p.description || "", paramExample(p)))))) : null,
          op.requestBody ? schemaBlocks(doc, "request", op.requestBody.required ? "Request body (required)" : "Request body",
            op.requestBody.content) : null,
          ok && ok.content ? schemaBlocks(doc, "response", "200 response", ok.content) : null,
          h("ul", { class: "responses", "aria-label": "Responses" }, responses.map(([code, r]) => h("li", {},
            h("strong", { text: code }), " ", r.description || "", r.content ? " — " : "",
            r.content ? h("code", { class: "schema", text: Object.entries(r.content)
              .map(([media, c]) => `${schemaName(c.schema)} (${media})`).join(", ") }) : null)))));
      }
    }
  }, (err) => { box.replaceChildren(h("p", { class: "error", text: `Could not load /openapi.json: ${err.message}` })); });
  return { stop() { alive = false; } };
}
