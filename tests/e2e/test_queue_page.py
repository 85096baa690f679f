"""The dashboard's queue page in headless Chromium (Playwright), on a real scheduler process
(SQLite) with one CPU slot played by an in-process WorkerAgent: one job runs, the others wait
in the round's order with the reason the round gave, their tenant and the simulator's
estimated start; the job page shows the reason too. A screenshot of each page is saved (the
`screenshots` fixture)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gearshift.client.sdk import Client
from gearshift.common.config import merged
from gearshift.v1 import common_pb2
from tests.conftest import DaemonFactory
from tests.e2e.test_dashboard import BROWSER_ARGS
from tests.helpers import scheduler_config, single_seed, wait_until
from tests.integration.test_sched_service import FakeWorker, cpus, spec, workers

__all__ = ["workers"]  # the fixture
WAIT = 60.0


def test_the_queue_page_lists_waiting_jobs_with_position_reason_estimate_and_tenant(
    daemons: DaemonFactory,
    tmp_path: Path,
    chromium: str,
    screenshots: Path,
    workers: list[FakeWorker],
) -> None:
    from playwright.sync_api import expect, sync_playwright

    sections = merged(single_seed("fifo"), {"round": {"seconds": 1, "estimateStartsSeconds": 1}})
    config = scheduler_config(tmp_path, **sections)
    db = f"sqlite:///{tmp_path / 's.db'}"
    address = daemons("scheduler", ["--database-url", db, *config]).address
    workers.append(FakeWorker("w1", address, cpus(1)))
    ready = tmp_path / "dashboard.json"
    dashboard = subprocess.Popen(
        [sys.executable, "-m", "gearshift.client.cli", "dashboard", "--listen", "127.0.0.1:0",
         "--address", address, "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with Client(address) as client:
            first = client.submit(spec("first", 2, max_devices=1, tenant="acme"))
            wait_until(
                lambda: client.get(first.job_id).state == common_pb2.JOB_STATE_RUNNING,
                WAIT,
                "the first job runs",
            )
            waiting = [
                client.submit(spec(name, 2, max_devices=1, tenant=tenant)).job_id
                for name, tenant in (("second", "acme"), ("third", "globex"), ("fourth", "acme"))
            ]
            wait_until(
                lambda: [client.get(j).queue_position for j in waiting] == [1, 2, 3],
                WAIT,
                "the waiting jobs' positions",
            )
        wait_until(ready.exists, WAIT, "the dashboard's ready file")
        base = "http://" + json.loads(ready.read_text())["address"]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=BROWSER_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 520})
            page.set_default_timeout(30_000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(base + "/queue")
            rows = page.locator("#queue tbody tr")
            expect(rows).to_have_count(3)
            for position, job_id in enumerate(waiting, 1):
                row = page.locator(f'tr[data-job="{job_id}"]')
                expect(row.locator("td").first).to_have_text(str(position))
                expect(row).to_have_attribute("data-reason", "no_free_device")
                expect(row).to_contain_text("no free device of an accepted type (cpu: 0 free)")
            expect(page.locator(f'tr[data-job="{waiting[1]}"]')).to_contain_text("globex")
            expect(rows.first.locator(".estimate")).to_contain_text("in ")
            page.screenshot(path=str(screenshots / "queue.png"))
            page.goto(f"{base}/jobs/{waiting[0]}")
            expect(page.locator("#why")).to_contain_text("queue position 1")
            page.screenshot(path=str(screenshots / "job-why.png"))
            browser.close()
        assert errors == []
    finally:
        dashboard.terminate()
        dashboard.wait(30)
