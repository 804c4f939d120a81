// The console's one way to the server: same-origin fetch with the bearer token from
// sessionStorage. A 401 opens the token dialog; the call is retried with the token entered.

const KEY = "histlog-token";
let prompting = null;

export const enc = (id) => encodeURIComponent(id);

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem && problem.detail ? `${problem.title || status}: ${problem.detail}` : `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function token() {
  return sessionStorage.getItem(KEY);
}

function headers(extra = {}) {
  const t = token();
  return t ? { ...extra, Authorization: `Bearer ${t}` } : { ...extra };
}

export function askToken() {
  if (prompting) return prompting;
  const dialog = document.getElementById("token-dialog");
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  input.value = "";
  prompting = new Promise((resolve) => {
    const done = (event) => {
      event.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      sessionStorage.setItem(KEY, value);
      form.removeEventListener("submit", done);
      dialog.close();
      prompting = null;
      resolve(value);
    };
    form.addEventListener("submit", done);
  });
  dialog.addEventListener("cancel", (event) => event.preventDefault(), { once: true });
  if (!dialog.open) dialog.showModal();
  input.focus();
  return prompting;
}

// fetch(path) with the token; on 401 ask for a token and try again (as long as the user keeps answering).
export async function send(path, options = {}) {
  for (;;) {
    const response = await fetch(path, { ...options, headers: headers(options.headers), credentials: "omit" });
    if (response.status !== 401) return response;
    await response.body?.cancel();
    await askToken();
  }
}

export async function api(path, options = {}) {
  const response = await send(path, options);
  if (response.status === 204) return null;
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

// Server-sent events over fetch (an EventSource cannot send the Authorization header).
// onEvent(name, data, id) per event; reconnects with Last-Event-ID until stop() is called.
export function stream(path, onEvent, { lastId = null, onOpen = null } = {}) {
  let stopped = false;
  let controller = null;
  let last = lastId;
  (async () => {
    let delay = 250;
    while (!stopped) {
      controller = new AbortController();
      try {
        const extra = last ? { "Last-Event-ID": last } : {};
        const response = await send(path, { headers: extra, signal: controller.signal });
        if (!response.ok) throw new Error(`events: HTTP ${response.status}`);
        if (onOpen) onOpen();
        delay = 250;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        let name = "message", data = [], id = null;
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let nl;
          while ((nl = buffer.indexOf("\n")) >= 0) {
            const line = buffer.slice(0, nl).replace(/\r$/, "");
            buffer = buffer.slice(nl + 1);
            if (line === "") {
              if (data.length) {
                if (id !== null) last = id;
                const ended = onEvent(name, JSON.parse(data.join("\n")), id);
                if (ended === "stop") stopped = true;
              }
              name = "message"; data = []; id = null;
            } else if (line.startsWith(":")) {
              continue;
            } else {
              const colon = line.indexOf(":");
              const field = colon < 0 ? line : line.slice(0, colon);
              const val = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
              if (field === "event") name = val;
              else if (field === "data") data.push(val);
              else if (field === "id") id = val;
            }
          }
          if (stopped) break;
        }
      } catch (err) {
        if (stopped || err.name === "AbortError") return;
      }
      if (stopped) return;
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 5000);
    }
  })();
  return { stop() { stopped = true; if (controller) controller.abort(); } };
}
