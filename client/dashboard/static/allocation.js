// The allocation page: every device of the cluster as a lane, a bar for each stretch of
// time a job held it (colored by job or by tenant), over a window that ends now.
"use strict";

(() => {
  const { el, api, poll, duration, clock } = Gs;
  const { svg, frame, timeAxis } = Charts;
  const params = new URLSearchParams(location.search);
  const windowSelect = document.getElementById("window");
  if (params.get("window")) windowSelect.value = params.get("window");
  let colorBy = params.get("color") === "tenant" ? "tenant" : "job";
  document.querySelector(`input[name=color][value=${colorBy}]`).checked = true;
  let latest = null;

  /** One color per key (sorted): the shared palette, then evenly spread hues. */
  function colorsFor(keys) {
    const colors = {};
    [...new Set(keys)].sort().forEach((key, i) => {
      colors[key] = i < Gs.PALETTE.length ? Gs.PALETTE[i] : `hsl(${(i * 137.5) % 360} 55% 50%)`;
    });
    return colors;
  }

  function draw(data) {
    const box = document.getElementById("gantt");
    box.replaceChildren();
    document.getElementById("color-name").textContent = colorBy;
    if (!data.lanes.length) {
      box.append(el("div", { class: "empty" }, "No worker has registered."));
      return;
    }
    const laneHeight = 22;
    const width = 1100, height = 12 + data.lanes.length * laneHeight + 26;
    const f = frame(width, height, { left: 170, right: 16, top: 12, bottom: 26 });
    const root = f.root;
    const sx = timeAxis(f, data.first, data.now, root, true);
    const index = new Map();
    let lastWorker = null;
    data.lanes.forEach((lane, i) => {
      const y = f.y1 + i * laneHeight;
      index.set(`${lane.worker}/${lane.device}`, y);
      if (lane.worker !== lastWorker && i) root.append(svg("line", { class: "axis", x1: 4, x2: f.x1, y1: y, y2: y }));
      lastWorker = lane.worker;
      const label = svg("text", { x: f.x0 - 8, y: y + laneHeight / 2 + 4, "text-anchor": "end", class: lane.alive ? "" : "lost" }, `${lane.worker} · dev ${lane.device} (${lane.type})`);
      root.append(label);
      root.append(svg("line", { class: "gridline", x1: f.x0, x2: f.x1, y1: y + laneHeight, y2: y + laneHeight }));
    });
    const keyOf = (bar) => (colorBy === "job" ? bar.job_id : bar.tenant);
    const colors = colorsFor(data.bars.map(keyOf));
    for (const bar of data.bars) {
      const y = index.get(`${bar.worker_id}/${bar.device_index}`);
      const x0 = sx(bar.start), x1 = sx(bar.end);
      const w = Math.max(x1 - x0, 1.5);
      const rect = svg("rect", { class: "held", x: x0, y: y + 2, width: w, height: laneHeight - 4, rx: 2, fill: colors[keyOf(bar)], "data-job": bar.job_id, "data-tenant": bar.tenant, "data-device": `${bar.worker_id}/${bar.device_index}` });
      rect.append(svg("title", {}, `${bar.name} (${bar.job_id}) · tenant ${bar.tenant} · rank ${bar.rank}, ${bar.ests} EST${bar.ests === 1 ? "" : "s"} · ${clock(bar.start)} for ${duration(bar.end - bar.start)}${bar.open ? " (still held)" : ""}`));
      root.append(rect);
      const text = colorBy === "job" ? bar.name : bar.tenant;
      if (w > 7 * text.length + 10) root.append(svg("text", { x: x0 + 5, y: y + laneHeight / 2 + 4, style: "fill:#fff;font-weight:600" }, text));
    }
    root.append(svg("line", { x1: f.x1, x2: f.x1, y1: f.y1, y2: f.y0, stroke: "#888", "stroke-dasharray": "3 3" }));
    box.append(root);
    const names = colorBy === "job" ? (key) => `${(data.jobs[key] || {}).name || key} (${key})` : (key) => key;
    box.append(el("div", { class: "legend" }, Object.entries(colors).map(([key, color]) => el("span", { "data-key": key }, el("span", { class: "swatch", style: `background:${color}` }), names(key)))));
  }

  async function refresh() {
    const data = await api(`/api/allocation?window=${encodeURIComponent(windowSelect.value)}`);
    latest = data;
    const jobs = new Set(data.bars.map((b) => b.job_id)).size;
    const held = data.bars.filter((b) => b.open).length;
    document.getElementById("summary").textContent =
      `${data.lanes.length} devices (${data.capacity} on alive workers) · ${held} held now · ${jobs} job${jobs === 1 ? "" : "s"} in the last ${duration(data.now - data.since)}` +
      (data.first > data.since ? ` (the first from ${clock(data.first)})` : "");
    document.getElementById("truncated").hidden = !data.truncated;
    draw(data);
    document.getElementById("updated").textContent = `updated ${clock(data.now)}`;
  }

  function remember() {
    const query = new URLSearchParams({ window: windowSelect.value, color: colorBy });
    history.replaceState(null, "", `${location.pathname}?${query}`);
  }

  windowSelect.addEventListener("change", () => { remember(); refresh().catch((err) => Gs.banner(err.message)); });
  for (const input of document.querySelectorAll("input[name=color]")) {
    input.addEventListener("change", () => {
      colorBy = input.value;
      remember();
      if (latest) draw(latest);
    });
  }
  Gs.header("allocation");
  poll(refresh, 5000);
})();
