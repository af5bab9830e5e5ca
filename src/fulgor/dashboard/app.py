"""The dashboard's routes: HTML pages rendered on the server, its two static files, sign-in.

Pages are Jinja templates with autoescaping on, so every string a page shows (model outputs, tool
results, tasks, span attributes, ids) reaches the browser as text, never as markup; the one script
is a static file, and each answer carries a Content-Security-Policy that runs no inline script.
Behind a server token (any server off loopback has one) a page needs the token: as the API's
``Authorization: Bearer`` header, or the cookie the sign-in form at ``/login`` sets.

Routes (GET unless said): ``/`` (runs), ``/rollouts``, ``/rollouts/{rollout_id}``, ``/resources``,
``/workers``, ``/login`` (GET and POST), ``/logout``, ``/static/{name}``.
"""

from __future__ import annotations

import hmac
import importlib.resources
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, get_args
from urllib.parse import parse_qsl, quote, unquote, urlencode

import jinja2

from fulgor.dashboard import views
from fulgor.dashboard.reader import SORTS, Page, Reader, RolloutQuery, is_live
from fulgor.dashboard.tokens import TokenDecoder, load_decoder
from fulgor.errors import ConfigError, NotFoundError, ValidationError
from fulgor.server.http import Answer, Receive, Scope, header, read_body
from fulgor.server.routing import Route
from fulgor.training.rollouts import read_outcome
from fulgor.training.run_report import read_metrics, read_run_info
from fulgor.types import AttemptStatus, Rollout, RolloutStatus

__all__ = ["COOKIE", "Dashboard", "DashboardApp"]

COOKIE = "fulgor_token"
_HTML = b"text/html; charset=utf-8"
_SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)
_STATIC = {"dashboard.css": b"text/css; charset=utf-8", "dashboard.js": b"text/javascript; charset=utf-8"}
_ATTEMPT_STATUSES: tuple[str, ...] = get_args(AttemptStatus)
ROLLOUT_STATUSES: tuple[str, ...] = get_args(RolloutStatus)


@dataclass
class Dashboard:
    """The dashboard over ``reader``, with the runs in ``run_dirs`` (each with ``metrics.jsonl`` and
    ``run.json``, as the Trainer writes them); ``token``: the server's (None: no sign-in)."""

    reader: Reader
    run_dirs: Sequence[Path] = ()
    token: str | None = field(default=None, repr=False)
    tokenizer: Path | None = None
    """A model or tokenizer folder for the token view's text (else the runs' model, if any)."""

    @cached_property
    def _templates(self) -> jinja2.Environment:
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("fulgor.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        env.filters.update(when=_when, seconds=_seconds, number=_number, query=_query_string)
        env.globals.update(read_only=self.reader.read_only)
        return env

    @cached_property
    def _decoder(self) -> TokenDecoder | None:
        folders = [self.tokenizer] if self.tokenizer is not None else []
        for run_dir in self.run_dirs:
            model = read_run_info(run_dir).get("model")
            if isinstance(model, str):
                folders.append(Path(model))
            folders.append(run_dir / "checkpoints")
        return load_decoder(folders)

    async def close(self) -> None:
        await self.reader.close()

    def routes(self) -> list[Route]:
        pages = {
            "/": self._runs,
            "/rollouts": self._rollouts,
            "/rollouts/{rollout_id}": self._rollout,
            "/resources": self._resources,
            "/workers": self._workers,
            "/logout": self._logout,
        }
        routes = [Route("GET", path, self._page(endpoint), open=True) for path, endpoint in pages.items()]
        routes += [
            Route("GET", "/login", self._login_form, open=True),
            Route("POST", "/login", self._login, open=True),
            Route("GET", "/static/{name}", self._static, open=True),
            Route("GET", "/favicon.ico", _no_icon, open=True),
        ]
        return routes

    # -- sign-in ------------------------------------------------------------------------------------

    def _signed_in(self, scope: Scope) -> bool:
        if self.token is None:
            return True
        expected = self.token.encode()
        given = header(scope, b"authorization")
        if given is not None and given[:7].lower() == b"bearer " and hmac.compare_digest(given[7:], expected):
            return True
        cookie = _cookie(scope, COOKIE)
        return cookie is not None and hmac.compare_digest(cookie.encode(), expected)

    def _page(self, endpoint: Any) -> Any:
        async def guarded(scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
            if not self._signed_in(scope):  # a page asked for without the token: sign in first
                target = scope["path"] + (
                    f"?{scope['query_string'].decode('latin-1')}" if scope["query_string"] else ""
                )
                return _redirect("/login?" + urlencode({"next": target}))
            try:
                answer: Answer = await endpoint(scope, params)
                return answer
            except NotFoundError as error:
                return self._html("error.html", status=404, message=error.message)
            except (ValidationError, ConfigError) as error:
                return self._html("error.html", status=400, message=error.message)

        return guarded

    async def _login_form(self, scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
        return self._html("login.html", next=_safe_next(_args(scope).get("next", "/")), failed=False)

    async def _login(self, scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
        form = dict(parse_qsl((await read_body(receive, 16_384)).decode("utf-8", "replace")))
        target = _safe_next(form.get("next", "/"))
        given = form.get("token", "").strip()
        if self.token is None:
            return _redirect(target)
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return self._html("login.html", status=403, next=target, failed=True)
        secure = "; Secure" if scope.get("scheme") == "https" else ""
        cookie = f"{COOKIE}={quote(given, safe='')}; Path=/; HttpOnly; SameSite=Strict{secure}"
        return _redirect(target, cookie=cookie)

    async def _logout(self, scope: Scope, params: dict[str, str]) -> Answer:
        return _redirect("/login", cookie=f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict")

    async def _static(self, scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
        name = params["name"]
        if name not in _STATIC:
            return Answer(404, b"not found", media_type=b"text/plain")
        body = importlib.resources.files("fulgor.dashboard").joinpath("static", name).read_bytes()
        return Answer(200, body, headers=((b"cache-control", b"max-age=300"),), media_type=_STATIC[name])

    # -- pages --------------------------------------------------------------------------------------

    async def _runs(self, scope: Scope, params: dict[str, str]) -> Answer:
        runs = []
        for run_dir in self.run_dirs:
            try:
                history = read_metrics(run_dir)
            except ConfigError:
                history = []
            info = read_run_info(run_dir)
            steps = [_step_row(metrics) for metrics in history if "step" in metrics]
            runs.append(
                {
                    "name": run_dir.name,
                    "path": str(run_dir),
                    "algorithm": info.get("algorithm"),
                    "hyperparameters": info.get("hyperparameters") or {},
                    "steps": steps,
                    "charts": views.charts(history),
                }
            )
        stats = await self.reader.stats()
        return self._html("runs.html", runs=runs, stats=stats, live=True)

    async def _rollouts(self, scope: Scope, params: dict[str, str]) -> Answer:
        args = _args(scope)
        query, problem = await self._query(args)
        page = await self.reader.rollouts(query)
        context = {
            "page": page,
            "args": args,
            "problem": problem,
            "statuses": ROLLOUT_STATUSES,
            "attempt_statuses": _ATTEMPT_STATUSES,
            "sorts": SORTS,
            "problems": views.PROBLEMS,
            "agents": await self.reader.agents(),
            "pages": _pagination(page),
            "live": query.offset == 0 and query.sort == "newest",
        }
        return self._html("rollouts.html", context)

    async def _query(self, args: dict[str, Any]) -> tuple[RolloutQuery, str | None]:
        """The rollouts page's query from its URL; ``problem`` (a drift counter, with ``step``) names
        the rollouts of that step whose outcome counts it."""
        statuses = tuple(s for s in args.get("status_list", []) if s)
        for status in statuses:
            if status not in ROLLOUT_STATUSES:
                raise ValidationError(f"status must be one of {', '.join(ROLLOUT_STATUSES)}, got {status!r}")
        per_page = _int(args, "per_page", 50)
        page_number = max(_int(args, "page", 1), 1)
        query = RolloutQuery(
            status=statuses,
            mode=args.get("mode") or None,
            group_id=args.get("group") or None,
            resources_id=args.get("resources") or None,
            step=_optional_int(args, "step"),
            agent=args.get("agent") or None,
            reward_min=_float(args, "reward_min"),
            reward_max=_float(args, "reward_max"),
            attempt_status=args.get("attempt_status") or None,
            sort=args.get("sort") or "newest",
            offset=(page_number - 1) * per_page,
            limit=per_page,
        )
        problem = args.get("problem") or None
        if problem is None:
            return query, None
        if problem not in views.PROBLEMS:
            raise ValidationError(f"problem must be one of {', '.join(views.PROBLEMS)}, got {problem!r}")
        if query.step is None:
            raise ValidationError(
                "a problem filter needs a step: open it from a step's drift counts on the Runs page"
            )
        agent_match = self._run_setting("agent_match")
        max_tokens = self._run_setting("max_trajectory_tokens")
        ids = []
        for rollout in await self.reader.rollouts_of_step(query.step):
            outcome = await read_outcome(self.reader, rollout, agent_match=agent_match, max_tokens=max_tokens)  # type: ignore[arg-type]
            if getattr(outcome.drift, problem):
                ids.append(rollout.rollout_id)
        return RolloutQuery(**{**query.__dict__, "rollout_ids": tuple(ids)}), problem

    def _run_setting(self, name: str) -> Any:
        for run_dir in self.run_dirs:
            value = (read_run_info(run_dir).get("hyperparameters") or {}).get(name)
            if value is not None:
                return value
        return None

    async def _rollout(self, scope: Scope, params: dict[str, str]) -> Answer:
        rollout = await self.reader.get_rollout(params["rollout_id"])
        attempts = await self.reader.list_attempts(rollout.rollout_id)
        args = _args(scope)
        chosen = attempts[-1] if attempts else None
        wanted = _optional_int(args, "attempt")
        if wanted is not None:
            chosen = next((a for a in attempts if a.sequence_id == wanted), None)
            if chosen is None:
                raise NotFoundError(f"rollout {rollout.rollout_id} has no attempt {wanted}")
        spans = await self.reader.query_spans(rollout.rollout_id, chosen.attempt_id) if chosen else []
        latest = chosen is None or chosen is attempts[-1]
        problem = await self._why_not_trained(rollout) if latest else "only the latest attempt is trained on"
        decoder = self._decoder
        calls = views.call_views(
            spans,
            agent_match=self._run_setting("agent_match"),
            rollout_problem=problem,
            decode=decoder.decode if decoder is not None else None,
            max_tokens=self._run_setting("max_trajectory_tokens"),
        )
        return self._html(
            "rollout.html",
            rollout=rollout,
            attempts=attempts,
            attempt=chosen,
            spans=spans,
            tree=views.span_tree(spans),
            rewards=views.rewards(spans),
            calls=calls,
            problem=problem,
            decoder=decoder,
            live=is_live(rollout),
            input=_pretty(rollout.input),
        )

    async def _why_not_trained(self, rollout: Rollout) -> str | None:
        """Why none of the rollout's calls is trained on (None: they can be, call by call)."""
        if rollout.mode != "train":
            return f"a {rollout.mode} rollout: training learns from train rollouts only"
        if rollout.status != "succeeded":
            return f"the rollout did not succeed (it is {rollout.status}): only succeeded ones are trained on"
        outcome = await read_outcome(self.reader, rollout, agent_match=self._run_setting("agent_match"))  # type: ignore[arg-type]
        if outcome.error is not None:
            return outcome.error
        if outcome.reward is None and outcome.drift.rollouts_without_reward:
            return "the rollout emitted no reward"
        return None

    async def _resources(self, scope: Scope, params: dict[str, str]) -> Answer:
        versions = views.prompt_diffs(await self.reader.resources())
        return self._html("resources.html", versions=versions)

    async def _workers(self, scope: Scope, params: dict[str, str]) -> Answer:
        workers = await self.reader.workers()
        return self._html("workers.html", workers=workers, now=time.time(), live=True)

    # -- rendering ----------------------------------------------------------------------------------

    def _html(
        self, template: str, context: dict[str, Any] | None = None, *, status: int = 200, **more: Any
    ) -> Answer:
        values = {"live": False, **(context or {}), **more, "signed_in": self.token is not None}
        body = self._templates.get_template(template).render(**values)
        return Answer(status, body.encode(), headers=_SECURITY_HEADERS, media_type=_HTML)


# -- helpers ----------------------------------------------------------------------------------------


async def _no_icon(scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
    return Answer(204, b"", media_type=b"image/x-icon")


def _step_row(metrics: dict[str, Any]) -> dict[str, Any]:
    drift = {
        name[len("drift/") :]: value
        for name, value in metrics.items()
        if name.startswith("drift/") and name[len("drift/") :] in views.PROBLEMS and value
    }
    return {"metrics": metrics, "step": int(metrics["step"]), "drift": drift}


def _pagination(page: Page) -> dict[str, Any]:
    per_page = page.query.limit
    current = page.query.offset // per_page + 1
    last = max(math.ceil(page.total / per_page), 1)
    return {
        "current": current,
        "last": last,
        "previous": current - 1 if current > 1 else None,
        "next": current + 1 if current < last else None,
    }


def _args(scope: Scope) -> dict[str, Any]:
    args: dict[str, Any] = {"status_list": []}
    for name, value in parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True):
        if name == "status":
            args["status_list"].append(value)
        else:
            args[name] = value
    return args


def _int(args: dict[str, Any], name: str, default: int) -> int:
    number = _optional_int(args, name)
    return default if number is None else number


def _optional_int(args: dict[str, Any], name: str) -> int | None:
    value = args.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValidationError(f"{name} must be a whole number, got {value!r}") from None


def _float(args: dict[str, Any], name: str) -> float | None:
    value = args.get(name)
    if value in (None, ""):
        return None
    try:
        number = float(value)
    except ValueError:
        raise ValidationError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValidationError(f"{name} must be a finite number, got {value!r}")
    return number


def _cookie(scope: Scope, name: str) -> str | None:
    raw = header(scope, b"cookie")
    if raw is None:
        return None
    for part in raw.decode("latin-1").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return unquote(value)
    return None


def _safe_next(target: str) -> str:
    """A sign-in's destination: a path on this server only (never another site)."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _redirect(target: str, *, cookie: str | None = None) -> Answer:
    headers = [(b"location", target.encode("latin-1", "replace")), *_SECURITY_HEADERS]
    if cookie is not None:
        headers.append((b"set-cookie", cookie.encode("latin-1")))
    return Answer(303, b"", headers=tuple(headers), media_type=_HTML)


def _pretty(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=1, ensure_ascii=False, default=str)


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _number(value: Any, digits: int = 3) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}" if math.isfinite(value) else str(value)


def _query_string(args: dict[str, Any], **changes: Any) -> str:
    """The rollouts page's query string with ``changes`` applied (None removes a parameter)."""
    pairs: list[tuple[str, str]] = [("status", s) for s in args.get("status_list", [])]
    merged = {k: v for k, v in args.items() if k != "status_list"}
    merged.update(changes)
    pairs += [(k, str(v)) for k, v in merged.items() if v not in (None, "")]
    return urlencode(pairs)


class DashboardApp:
    """The dashboard alone as an ASGI app (``fulgor dashboard``): its pages and ``/healthz``, no
    store API; its lifespan closes the reader."""

    def __init__(self, dashboard: Dashboard) -> None:
        from fulgor.server.app import health_route
        from fulgor.server.routing import Router

        self.dashboard = dashboard
        self._router = Router([*dashboard.routes(), health_route()], token=None, max_body_bytes=65_536)

    async def __call__(self, scope: Scope, receive: Receive, send: Any) -> None:
        if scope["type"] == "http":
            await self._router(scope, receive, send)
        elif scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.dashboard.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
