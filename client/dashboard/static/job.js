// A job's page: where it ran over time, its curves, events, plan changes, log tail, cancel.
"use strict";

(() => {
  const { el, api, poll, badge, devicesText, clock, dateTime, duration, number } = Gs;
  const jobId = decodeURIComponent(location.pathname.split("/").pop());
  let latest = null;

  document.getElementById("title").textContent = `Job ${jobId}`;
  document.title = `${jobId} · Gearshift`;

  function kv(pairs) {
    return pairs.flatMap(([key, value]) => [el("dt", {}, key), el("dd", {}, value)]);
  }

  function whyText(job, now) {
    const r = job.reason;
    const parts = [r.message];
    if (job.queue_position) parts.push(`queue position ${job.queue_position}`);
    if (r.estimated_start) {
      const left = r.estimated_start - now;
      parts.push(left > 0 ? `estimated start in ${duration(left)}` : "estimated start now");
    }
    return el("span", { id: "why", "data-reason": r.code }, parts.join(" · "));
  }

  function renderSummary(view) {
    const job = view.job;
    document.getElementById("state").replaceChildren(badge(job.state));
    document.getElementById("subtitle").textContent =
      `${job.name} · tenant ${job.tenant} · ${job.entrypoint} · ${job.num_ests} ESTs, elastic ${job.elastic[0]}..${job.elastic[1]} devices · ${job.determinism}`;
    document.getElementById("cancel").hidden = job.terminal;
    const ran = (job.finished_at || view.now) - (job.started_at || view.now);
    document.getElementById("summary").replaceChildren(
      ...kv([
        ["state", job.message ? `${job.state}: ${job.message}` : job.state],
        ...(job.reason ? [["why", whyText(job, view.now)]] : []),
        ["step", job.total_steps ? `${job.step} of ${job.total_steps}` : String(job.step)],
        ["loss", job.step ? number(job.loss, 4) : "–"],
        ["samples/s", job.samples_per_second ? number(job.samples_per_second) : "–"],
        ["devices", devicesText(job.devices)],
        ["ESTs per device", job.ests_per_device.length ? job.ests_per_device.join(", ") : "–"],
        ["rescales", String(job.rescales)],
        ["submitted", dateTime(job.submitted_at)],
        ["running for", job.started_at ? duration(ran) : "not started"],
        ["digest", job.digest ? el("code", {}, job.digest) : "–"],
      ]),
    );
  }

  function renderPlacements(view) {
    Charts.placementTimeline(document.getElementById("timeline"), view);
    const rows = [...view.segments].reverse().map((seg) =>
      el(
        "tr",
        {},
        el("td", {}, clock(seg.start)),
        el("td", {}, duration((seg.end ?? view.end) - seg.start) + (seg.end === null ? " (now)" : "")),
        el("td", {}, devicesText(seg.devices)),
        el("td", {}, seg.ests_per_device.join(", ")),
        el("td", {}, [...new Set(seg.slots.map((s) => s.worker_id))].join(", ")),
      ),
    );
    document.querySelector("#placements tbody").replaceChildren(...rows);
  }

  function renderCurves(view) {
    const start = view.start, end = view.end;
    const progress = view.progress;
    const curve = view.loss_curve;
    const steps = curve.points.map((p) => p[0]);
    Charts.lineChart(
      document.getElementById("loss"),
      [{ name: "loss", color: "#e45756", points: curve.points }],
      { xAxis: "step", start: Math.min(0, ...steps), end: Math.max(1, ...steps), yLabel: "loss", digits: 3, thin: curve.source === "steps", empty: "no step run yet" },
    );
    const note = document.getElementById("loss-note");
    note.textContent = curve.note;
    note.dataset.source = curve.source;
    const brain = view.brain && view.brain.samples && view.brain.samples.length ? view.brain.samples : null;
    const points = brain ? brain.map((s) => [s.time, s.samples_per_second]) : progress.map((p) => [p.time, p.samples_per_second]);
    document.getElementById("sps-title").textContent = brain ? "Samples/s (the Brain's samples)" : "Samples/s";
    Charts.lineChart(
      document.getElementById("sps"),
      [{ name: "samples/s", color: "#4c78a8", points }],
      { start, end, yLabel: "samples/s", digits: 0, empty: "no progress reported yet" },
    );
  }

  function renderEvents(view) {
    const rows = [...view.events].reverse().slice(0, 60).map((e) =>
      el(
        "tr",
        { "data-type": e.type },
        el("td", { class: "num" }, e.sequence),
        el("td", {}, clock(e.time)),
        el("td", {}, e.type),
        el("td", {}, badge(e.state)),
        el("td", {}, [
          e.message,
          Object.keys(e.devices).length ? ` ${devicesText(e.devices)} · ESTs ${e.ests_per_device.join(",")}` : "",
          e.type === "progress" ? `step ${e.step}, loss ${number(e.loss, 4)}, ${number(e.samples_per_second)} samples/s` : "",
        ].filter(Boolean).join(" ")),
      ),
    );
    document.querySelector("#events tbody").replaceChildren(...rows);
    const plans = view.plan_changes.map((e) => el("div", {}, `${clock(e.time)} ${e.type}: ${e.message}`));
    document.getElementById("plans").replaceChildren(...(plans.length ? plans : [el("div", { class: "empty" }, "none recorded")]));
    const brain = view.brain;
    let text = "no Brain address given to the dashboard (--brain)";
    if (brain && brain.error) text = `not available: ${brain.error}`;
    else if (brain) text = `status ${brain.status || "unknown"} · ${brain.samples.length} runtime samples · ${brain.plans} plans issued`;
    document.getElementById("brain").replaceChildren(el("div", { class: brain && !brain.error ? "" : "empty" }, text));
  }

  async function refresh() {
    const view = await api(`/api/jobs/${encodeURIComponent(jobId)}/view`);
    latest = view;
    renderSummary(view);
    renderPlacements(view);
    renderCurves(view);
    renderEvents(view);
    document.getElementById("updated").className = view.job.terminal ? "live ended" : "live";
    document.getElementById("updated").textContent = view.job.terminal
      ? `ended ${clock(view.job.finished_at)}`
      : `updated ${clock(view.now)}`;
  }

  async function refreshLogs() {
    const box = document.getElementById("logs");
    const data = await api(`/api/jobs/${encodeURIComponent(jobId)}/logs?lines=200`);
    if (!data.available) {
      box.replaceChildren(el("div", { class: "logs-note", id: "logs-note" }, data.message));
      return;
    }
    const text = data.lines.map((l) => `[rank ${l.rank}] ${l.text}`).join("\n");
    const pre = el("pre", { class: "logs" }, text || "(no output yet)");
    box.replaceChildren(pre);
    pre.scrollTop = pre.scrollHeight;
  }

  const modal = document.getElementById("confirm");
  document.getElementById("cancel").addEventListener("click", () => {
    const job = latest && latest.job;
    document.getElementById("confirm-text").textContent =
      `${jobId}${job ? ` (${job.name})` : ""} stops at once and ends CANCELLED; this cannot be undone.`;
    modal.classList.add("open");
  });
  document.getElementById("confirm-no").addEventListener("click", () => modal.classList.remove("open"));
  document.getElementById("confirm-yes").addEventListener("click", async () => {
    const button = document.getElementById("confirm-yes");
    button.disabled = true;
    try {
      await api(`/api/jobs/${encodeURIComponent(jobId)}/cancel`, { body: { reason: "cancelled from the dashboard" } });
      modal.classList.remove("open");
      await refresh();
    } catch (err) {
      modal.classList.remove("open");
      Gs.banner(`cancel failed: ${err.message}`);
    } finally {
      button.disabled = false;
    }
  });

  Gs.header("jobs");
  poll(refresh, 2000);
  poll(refreshLogs, 4000);
})();
