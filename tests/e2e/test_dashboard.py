"""The web dashboard and the metrics on a live `gearshift up` cluster (one start, several checks),
pages driven in Debian's headless Chromium by Playwright.

With a job running: `curl` of every daemon's metrics shows non-zero RPC counters (and the
scheduler's job gauge), parsed with prometheus_client's parser; the pages ask for the token
(a wrong one is refused with a clear message); the jobs page lists the running job; the
job page's timeline shows a rescale once one happened, and its loss curve every step of
the job's step log; the cluster page shows the devices, the allocation page each job's
devices over time across the workers (by job and by tenant), the tenants page each
tenant's share and use; the cancel button, after its confirmation, cancels the job; the
JSON endpoints answer as documented; `gearshift job ID --plot` writes the job's PNG.
Screenshots of every page are saved (see the `screenshots` fixture)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gearshift.client.demo import cnn_spec, other_spec
from gearshift.client.devcluster import ClusterConfig, DevCluster, parse_workers
from gearshift.client.sdk import Client
from gearshift.v1 import common_pb2
from tests.helpers import wait_until
from tests.unit.test_plots import assert_real_png

TOKEN = "dashboard-e2e-token"
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--no-first-run",
]
DAEMONS = ("scheduler", "brain", "shardmanager", "worker-1", "worker-2")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[DevCluster]:
    config = ClusterConfig(
        run_dir=tmp_path / "cluster", base_port=0, workers=parse_workers("v100:2,t4:2"),
        round_seconds=2.0, heartbeat_interval=0.5, heartbeat_timeout=5.0, token=TOKEN,
        dashboard="127.0.0.1:0", log_level="warning",
    )  # fmt: skip
    with DevCluster(config) as started:
        yield started


def scrape(url: str) -> dict[str, Any]:
    """A metrics endpoint read the way a person would (curl when installed), parsed."""
    if shutil.which("curl"):
        text = subprocess.run(
            ["curl", "--silent", "--fail", "--max-time", "10", url],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    else:
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def total(families: dict[str, Any], name: str, sample: str = "", **labels: str) -> float:
    """The sum of a family's samples (its `name_total`, or `name + sample`) with these labels."""
    family = families.get(name)
    if family is None:
        return 0.0
    names = (name + sample,) if sample else (name, name + "_total")
    return float(
        sum(
            s.value
            for s in family.samples
            if s.name in names and labels.items() <= s.labels.items()
        )
    )


def http(base: str, path: str, *, token: str | None = TOKEN, body: Any = None) -> tuple[int, Any]:
    request = urllib.request.Request(base + path, method="POST" if body is not None else "GET")
    if token is not None:
        request.add_header("Cookie", f"gearshift_token={token}")
    data = None
    if body is not None:
        request.add_header("Content-Type", "application/json")
        data = json.dumps(body).encode()
    try:
        with urllib.request.urlopen(request, data, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def check_metrics(cluster: DevCluster, job_id: str) -> None:
    urls = cluster.metrics_urls()
    assert set(urls) == set(DAEMONS)

    def ready() -> bool:
        brain = scrape(urls["brain"])
        return total(brain, "gearshift_brain_samples_ingested") > 0

    wait_until(ready, 60, "the Brain ingested no sample of the running job")
    for name, url in urls.items():
        families = scrape(url)
        handled = total(families, "gearshift_rpc_handled")
        assert handled > 0, f"{name}: no RPC counted at {url}"
        assert "gearshift_rpc_duration_seconds" in families, name
    # A rescale (the Brain's first measurements can move it) shows the job as moving a while.
    wait_until(
        lambda: total(scrape(urls["scheduler"]), "gearshift_jobs", state="running") >= 1,
        60,
        "the scheduler's metrics never counted the job as running",
    )
    scheduler = scrape(urls["scheduler"])
    assert total(scheduler, "gearshift_rpc_handled", method="SubmitJob", code="OK") >= 1
    assert total(scheduler, "gearshift_devices_allocated") >= 1
    assert total(scheduler, "gearshift_scheduler_round_duration_seconds", "_count") >= 1
    assert total(scrape(urls["shardmanager"]), "gearshift_shard_transitions", kind="created") >= 1
    started = sum(total(scrape(urls[w]), "gearshift_worker_tasks_started") for w in DAEMONS[3:])
    assert started >= 1


def check_api(base: str, job_id: str) -> None:
    status, body = http(base, "/api/jobs", token=None)
    assert status == 401 and "refused the token" in body["error"], body
    status, body = http(base, "/api/login", token=None, body={"token": "wrong"})
    assert status == 401 and body["code"] == "UNAUTHENTICATED", body

    def listed() -> bool:
        status, body = http(base, "/api/jobs?state=running")
        assert status == 200 and all(j["state"] == "running" for j in body["jobs"]), body
        return job_id in [j["id"] for j in body["jobs"]]

    wait_until(listed, 60, "the running job never listed under state=running")
    status, body = http(base, "/api/jobs?state=sleepy")
    assert status == 400 and "unknown state 'sleepy'" in body["error"], body
    status, body = http(base, "/api/jobs?limit=0")
    assert status == 400 and body["error"].startswith("limit:"), body
    status, body = http(base, "/api/jobs/job-nope")
    assert status == 404 and body["code"] == "NOT_FOUND", body
    status, view = http(base, f"/api/jobs/{job_id}/view")
    assert status == 200 and view["job"]["id"] == job_id
    assert view["segments"] and view["segments"][0]["slots"], view["segments"]
    assert view["events"][0]["type"] == "submitted"
    assert view["brain"] is not None and "error" not in view["brain"], view["brain"]
    curve = view["loss_curve"]
    assert curve["source"] == "steps" and curve["steps"] >= 20, curve["note"]
    assert curve["points"][-1] == curve["last"] and curve["last"][0] == curve["steps"]

    def step_lines() -> list[str]:
        status, logs = http(base, f"/api/jobs/{job_id}/logs?lines=20")
        assert status == 200 and logs["available"], logs
        return [line["text"] for line in logs["lines"] if line["text"].startswith("step ")]

    wait_until(step_lines, 60, "the job's step lines in its log tail")
    status, state = http(base, "/api/cluster")
    assert status == 200 and len(state["workers"]) == 2
    assert [a["job"] for a in state["allocations"]] == [job_id]
    status, body = http(base, "/api/allocation?window=59")
    assert status == 400 and body["error"].startswith("window:"), body
    status, body = http(base, "/api/jobs/job-nope/cancel", body={})
    assert status == 404, body


@pytest.mark.slow
def test_dashboard_and_metrics_on_a_live_cluster(
    cluster: DevCluster, chromium: str, screenshots: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import FloatRect, expect, sync_playwright

    base = cluster.dashboard_url.rstrip("/")
    with Client(cluster.address("scheduler"), TOKEN) as client:
        # Long enough not to finish before the test cancels it at the end.
        job = client.submit(cnn_spec(60000))
        wait_until(
            lambda: client.get(job.job_id).progress.step >= 20, 120, "the CNN never ran 20 steps"
        )
        check_metrics(cluster, job.job_id)
        check_api(base, job.job_id)

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=BROWSER_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(60_000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            # The token, entered once: a wrong one is refused with a clear message.
            page.goto(base + "/")
            page.wait_for_url("**/login?**")
            page.fill("#token", "not-the-token")
            page.click("#submit")
            expect(page.locator("#error")).to_contain_text("the scheduler refused the token")
            page.screenshot(path=str(screenshots / "1-login-refused.png"), full_page=True)
            page.fill("#token", TOKEN)
            page.click("#submit")
            page.wait_for_url(base + "/")

            # The jobs page lists the running job.
            row = page.locator(f'tr[data-job="{job.job_id}"]')
            expect(row.locator(".badge")).to_have_text("running")
            expect(row).to_contain_text("digits-cnn")
            page.screenshot(path=str(screenshots / "2-jobs.png"), full_page=True)

            # A job that needs 2 devices arrives: the CNN shrinks to 2 (a rescale).
            takes_two = other_spec("takes-two", 2, 300)
            takes_two.tenant = "team-b"
            other = client.submit(takes_two)
            wait_until(
                lambda: client.get(job.job_id).rescale_count >= 1, 120, "the CNN never shrank"
            )
            page.goto(f"{base}/jobs/{job.job_id}")
            expect(page.locator("#timeline .rescale-label").first).to_be_visible()
            assert page.locator("#timeline line.rescale-marker").count() >= 1
            expect(page.locator("#placements tbody tr")).to_have_count(2)
            client.wait(other.job_id, timeout=180)
            # It grows back, or keeps the devices DeepPool's burst plan measured to help on
            # this host (two processes on a 2-core host): the page shows what it did.
            at = client.get(job.job_id).progress.step
            wait_until(lambda: client.get(job.job_id).progress.step >= at + 150, 120, "no progress")
            rescales = client.get(job.job_id).rescale_count
            expect(page.locator("#timeline .rescale-label")).to_have_count(rescales)
            expect(page.locator("#placements tbody tr")).to_have_count(rescales + 1)
            expect(page.locator("#events tbody")).to_contain_text("rescaled")
            # The loss curve is the step log's: every step, far more than the progress events.
            loss = page.locator("#loss path[data-series='loss']")
            expect(page.locator("#loss-note")).to_have_attribute("data-source", "steps")
            assert int(loss.get_attribute("data-points") or 0) > 100
            page.locator("#loss").screenshot(path=str(screenshots / "3-job-loss.png"))
            page.wait_for_selector("#logs > *")
            page.screenshot(path=str(screenshots / "3-job-rescaled.png"), full_page=True)
            top = FloatRect(x=0, y=0, width=1280, height=1180)  # down to the curves
            page.screenshot(
                path=str(screenshots / "3-job-rescaled-top.png"), clip=top, full_page=True
            )

            # The cluster: workers, devices, which job runs where.
            page.goto(base + "/cluster")
            expect(page.locator(".worker")).to_have_count(2)
            expect(page.locator(f'tr[data-job="{job.job_id}"]')).to_be_visible()
            expect(page.locator(".device.busy").first).to_be_visible()
            page.screenshot(path=str(screenshots / "4-cluster.png"), full_page=True)

            # The allocation over time: both jobs' bars across the workers, by job and by
            # tenant; the tenants page: each tenant's share and devices over time.
            page.goto(base + "/allocation?window=900")
            for held in (job.job_id, other.job_id):
                expect(page.locator(f'#gantt rect.held[data-job="{held}"]').first).to_be_visible()
            page.screenshot(path=str(screenshots / "4-allocation-by-job.png"), full_page=True)
            page.check("input[name=color][value=tenant]")
            expect(page.locator('#gantt .legend [data-key="team-b"]')).to_be_visible()
            page.screenshot(path=str(screenshots / "4-allocation-by-tenant.png"), full_page=True)
            page.goto(base + "/tenants?window=900")
            expect(page.locator('#tenants tr[data-tenant="team-b"]')).to_be_visible()
            expect(
                page.locator('#charts [data-tenant="default"] path[data-series]')
            ).to_be_visible()
            page.screenshot(path=str(screenshots / "4-tenants.png"), full_page=True)

            # The cancel button asks first, then cancels.
            page.goto(f"{base}/jobs/{job.job_id}")
            page.click("#cancel")
            expect(page.locator("#confirm")).to_have_class("modal-back open")
            page.screenshot(path=str(screenshots / "5-cancel-confirm.png"))
            page.click("#confirm-yes")
            expect(page.locator("#state .badge")).to_have_text("cancelled")
            expect(page.locator("#cancel")).to_be_hidden()
            page.screenshot(path=str(screenshots / "6-job-cancelled.png"), full_page=True)
            browser.close()
            assert errors == [], errors

        final = client.get(job.job_id)
        assert final.state == common_pb2.JOB_STATE_CANCELLED
        assert final.message == "cancelled from the dashboard"

    scheduler = scrape(cluster.metrics_urls()["scheduler"])
    assert total(scheduler, "gearshift_scheduler_rescales") >= 1
    assert total(scheduler, "gearshift_jobs", state="cancelled") == 1
    assert total(scheduler, "gearshift_rpc_handled", method="CancelJob", code="OK") == 1

    plot = tmp_path / "job.png"
    result = subprocess.run(
        [sys.executable, "-m", "gearshift.client.cli", "job", job.job_id, "--plot", str(plot),
         "--address", cluster.address("scheduler"), "--token", TOKEN],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"plot written to {plot}" in result.stdout
    assert_real_png(plot, min_size=(600, 400))
    shutil.copy(plot, screenshots / "7-job-plot.png")
