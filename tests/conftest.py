"""Fixtures for every test level: real PostgreSQL and Redis (from GEARSHIFT_TEST_* variables),
and daemons started as real processes.

A test that needs a service skips with the reason when its variable is unset,
except with GEARSHIFT_REQUIRE_SERVICES=1 (CI), where that is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from bench.shared import shared_data
from gearshift.client.processes import DaemonProcess, start_daemon

REQUIRE_SERVICES = os.environ.get("GEARSHIFT_REQUIRE_SERVICES") == "1"


def pytest_configure(config: pytest.Config) -> None:
    # Here rather than in pyproject.toml: the marker belongs to the tests that need a GPU
    # (`pytest -m gpu`, run by bench/gpu_checks.py on a machine that has one).
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")


def _unavailable(reason: str) -> None:
    if REQUIRE_SERVICES:
        pytest.fail(f"{reason} (GEARSHIFT_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


def _url(variable: str) -> str:
    url = os.environ.get(variable, "")
    if not url:
        _unavailable(f"{variable} is not set")
    return url


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of the test PostgreSQL server (its `test` database), checked reachable."""
    import sqlalchemy

    from gearshift.common.db import database_url

    url = database_url(_url("GEARSHIFT_TEST_POSTGRES_URL")).render_as_string(hide_password=False)
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("select 1"))
    except sqlalchemy.exc.OperationalError as exc:
        _unavailable(f"PostgreSQL at {url} is unreachable: {exc.orig}")
    finally:
        engine.dispose()
    return url


@pytest.fixture
def postgres_db(postgres_url: str) -> Iterator[str]:
    """A fresh, empty database for one test (dropped afterwards), so tests run in parallel."""
    from gearshift.common.db import scratch_database

    with scratch_database(postgres_url, "gs_test") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database on each backend the services support: SQLite, then PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'service.db'}"
    url: str = request.getfixturevalue("postgres_db")
    return url


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the test Redis server, checked reachable."""
    import redis

    url = _url("GEARSHIFT_TEST_REDIS_URL")
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        _unavailable(f"Redis at {url} is unreachable: {exc}")
    finally:
        client.close()
    return url


REPO = Path(__file__).resolve().parents[1]


def _shared(name: str, marker: str, what: str) -> Path:
    path = shared_data(name)
    if not (path / marker).exists():
        _unavailable(f"{what} not found at {path} (set GEARSHIFT_SHARED_DIR)")
    return path


@pytest.fixture(scope="session")
def gavel_data() -> Path:
    """../shared/data/gavel beside the checkout (Gavel's throughputs and traces)."""
    return _shared("gavel", "simulation_throughputs.json", "Gavel data")


@pytest.fixture(scope="session")
def rubick_data() -> Path:
    """../shared/data/rubick beside the checkout (Rubick's profiles and placement runs)."""
    return _shared("rubick", "profile/history.csv", "Rubick data")


@pytest.fixture(scope="session")
def deeppool_data() -> Path:
    """../shared/data/deeppool beside the checkout (DeepPool's per-layer A100 profiles)."""
    return _shared("deeppool", "A100_vgg.prof", "DeepPool profiles")


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's headless-capable Chromium (installed by .ci/run), for browser tests."""
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"{CHROMIUM} is not installed (apt-get install chromium)")
    return CHROMIUM


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where a browser test saves its screenshots: $GEARSHIFT_SCREENSHOTS, else the test's
    temporary folder. The folder is printed (pytest -s, or the report of a failure)."""
    folder = Path(os.environ.get("GEARSHIFT_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"screenshots in {folder}")
    return folder


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """Files of a throwaway PKI (tests/pki.py): ca, server_cert/key, client_cert/key."""
    from tests.pki import make_pki

    return make_pki(tmp_path / "pki")


@pytest.fixture
def unique_id() -> str:
    """A short id for names (datasets, jobs) that must not collide across parallel tests."""
    return uuid.uuid4().hex[:10]


DaemonFactory = Callable[..., DaemonProcess]


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[DaemonFactory]:
    """Start daemons as processes: `daemons("brain", ["--flag", "x"], env={...})`, ready to call.

    Every daemon still running at the end is stopped; a test that stops one
    itself checks the exit code.
    """
    started: list[DaemonProcess] = []

    def start(
        name: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> DaemonProcess:
        daemon = start_daemon(
            name, args, run_dir=tmp_path / "run" / f"{name}-{len(started)}", env=env
        )
        started.append(daemon)
        daemon.wait_ready(timeout)
        return daemon

    yield start
    for daemon in reversed(started):
        daemon.stop()
