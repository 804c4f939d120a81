// The console's hash router: #/conversations (default), #/c/<url-encoded id>, #/ops, #/api.
import { clear, h } from "./dom.js";
import { conversationsPage } from "./conversations.js";
import { conversationPage } from "./conversation.js";
import { opsPage } from "./ops.js";
import { apiPage } from "./apiref.js";

const view = document.getElementById("view");
let current = null; // the page on screen: { stop() }

function route() {
  const hash = location.hash || "#/conversations";
  if (current && current.stop) current.stop();
  current = null;
  clear(view);
  let nav = "conversations";
  try {
    if (hash.startsWith("#/c/")) {
      current = conversationPage(view, decodeURIComponent(hash.slice(4)));
    } else if (hash === "#/ops") {
      nav = "ops";
      current = opsPage(view);
    } else if (hash === "#/api") {
      nav = "api";
      current = apiPage(view);
    } else {
      current = conversationsPage(view);
    }
  } catch (err) {
    view.append(h("p", { class: "error", role: "alert", text: String(err.message || err) }));
  }
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.testid === `nav-${nav}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

window.addEventListener("hashchange", route);
route();
