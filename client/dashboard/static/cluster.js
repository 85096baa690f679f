// The cluster page: workers (alive or lost), each device and the job on it, placements.
"use strict";

(() => {
  const { el, api, poll, badge, devicesText, duration } = Gs;

  function worker(w, now, colors) {
    const devices = w.devices.map((d) =>
      el(
        "div",
        { class: d.job ? "device busy" : "device", "data-device": `${w.id}/${d.index}` },
        el("div", { class: "type" }, el("span", { class: "swatch", style: `display:inline-block;width:8px;height:8px;border-radius:2px;margin-right:5px;background:${colors[d.type]}` }), `dev ${d.index} · ${d.type}`),
        d.job
          ? el("div", { class: "job" }, el("a", { href: `/jobs/${encodeURIComponent(d.job)}`, title: d.job }, d.name || d.job), ` rank ${d.rank}, ${d.ests} EST${d.ests === 1 ? "" : "s"}`)
          : el("div", { class: "job empty" }, "idle"),
      ),
    );
    return el(
      "div",
      { class: w.alive ? "worker" : "worker lost", "data-worker": w.id },
      el(
        "div",
        { class: "head" },
        el("span", { class: "name" }, w.id),
        badge(w.alive ? "alive" : "lost"),
        ...(w.degraded ? [" ", el("span", { title: w.degraded }, badge("degraded"))] : []),
      ),
      el("div", { class: "meta mono" }, `${w.address} · heartbeat ${duration(now - w.last_heartbeat_at)} ago`),
      el("div", { class: "devices" }, devices),
    );
  }

  async function refresh() {
    const data = await api("/api/cluster");
    const now = Date.now() / 1000;
    const lost = data.workers.filter((w) => !w.alive).length;
    document.getElementById("policy").textContent =
      `policy ${data.policy} · round ${data.round} (${data.round_seconds}s) · ${data.workers.length} workers` + (lost ? `, ${lost} lost` : "");
    const colors = Gs.typeColors(data.workers.flatMap((w) => w.devices.map((d) => d.type)));
    const workers = data.workers.map((w) => worker(w, now, colors));
    document.getElementById("workers").replaceChildren(...(workers.length ? workers : [el("div", { class: "empty" }, "No worker has registered.")]));
    const rows = data.allocations.map((a) =>
      el(
        "tr",
        { "data-job": a.job },
        el("td", {}, el("a", { href: `/jobs/${encodeURIComponent(a.job)}`, class: "mono" }, a.job)),
        el("td", {}, a.name),
        el("td", {}, devicesText(a.devices)),
        el("td", {}, a.placement.map((p) => `${p.rank} → ${p.worker} · ${p.device} (${p.ests.length})`).join("; ")),
      ),
    );
    document.querySelector("#allocations tbody").replaceChildren(...rows);
    document.getElementById("idle").hidden = rows.length > 0;
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString([], { hour12: false })}`;
  }

  Gs.header("cluster");
  poll(refresh, 2000);
})();
