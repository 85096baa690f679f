// The tenants page: each tenant's guarantee (its quota), its share of the cluster's alive
// devices now and over the window, and its devices over time against its guarantee.
"use strict";

(() => {
  const { el, api, poll, duration, clock, number, devicesText } = Gs;
  const params = new URLSearchParams(location.search);
  const windowSelect = document.getElementById("window");
  if (params.get("window")) windowSelect.value = params.get("window");

  const percent = (x) => (x === null || x === undefined ? "–" : `${number(100 * x, 0)}%`);

  /** A step series ([time, n] holding until the next point) as a line's corners. */
  function steps(series) {
    return series.flatMap((p, i) => (i ? [[p[0], series[i - 1][1]], p] : [p]));
  }

  function row(t) {
    return el(
      "tr",
      { "data-tenant": t.tenant },
      el("td", {}, t.tenant),
      el("td", {}, t.guarantee ? `${devicesText(t.quota)} (${percent(t.guarantee_share)})` : "none (best effort)"),
      el("td", { class: "num" }, String(t.held)),
      el("td", { class: "num" }, percent(t.share)),
      el("td", { class: "num" }, `${percent(t.mean_share)} (${number(t.mean_held, 1)} devices)`),
      el("td", { class: "num" }, String(t.peak_held)),
      el("td", { class: "num" }, t.guarantee ? String(t.guaranteed_devices) : "–"),
      el("td", { class: "num" }, `${t.running_jobs} / ${t.queued_jobs}`),
    );
  }

  function chart(t, data, color) {
    const box = el("div", { class: "chart" });
    // Nothing was held before data.first: the series is drawn from there.
    const shown = [[data.first, 0], ...t.use.filter((p) => p[0] >= data.first)];
    const series = [{ name: `${t.tenant}: devices held`, color, points: steps(shown) }];
    if (t.guarantee) series.push({ name: "guarantee", color: "#555", dash: "5 4", points: [[data.first, t.guarantee], [data.now, t.guarantee]] });
    const panel = el("div", { class: "panel", "data-tenant": t.tenant }, el("h2", {}, `${t.tenant}: devices over time`), box);
    Charts.lineChart(box, series, { start: data.first, end: data.now, clock: true, dots: false, yLabel: "devices", digits: 0, legend: true, empty: "no device held" });
    return panel;
  }

  async function refresh() {
    const data = await api(`/api/tenants?window=${encodeURIComponent(windowSelect.value)}`);
    const colors = {};
    data.tenants.forEach((t, i) => (colors[t.tenant] = Gs.PALETTE[i % Gs.PALETTE.length]));
    document.getElementById("summary").textContent =
      `${data.tenants.length} tenant${data.tenants.length === 1 ? "" : "s"} · ${data.capacity} devices on alive workers · the last ${duration(data.now - data.since)}`;
    document.querySelector("#tenants tbody").replaceChildren(...data.tenants.map(row));
    document.getElementById("none").hidden = data.tenants.length > 0;
    document.getElementById("truncated").hidden = !data.truncated;
    document.getElementById("charts").replaceChildren(...data.tenants.map((t) => chart(t, data, colors[t.tenant])));
    document.getElementById("updated").textContent = `updated ${clock(data.now)}`;
  }

  windowSelect.addEventListener("change", () => {
    history.replaceState(null, "", `${location.pathname}?window=${windowSelect.value}`);
    refresh().catch((err) => Gs.banner(err.message));
  });
  Gs.header("tenants");
  poll(refresh, 5000);
})();
