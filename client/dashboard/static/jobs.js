// The jobs page: filters (server side), sorting (here), state badges, live refresh.
"use strict";

(() => {
  const { el, api, poll, badge, devicesText, dateTime, number } = Gs;
  const params = new URLSearchParams(location.search);
  const state = { rows: [], sort: params.get("sort") || "submitted_at", desc: params.get("desc") !== "0" };
  for (const name of ["state", "tenant", "name"]) {
    const input = document.getElementById(`f-${name}`);
    input.value = params.get(name) || "";
    input.addEventListener(input.tagName === "SELECT" ? "change" : "input", () => {
      syncUrl();
      refresh().catch((err) => Gs.banner(err.message));
    });
  }
  document.getElementById("filters").addEventListener("submit", (e) => e.preventDefault());
  for (const th of document.querySelectorAll("th.sortable")) {
    th.addEventListener("click", () => {
      const key = th.dataset.key;
      state.desc = state.sort === key ? !state.desc : key === "submitted_at";
      state.sort = key;
      syncUrl();
      render();
    });
  }

  function filters() {
    const out = new URLSearchParams();
    for (const name of ["state", "tenant", "name"]) {
      const value = document.getElementById(`f-${name}`).value.trim();
      if (value) out.set(name, value);
    }
    return out;
  }

  function syncUrl() {
    const query = filters();
    query.set("sort", state.sort);
    query.set("desc", state.desc ? "1" : "0");
    history.replaceState(null, "", `/?${query}`);
  }

  function compare(a, b) {
    const x = a[state.sort], y = b[state.sort];
    const order = typeof x === "number" ? x - y : String(x).localeCompare(String(y));
    return state.desc ? -order : order;
  }

  function render() {
    for (const th of document.querySelectorAll("th.sortable")) {
      th.querySelector(".arrow")?.remove();
      if (th.dataset.key === state.sort) th.append(el("span", { class: "arrow" }, state.desc ? "▼" : "▲"));
    }
    const rows = [...state.rows].sort(compare).map((job) =>
      el(
        "tr",
        { "data-job": job.id, "data-state": job.state },
        el("td", {}, el("a", { href: `/jobs/${encodeURIComponent(job.id)}`, class: "mono" }, job.id)),
        el("td", {}, job.name),
        el("td", {}, job.tenant),
        el("td", {}, badge(job.state)),
        el("td", { class: "num" }, job.total_steps ? `${job.step}/${job.total_steps}` : job.step),
        el("td", {}, devicesText(job.devices)),
        el("td", {}, job.ests_per_device.length ? job.ests_per_device.join(",") : "–"),
        el("td", { class: "num" }, job.samples_per_second ? number(job.samples_per_second) : "–"),
        el("td", { class: "num" }, job.step ? number(job.loss, 4) : "–"),
        el("td", { class: "num" }, job.rescales),
        el("td", { class: "num" }, dateTime(job.submitted_at)),
      ),
    );
    document.querySelector("#jobs tbody").replaceChildren(...rows);
    document.getElementById("none").hidden = rows.length > 0;
  }

  async function refresh() {
    const data = await api(`/api/jobs?${filters()}`);
    state.rows = data.jobs;
    render();
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString([], { hour12: false })}`;
  }

  Gs.header("jobs");
  poll(refresh, 2000);
})();
