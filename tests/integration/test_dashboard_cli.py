"""`gearshift dashboard` as a process, without a scheduler: pages and assets are served from the
package, the API says clearly that the scheduler is not answering, a stop is a clean exit,
and an address it cannot use is a clear error."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.helpers import wait_until


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_serves_pages_and_reports_an_unreachable_scheduler(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "gearshift.client.cli", "dashboard", "--listen", "127.0.0.1:0",
         "--address", "127.0.0.1:1", "--rpc-timeout", "2", "--ready-file", str(ready)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_until(ready.exists, 60, "the dashboard never wrote its ready file")
        base = "http://" + json.loads(ready.read_text())["address"]
        wait_until(lambda: _get(base + "/healthz")[0] == 200, 30, "no /healthz")
        status, page = _get(base + "/")
        assert status == 200 and "<title>Jobs · Gearshift</title>" in page
        assert '<script src="/static/jobs.js"></script>' in page
        for asset in ("app.js", "charts.js", "jobs.js", "job.js", "cluster.js", "app.css"):
            assert _get(f"{base}/static/{asset}")[0] == 200, asset
        assert "cdn" not in page.lower() and "https://" not in page
        status, body = _get(base + "/api/jobs")
        assert status == 503, body
        error = json.loads(body)
        assert error["code"] == "UNAVAILABLE"
        assert error["error"].startswith("the scheduler at 127.0.0.1:1 is not answering")
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_an_address_it_cannot_use_is_a_clear_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gearshift.client.cli", "dashboard", "--listen", "nowhere"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "cannot listen on nowhere: --listen: address 'nowhere' is not host:port" in (
        result.stderr
    )
