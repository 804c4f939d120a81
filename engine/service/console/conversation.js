// #/c/<id>: one conversation, newest first; older pages on scroll; live updates over SSE;
// replaced turns on demand; locate by external id; clear with confirmation.
import { ApiError, api, enc, stream } from "./api.js";
import { clear, h } from "./dom.js";
import { markHidden, messageElement, position } from "./message.js";

const PAGE = 100;

export function conversationPage(view, c) {
  performance.clearMarks("histlog:conversation:start");
  performance.mark("histlog:conversation:start");
  const base = `/v1/conversations/${enc(c)}`;
  let alive = true, loading = null, atStart = false, oldest = null, newest = null, events = null, closed = false;
  let first = true;
  const turns = h("div", { testid: "turns", class: "turns", "aria-label": "Turns, newest first" });
  const byId = new Map(); // message id -> element
  const byTurn = new Map(); // turn number -> article
  const status = h("p", { class: "status", role: "status" });
  const older = h("button", { type: "button", testid: "load-older", class: "load-older", text: "Load older messages" });
  const start = h("p", { testid: "history-start", class: "history-start", text: "Start of the conversation", hidden: true });
  const hiddenBox = h("input", { type: "checkbox", id: "show-hidden", testid: "show-hidden" });
  const locateInput = h("input", { id: "locate-input", testid: "locate-input", type: "text", autocomplete: "off" });
  const locateGo = h("button", { type: "submit", testid: "locate-go", text: "Locate" });
  const clearButton = h("button", { type: "button", testid: "clear", class: "danger", text: "Clear conversation…" });
  const banner = h("p", { testid: "closed-banner", class: "closed-banner", role: "alert", hidden: true,
    text: "This conversation is closed: it was cleared and accepts no more messages." });

  function turnArticle(t) {
    let article = byTurn.get(t);
    if (article) return article;
    article = h("article", { testid: "turn", class: "turn", "data-turn": String(t), "aria-label": `Turn ${t}` },
      h("h2", { class: "turn-head", text: `Turn ${t}` }));
    byTurn.set(t, article);
    // keep articles ordered newest turn first
    const after = [...turns.children].find((a) => Number(a.dataset.turn) < t);
    turns.insertBefore(article, after || null);
    return article;
  }

  function place(stored) {
    if (byId.has(stored.id)) return byId.get(stored.id);
    const [t, s] = position(stored.position);
    const article = turnArticle(t);
    const el = messageElement(stored);
    byId.set(stored.id, el);
    const later = [...article.querySelectorAll("[data-testid=message]")].find(
      (m) => position(m.dataset.position)[1] > s);
    article.insertBefore(el, later || null);
    // a turn's id is its user message's id (HistoryTurn.id); else the first message seen of it
    if (stored.message.role === "user" && !stored.superseded_by) article.dataset.turnId = stored.id;
    else if (!article.dataset.turnId) article.dataset.turnId = stored.id;
    if (newest === null || compare(stored.position, newest) > 0) newest = stored.position;
    return el;
  }

  function compare(a, b) {
    const [x, y] = position(a), [u, v] = position(b);
    return x - u || y - v;
  }

  function drop(id) {
    const el = byId.get(id);
    if (!el) return;
    byId.delete(id);
    const article = el.closest("article");
    el.remove();
    if (article && !article.querySelector("[data-testid=message]")) {
      byTurn.delete(Number(article.dataset.turn));
      article.remove();
    }
  }

  function showClosed() {
    closed = true;
    banner.hidden = false;
    clearButton.disabled = true;
    older.hidden = true;
    status.textContent = "";
  }

  async function loadOlder() {
    if (loading) return loading;
    if (atStart || closed) return null;
    loading = (async () => {
      const q = new URLSearchParams({ order: "desc", limit: String(PAGE) });
      if (oldest !== null) q.set("before", oldest);
      if (hiddenBox.checked) q.set("include_hidden", "true");
      status.textContent = "Loading…";
      try {
        const page = await api(`${base}/messages?${q}`);
        if (!alive) return;
        for (const stored of page.messages) place(stored);
        if (page.messages.length) oldest = page.messages[page.messages.length - 1].position;
        if (page.messages.length < PAGE) {
          atStart = true;
          older.hidden = true;
          start.hidden = false;
        }
        status.textContent = `${byId.size} messages loaded`;
        if (first) {
          first = false;
          void turns.offsetHeight; // layout included
          await new Promise((resolve) => requestAnimationFrame(() => resolve()));
          performance.mark("histlog:conversation:first-page");
          const m = performance.measure("histlog:conversation:render", "histlog:conversation:start",
            "histlog:conversation:first-page");
          window.__histlog = { ...(window.__histlog || {}), firstPageMs: m.duration, firstPageMessages: page.messages.length };
          listen();
        }
      } catch (err) {
        if (err instanceof ApiError && err.status === 410) showClosed();
        else if (err instanceof ApiError && err.status === 404) status.textContent = `No conversation ${c}`;
        else status.textContent = `Could not read messages: ${err.message}`;
      } finally {
        loading = null;
      }
      if (alive && !atStart && nearBottom()) queueMicrotask(loadOlder);
    })();
    return loading;
  }

  function nearBottom() {
    const r = older.getBoundingClientRect();
    return !older.hidden && r.top < window.innerHeight + 200;
  }

  function reset() {
    clear(turns);
    byId.clear();
    byTurn.clear();
    atStart = false;
    oldest = null;
    older.hidden = false;
    start.hidden = true;
  }

  function listen() {
    if (events || closed) return;
    const q = new URLSearchParams({ after: newest || "0:0" });
    events = stream(`${base}/events?${q}`, (name, data) => {
      if (!alive) return "stop";
      if (name === "message") {
        if (!byId.has(data.id)) place(data);
      } else if (name === "replaced") {
        for (const id of data.hidden) {
          const el = byId.get(id);
          if (!el) continue;
          if (hiddenBox.checked) markHidden(el, data.superseded_by, data.reason);
          else drop(id);
        }
      } else if (name === "deleted") {
        for (const id of data.ids) drop(id);
      } else if (name === "closed") {
        showClosed();
        return "stop";
      }
      return undefined;
    });
  }

  async function locate(x) {
    locateStatus.textContent = "Looking…";
    try {
      const found = await api(`${base}/external/${enc(x)}`);
      const id = found.message.id;
      while (!byId.has(id) && !atStart && alive) {
        const before = byId.size;
        await loadOlder();
        if (byId.size === before) break;
      }
      const el = byId.get(id);
      for (const old of turns.querySelectorAll(".highlight")) old.classList.remove("highlight");
      if (!el) {
        locateStatus.textContent = `Message ${id} is not shown`;
        return;
      }
      el.classList.add("highlight");
      el.scrollIntoView({ block: "center" });
      locateStatus.textContent = `Found ${id} at ${found.message.position}`;
    } catch (err) {
      locateStatus.textContent = err instanceof ApiError && err.status === 404
        ? `No message with external id “${x}”` : `Could not locate: ${err.message}`;
    }
  }

  // the clear dialog: the id must be typed before the button is enabled
  const confirmInput = h("input", { id: "clear-confirm-input", testid: "clear-confirm-input", type: "text",
    autocomplete: "off" });
  const confirmButton = h("button", { type: "submit", testid: "clear-confirm", class: "danger", disabled: true,
    text: "Clear forever" });
  const clearError = h("p", { class: "error", role: "alert" });
  const dialog = h("dialog", { testid: "clear-dialog", "aria-labelledby": "clear-title" },
    h("form", { method: "dialog", onsubmit: async (e) => {
      e.preventDefault();
      if (confirmInput.value !== c) return;
      confirmButton.disabled = true;
      try {
        await api(base, { method: "DELETE" });
        dialog.close();
        showClosed();
      } catch (err) {
        clearError.textContent = `Could not clear: ${err.message}`;
        confirmButton.disabled = false;
      }
    } },
    h("h2", { id: "clear-title", text: "Clear this conversation?" }),
    h("p", {}, "Clearing ", h("code", { class: "conv-name", text: c }),
      " closes it forever and erases its messages. This cannot be undone."),
    h("label", { for: "clear-confirm-input", text: "Type the conversation id to confirm" }), confirmInput, clearError,
    h("div", { class: "actions" },
      h("button", { type: "button", onclick: () => dialog.close(), text: "Cancel" }), confirmButton)));
  confirmInput.addEventListener("input", () => { confirmButton.disabled = confirmInput.value !== c; });
  clearButton.addEventListener("click", () => {
    confirmInput.value = "";
    confirmButton.disabled = true;
    clearError.textContent = "";
    dialog.showModal();
    confirmInput.focus();
  });

  const locateStatus = h("span", { class: "status", role: "status" });
  hiddenBox.addEventListener("change", () => { reset(); loadOlder(); });
  older.addEventListener("click", () => loadOlder());
  const observer = new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting)) loadOlder();
  }, { rootMargin: "0px 0px 200px 0px" });
  observer.observe(older);

  view.append(
    h("p", { class: "crumbs" }, h("a", { href: "#/conversations", text: "← Conversations" })),
    h("h1", {}, "Conversation ", h("code", { testid: "conversation-id", text: c })),
    banner,
    h("div", { class: "toolbar" },
      h("div", { class: "field check" }, hiddenBox, h("label", { for: "show-hidden", text: "Show replaced turns" })),
      h("form", { class: "locate", onsubmit: (e) => { e.preventDefault(); if (locateInput.value) locate(locateInput.value); } },
        h("label", { for: "locate-input", text: "Locate by external id" }), locateInput, locateGo, locateStatus),
      clearButton),
    status, turns, older, start, dialog);
  loadOlder();
  return {
    stop() {
      alive = false;
      observer.disconnect();
      if (events) events.stop();
      if (dialog.open) dialog.close();
    },
  };
}
