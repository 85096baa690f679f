// The queue page: waiting jobs by position, their reason, since when, estimated start.
"use strict";

(() => {
  const { el, api, poll, duration } = Gs;

  function estimate(reason, now) {
    if (!reason || !reason.estimated_start) return "–";
    const left = reason.estimated_start - now;
    return left > 0 ? `in ${duration(left)}` : "now";
  }

  function render(data) {
    const rows = data.jobs.map((job) =>
      el(
        "tr",
        { "data-job": job.id, "data-reason": job.reason ? job.reason.code : "" },
        el("td", { class: "num" }, job.position ? String(job.position) : "–"),
        el("td", {}, el("a", { href: `/jobs/${encodeURIComponent(job.id)}`, class: "mono" }, job.id)),
        el("td", {}, job.name),
        el("td", {}, job.tenant),
        el(
          "td",
          {},
          job.reason
            ? [el("span", { class: "badge" }, job.reason.code), " ", job.reason.message]
            : "not yet seen by a round",
        ),
        el("td", {}, job.reason && job.reason.since ? `${duration(data.now - job.reason.since)} ago` : "–"),
        el("td", { class: "estimate" }, estimate(job.reason, data.now)),
      ),
    );
    document.querySelector("#queue tbody").replaceChildren(...rows);
    document.getElementById("none").hidden = rows.length > 0;
  }

  async function refresh() {
    render(await api("/api/queue"));
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString([], { hour12: false })}`;
  }

  Gs.header("queue");
  poll(refresh, 2000);
})();
