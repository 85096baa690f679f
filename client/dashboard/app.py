"""The dashboard's web app (Starlette): the pages, their assets, and the JSON they read.

Pages are static HTML with plain JavaScript (shipped in `static/`, nothing from a
CDN) that poll the `/api/` endpoints every few seconds. Auth is the CLI's: the
scheduler's bearer token, entered once on /login and kept in an HttpOnly cookie;
every gRPC call carries it. State-changing requests must be JSON (a form on
another site cannot send one) and the cookie is SameSite=Strict.
"""

from __future__ import annotations

import contextlib
import string
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from gearshift.client import timeline
from gearshift.client.dashboard import allocation_view, queue, views
from gearshift.client.dashboard.gateway import Gateway
from gearshift.client.dashboard.loss_view import loss_curve
from gearshift.client.dashboard.series import LossPoint
from gearshift.client.render import parse_states
from gearshift.common.errors import GearshiftError, ValidationError

STATIC = Path(__file__).parent / "static"
COOKIE = "gearshift_token"
MAX_LOG_LINES = 2000
DEFAULT_WINDOW_SECONDS = 3600
MAX_WINDOW_SECONDS = 7 * 86400
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
Endpoint = Callable[[Request], Response]


def error_response(exc: GearshiftError, where: str) -> JSONResponse:
    """A failed call as JSON: the message, the gRPC code, and an HTTP status to match."""
    message = exc.message
    if exc.code == grpc.StatusCode.UNAUTHENTICATED:
        message = f"the scheduler refused the token: {exc.message}"
    elif exc.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        message = f"{where} is not answering: {exc.message}"
    return JSONResponse(
        {"error": message, "code": exc.code.name}, status_code=HTTP_STATUS.get(exc.code, 502)
    )


def render_page(title: str, name: str, scripts: Sequence[str]) -> str:
    """A page: the shell (head, top bar, app.js) around static/<name>.html and its scripts."""
    shell = string.Template((STATIC / "shell.html").read_text())
    return shell.substitute(
        title=title,
        body=(STATIC / f"{name}.html").read_text().rstrip("\n"),
        scripts="\n".join(f'  <script src="/static/{s}"></script>' for s in scripts),
    )


def _int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name, "")
    if not raw:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ValidationError(name, f"must be a number from {low} to {high} (got {raw!r})")
    return int(raw)


def create_app(gateway: Gateway) -> Starlette:
    """The app over a gateway to the scheduler (and the Brain)."""

    def token(request: Request) -> str:
        return request.cookies.get(COOKIE, "")

    def api(endpoint: Callable[[Request], Any]) -> Endpoint:
        """A JSON endpoint: its result as JSON, GearshiftError as an error answer."""

        def call(request: Request) -> Response:
            try:
                result = endpoint(request)
            except GearshiftError as exc:
                return error_response(exc, f"the scheduler at {gateway.scheduler}")
            return result if isinstance(result, Response) else JSONResponse(result)

        return call

    def page(title: str, name: str, *scripts: str) -> Callable[[Request], Response]:
        html = render_page(title, name, scripts)

        def serve(request: Request) -> Response:
            return HTMLResponse(html, headers={"Cache-Control": "no-store"})

        return serve

    async def json_body(request: Request) -> dict[str, Any]:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise ValidationError("Content-Type", "must be application/json")
        try:
            body = await request.json()
        except ValueError:
            raise ValidationError("body", "is not JSON") from None
        if not isinstance(body, dict):
            raise ValidationError("body", "must be a JSON object")
        return body

    async def login(request: Request) -> Response:
        try:
            body = await json_body(request)
            value = str(body.get("token", ""))
            await run_in_threadpool(gateway.check_token, value)
        except GearshiftError as exc:
            return error_response(exc, f"the scheduler at {gateway.scheduler}")
        response = JSONResponse({"ok": True})
        response.set_cookie(COOKIE, value, httponly=True, samesite="strict")
        return response

    def logout(request: Request) -> Response:
        response = JSONResponse({"ok": True})
        response.delete_cookie(COOKIE)
        return response

    def jobs(request: Request) -> Any:
        page_size = _int(request, "limit", 200, 1, 1000)
        listing = gateway.jobs(
            token(request),
            states=parse_states(request.query_params.get("state", "")),
            tenant=request.query_params.get("tenant", "").strip(),
            name_prefix=request.query_params.get("name", "").strip(),
            limit=page_size,
        )
        return {
            "jobs": [views.job_row(j) for j in listing.jobs],
            "more": bool(listing.next_page_token),
        }

    def job(request: Request) -> Any:
        return {"job": views.job_detail(gateway.job(token(request), request.path_params["id"]))}

    def job_view(request: Request) -> Any:
        value = token(request)
        found = gateway.job(value, request.path_params["id"])
        history = gateway.history(value, found)
        brain: Any = None
        if gateway.brain:
            try:
                brain = gateway.brain_samples(value, found.job_id)
            except GearshiftError as exc:
                brain = f"the Brain at {gateway.brain}: {exc.message}"
        out = views.job_view(found, history, time.time(), brain)
        steps: list[LossPoint] | str
        try:
            steps = gateway.steps(value, found)
        except GearshiftError as exc:
            steps = exc.message
        out["loss_curve"] = loss_curve(steps, timeline.progress(history.events, history.seen))
        return out

    def logs(request: Request) -> Any:
        value = token(request)
        job_id = request.path_params["id"]
        lines = _int(request, "lines", 100, 1, MAX_LOG_LINES)
        gateway.job(value, job_id)  # NOT_FOUND / UNAUTHENTICATED as for any page
        try:
            return views.log_lines(gateway.logs(value, job_id, lines))
        except GearshiftError as exc:
            return {"available": False, "message": f"logs not available: {exc.message}"}

    async def cancel(request: Request) -> Response:
        try:
            body = await json_body(request)
            reason = str(body.get("reason") or "cancelled from the dashboard")
            cancelled = await run_in_threadpool(
                gateway.cancel, token(request), request.path_params["id"], reason
            )
        except GearshiftError as exc:
            return error_response(exc, f"the scheduler at {gateway.scheduler}")
        return JSONResponse({"job": views.job_detail(cancelled)})

    def waiting(request: Request) -> Any:
        states = parse_states("queued")
        listing = gateway.jobs(token(request), states=states, tenant="", name_prefix="", limit=1000)
        return queue.queue(listing.jobs, time.time())

    def cluster(request: Request) -> Any:
        return views.cluster(gateway.cluster(token(request)))

    def over_window(request: Request, shape: Callable[..., Any]) -> Any:
        """`shape`(cluster, runs, since, now, truncated) over the last ?window= seconds."""
        seconds = _int(request, "window", DEFAULT_WINDOW_SECONDS, 60, MAX_WINDOW_SECONDS)
        value, now = token(request), time.time()
        runs, truncated = gateway.runs(value, now - seconds)
        return shape(gateway.cluster(value), runs, now - seconds, now, truncated)

    def whoami(request: Request) -> Any:
        return {
            "scheduler": gateway.scheduler,
            "brain": gateway.brain,
            "token": "cookie" if token(request) else "default" if gateway.default_token else "none",
        }

    def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        gateway.close()

    routes = [
        Route("/", page("Jobs", "jobs", "jobs.js")),
        Route("/jobs/{id}", page("Job", "job", "charts.js", "job.js")),
        Route("/cluster", page("Cluster", "cluster", "cluster.js")),
        Route("/allocation", page("Allocation", "allocation", "charts.js", "allocation.js")),
        Route("/tenants", page("Tenants", "tenants", "charts.js", "tenants.js")),
        Route("/queue", page("Queue", "queue", "queue.js")),
        Route("/login", page("Log in", "login", "login.js")),
        Route("/healthz", healthz),
        Route("/api/login", login, methods=["POST"]),
        Route("/api/logout", logout, methods=["POST"]),
        Route("/api/whoami", api(whoami)),
        Route("/api/jobs", api(jobs)),
        Route("/api/jobs/{id}", api(job)),
        Route("/api/jobs/{id}/view", api(job_view)),
        Route("/api/jobs/{id}/logs", api(logs)),
        Route("/api/jobs/{id}/cancel", cancel, methods=["POST"]),
        Route("/api/cluster", api(cluster)),
        Route("/api/allocation", api(lambda r: over_window(r, allocation_view.allocation))),
        Route("/api/tenants", api(lambda r: over_window(r, allocation_view.tenants))),
        Route("/api/queue", api(waiting)),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
