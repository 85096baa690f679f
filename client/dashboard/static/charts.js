// Gearshift dashboard: small SVG charts (line charts and the placement timeline).
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, text) {
    const node = document.createElementNS(NS, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  /** Round tick values covering [low, high]. */
  function ticks(low, high, count) {
    if (!(high > low)) return [low];
    const raw = (high - low) / count;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(low / step) * step; v <= high + 1e-9; v += step) out.push(+v.toFixed(10));
    return out;
  }

  function frame(width, height, margin) {
    const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
    return { root, x0: margin.left, x1: width - margin.right, y0: height - margin.bottom, y1: margin.top };
  }

  /** A time axis over [start, end]: labels are durations from start, or clock times. */
  function timeAxis(f, start, end, root, clockLabels) {
    const sx = (t) => f.x0 + ((t - start) / Math.max(end - start, 1e-9)) * (f.x1 - f.x0);
    for (const t of ticks(0, end - start, 6)) {
      const x = sx(start + t);
      root.append(svg("line", { class: "gridline", x1: x, x2: x, y1: f.y1, y2: f.y0 }));
      root.append(svg("text", { x, y: f.y0 + 14, "text-anchor": "middle" }, clockLabels ? Gs.clock(start + t) : Gs.duration(t)));
    }
    root.append(svg("line", { class: "axis", x1: f.x0, x2: f.x1, y1: f.y0, y2: f.y0 }));
    return sx;
  }

  /** A numeric x axis over [start, end] (steps): round ticks, integer labels. */
  function stepAxis(f, start, end, root) {
    const sx = (v) => f.x0 + ((v - start) / Math.max(end - start, 1e-9)) * (f.x1 - f.x0);
    for (const v of ticks(start, end, 6)) {
      const x = sx(v);
      root.append(svg("line", { class: "gridline", x1: x, x2: x, y1: f.y1, y2: f.y0 }));
      root.append(svg("text", { x, y: f.y0 + 14, "text-anchor": "middle" }, String(Math.round(v))));
    }
    root.append(svg("line", { class: "axis", x1: f.x0, x2: f.x1, y1: f.y0, y2: f.y0 }));
    return sx;
  }

  /**
   * A line chart over time (or over steps: options.xAxis "step"). series: [{name, color,
   * points: [[x, value], ...]}], a null value is a gap; options: {start, end, yLabel, digits}.
   */
  function lineChart(container, series, options) {
    const width = 560, height = 210;
    const f = frame(width, height, { left: 52, right: 12, top: 12, bottom: 26 });
    const root = f.root;
    const values = series.flatMap((s) => s.points.map((p) => p[1])).filter((v) => isFinite(v));
    container.replaceChildren();
    if (!values.length) {
      container.append(Gs.el("div", { class: "empty" }, options.empty || "no data yet"));
      return;
    }
    let low = Math.min(0, ...values), high = Math.max(...values);
    if (high === low) high = low + 1;
    high += (high - low) * 0.05;
    const start = options.start, end = Math.max(options.end, start + 1);
    const sx = (options.xAxis === "step" ? stepAxis : timeAxis)(f, start, end, root, options.clock);
    const sy = (v) => f.y0 - ((v - low) / (high - low)) * (f.y0 - f.y1);
    for (const v of ticks(low, high, 4)) {
      const y = sy(v);
      root.append(svg("line", { class: "gridline", x1: f.x0, x2: f.x1, y1: y, y2: y }));
      root.append(svg("text", { x: f.x0 - 6, y: y + 4, "text-anchor": "end" }, Gs.number(v, options.digits ?? 2)));
    }
    root.append(svg("line", { class: "axis", x1: f.x0, x2: f.x0, y1: f.y1, y2: f.y0 }));
    root.append(svg("text", { class: "label", x: 12, y: (f.y0 + f.y1) / 2, transform: `rotate(-90 12 ${(f.y0 + f.y1) / 2})`, "text-anchor": "middle" }, options.yLabel || ""));
    for (const s of series) {
      if (!s.points.length) continue;
      let gap = true;
      const d = s.points.map((p) => {
        if (p[1] === null || !isFinite(p[1])) return (gap = true), "";
        const move = gap ? "M" : "L";
        gap = false;
        return `${move}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`;
      }).filter(Boolean).join(" ");
      const attrs = { d, fill: "none", stroke: s.color, "stroke-width": options.thin ? 1.25 : 2, "data-series": s.name, "data-points": s.points.length };
      if (s.dash) attrs["stroke-dasharray"] = s.dash;
      root.append(svg("path", attrs));
      for (const p of s.points.length < 60 && options.dots !== false ? s.points.filter((q) => q[1] !== null) : []) {
        root.append(svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: s.color }));
      }
    }
    container.append(root);
    if (series.length > 1 || options.legend) {
      container.append(Gs.el("div", { class: "legend" }, series.map((s) => Gs.el("span", {}, Gs.el("span", { class: "swatch", style: `background:${s.color}` }), s.name))));
    }
  }

  /**
   * The job's placements over time: one lane per device it ran on, a bar per placement
   * colored by type and labelled with the ESTs it held, a dashed line at each rescale.
   */
  function placementTimeline(container, view) {
    container.replaceChildren();
    const segments = view.segments;
    if (!segments.length) {
      container.append(Gs.el("div", { class: "empty" }, "not placed yet"));
      return;
    }
    const lanes = new Map();
    for (const seg of segments) {
      for (const slot of seg.slots) {
        const key = `${slot.worker_id}/${slot.device_index}`;
        if (!lanes.has(key)) lanes.set(key, { key, worker: slot.worker_id, device: slot.device_index, type: slot.accelerator_type });
      }
    }
    const order = [...lanes.values()].sort((a, b) => (a.type + a.worker).localeCompare(b.type + b.worker) || a.device - b.device);
    const laneHeight = 26;
    const width = 1100, height = 40 + order.length * laneHeight + 26;
    const f = frame(width, height, { left: 150, right: 16, top: 26, bottom: 26 });
    const root = f.root;
    const start = view.start, end = Math.max(view.end, start + 1);
    const sx = timeAxis(f, start, end, root);
    const colors = Gs.typeColors(order.map((l) => l.type));
    order.forEach((lane, i) => {
      lane.y = f.y1 + i * laneHeight;
      root.append(svg("text", { x: f.x0 - 8, y: lane.y + laneHeight / 2 + 4, "text-anchor": "end" }, `${lane.worker} · dev ${lane.device} (${lane.type})`));
      root.append(svg("line", { class: "gridline", x1: f.x0, x2: f.x1, y1: lane.y + laneHeight, y2: lane.y + laneHeight }));
    });
    segments.forEach((seg, index) => {
      const x0 = sx(seg.start), x1 = sx(seg.end ?? end);
      for (const slot of seg.slots) {
        const lane = lanes.get(`${slot.worker_id}/${slot.device_index}`);
        const w = Math.max(x1 - x0, 1.5);
        const bar = svg("rect", { class: "placement", x: x0, y: lane.y + 3, width: w, height: laneHeight - 6, rx: 3, fill: colors[lane.type], "data-segment": index, "data-type": lane.type });
        bar.append(svg("title", {}, `${lane.type} rank ${slot.rank}: ${slot.ests} EST${slot.ests === 1 ? "" : "s"}, ${Gs.duration((seg.end ?? end) - seg.start)}`));
        root.append(bar);
        if (w > 44) root.append(svg("text", { x: x0 + 6, y: lane.y + laneHeight / 2 + 4, fill: "#fff", style: "fill:#fff;font-weight:600" }, `${slot.ests} EST${slot.ests === 1 ? "" : "s"}`));
      }
    });
    for (const t of view.rescales) {
      const x = sx(t);
      root.append(svg("line", { class: "rescale-marker", x1: x, x2: x, y1: f.y1 - 14, y2: f.y0, stroke: "#c6362f", "stroke-width": 1.5, "stroke-dasharray": "4 3" }));
      const left = x > f.x1 - 60; // near the right edge: label on the line's left
      root.append(svg("text", { class: "rescale-label", x: left ? x - 3 : x + 3, y: f.y1 - 4, "text-anchor": left ? "end" : "start", style: "fill:#c6362f" }, "rescale"));
    }
    container.append(root);
    container.append(Gs.el("div", { class: "legend" }, Object.entries(colors).map(([type, color]) => Gs.el("span", {}, Gs.el("span", { class: "swatch", style: `background:${color}` }), type))));
  }

  return { lineChart, placementTimeline, svg, frame, timeAxis, ticks };
})();
