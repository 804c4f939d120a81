// #/conversations: open conversations in lexical pages of 50 (the listing's after/limit), by prefix.
import { api, enc } from "./api.js";
import { clear, h } from "./dom.js";

const PAGE = 50;
const state = { prefix: "", pages: [null] }; // pages: the `after` of each page seen, the last is on screen

export function conversationsPage(view) {
  let alive = true;
  const prefix = h("input", { id: "prefix", testid: "prefix", type: "search", value: state.prefix,
    placeholder: "e.g. support/", autocomplete: "off" });
  const list = h("ul", { testid: "conversation-list", class: "conversations" });
  const status = h("p", { class: "status", role: "status" });
  const prev = h("button", { type: "button", testid: "page-prev", text: "Previous page" });
  const next = h("button", { type: "button", testid: "page-next", text: "Next page" });
  const openId = h("input", { id: "open-id", testid: "open-id", type: "text", autocomplete: "off" });
  const openGo = h("button", { type: "submit", testid: "open-go", text: "Open" });
  let nextAfter = null;

  async function load() {
    const after = state.pages[state.pages.length - 1];
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (state.prefix) q.set("prefix", state.prefix);
    if (after !== null) q.set("after", after);
    prev.disabled = next.disabled = true;
    status.textContent = "Loading…";
    try {
      const page = await api(`/v1/conversations?${q}`);
      if (!alive) return;
      nextAfter = page.next;
      clear(list);
      for (const id of page.conversations) {
        const count = h("span", { testid: "count", class: "count", text: "…" });
        list.append(h("li", { "data-id": id },
          h("a", { href: `#/c/${enc(id)}`, text: id }), " ", count, h("span", { class: "sr", text: " messages" })));
        api(`/v1/conversations/${enc(id)}/measure`).then(
          (m) => { count.textContent = String(m.messages); count.title = `${m.messages} messages, ${m.turns} turns`; },
          () => { count.textContent = "?"; });
      }
      const n = state.pages.length;
      status.textContent = page.conversations.length
        ? `Page ${n}: ${page.conversations.length} conversation${page.conversations.length === 1 ? "" : "s"}`
        : "No open conversations" + (state.prefix ? ` starting with “${state.prefix}”` : "");
      status.dataset.page = String(n);
      prev.disabled = n <= 1;
      next.disabled = nextAfter === null;
    } catch (err) {
      status.textContent = `Could not list conversations: ${err.message}`;
      status.classList.add("error");
    }
  }

  let typing = null;
  prefix.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.prefix = prefix.value; state.pages = [null]; load(); }, 200);
  });
  next.addEventListener("click", () => { if (nextAfter !== null) { state.pages.push(nextAfter); load(); } });
  prev.addEventListener("click", () => { if (state.pages.length > 1) { state.pages.pop(); load(); } });
  const openForm = h("form", { class: "open", onsubmit: (e) => {
    e.preventDefault();
    if (openId.value) location.hash = `#/c/${enc(openId.value)}`;
  } }, h("label", { for: "open-id", text: "Open a conversation by id" }), openId, openGo);

  view.append(
    h("h1", { text: "Conversations" }),
    h("div", { class: "toolbar" },
      h("div", { class: "field" }, h("label", { for: "prefix", text: "Filter by id prefix" }), prefix), openForm),
    status, list, h("div", { class: "pager" }, prev, next));
  load();
  return { stop() { alive = false; clearTimeout(typing); } };
}
