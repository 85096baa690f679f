// Gearshift dashboard: helpers every page uses (no library: plain DOM and fetch).
"use strict";

const Gs = (() => {
  /** An element with attributes and children; strings become text nodes (never HTML). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  class ApiError extends Error {
    constructor(message, status, code) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  /** GET or POST JSON; a 401 sends the browser to the login page. */
  async function api(path, options = {}) {
    const init = { headers: { Accept: "application/json" }, credentials: "same-origin" };
    if (options.body !== undefined) {
      init.method = "POST";
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      throw new ApiError("the dashboard server is not answering", 0, "NETWORK");
    }
    let data = {};
    try {
      data = await response.json();
    } catch (err) {
      data = { error: `HTTP ${response.status}` };
    }
    if (response.status === 401 && !options.noLoginRedirect) {
      const next = encodeURIComponent(location.pathname + location.search);
      location.href = `/login?next=${next}&why=${encodeURIComponent(data.error || "")}`;
      throw new ApiError(data.error || "login needed", 401, "UNAUTHENTICATED");
    }
    if (!response.ok) throw new ApiError(data.error || `HTTP ${response.status}`, response.status, data.code);
    return data;
  }

  function banner(message) {
    const node = document.getElementById("banner");
    if (!node) return;
    node.textContent = message || "";
    node.className = message ? "banner error" : "banner";
  }

  /** Run `fn` now and every `ms` after it finishes; errors show in the banner. */
  function poll(fn, ms) {
    let timer = null;
    async function tick() {
      try {
        await fn();
        banner("");
      } catch (err) {
        if (err.status !== 401) banner(err.message);
      }
      timer = setTimeout(tick, ms);
    }
    tick();
    return () => clearTimeout(timer);
  }

  function badge(state) {
    return el("span", { class: `badge ${state}`, "data-state": state }, state);
  }

  function devicesText(devices) {
    const parts = Object.entries(devices || {}).map(([type, n]) => `${type}×${n}`);
    return parts.length ? parts.join(" ") : "–";
  }

  function clock(seconds) {
    if (!seconds) return "–";
    return new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
  }

  function dateTime(seconds) {
    if (!seconds) return "–";
    const d = new Date(seconds * 1000);
    return `${d.toLocaleDateString()} ${d.toLocaleTimeString([], { hour12: false })}`;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
    const s = Math.max(0, Math.round(seconds));
    if (s < 120) return `${s}s`;
    if (s < 7200) return `${Math.floor(s / 60)}m ${s % 60}s`;
    return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  }

  function number(value, digits = 1) {
    if (value === null || value === undefined || !isFinite(value)) return "–";
    return Number(value).toFixed(digits);
  }

  /** The top bar: navigation, who we are connected to, login state. */
  async function header(active) {
    const bar = document.getElementById("top");
    if (!bar) return;
    const who = el("span", { class: "who" }, "");
    bar.replaceChildren(
      el("a", { class: "brand", href: "/" }, "Gearshift"),
      el(
        "nav",
        {},
        el("a", { href: "/", class: active === "jobs" ? "active" : "" }, "Jobs"),
        el("a", { href: "/queue", class: active === "queue" ? "active" : "" }, "Queue"),
        el("a", { href: "/cluster", class: active === "cluster" ? "active" : "" }, "Cluster"),
        el("a", { href: "/allocation", class: active === "allocation" ? "active" : "" }, "Allocation"),
        el("a", { href: "/tenants", class: active === "tenants" ? "active" : "" }, "Tenants"),
      ),
      who,
    );
    try {
      const me = await api("/api/whoami");
      const logout = el(
        "button",
        {
          onclick: async () => {
            await api("/api/logout", { body: {} });
            location.href = "/login";
          },
        },
        "Log out",
      );
      who.append(`scheduler ${me.scheduler}`);
      if (me.token === "cookie") who.append(logout);
    } catch (err) {
      who.append("");
    }
  }

  const PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"];
  /** One color per accelerator type, stable across pages (sorted type names). */
  function typeColors(types) {
    const colors = {};
    [...new Set(types)].sort().forEach((type, i) => (colors[type] = PALETTE[i % PALETTE.length]));
    return colors;
  }

  return { el, api, ApiError, banner, poll, badge, devicesText, clock, dateTime, duration, number, header, typeColors, PALETTE };
})();
