"""The dashboard over HTTP: ``fulgor dashboard RUN_DIR`` (read-only) and ``fulgor serve`` at ``/``,
sign-in behind a token, every untrusted string escaped, bad input answered with what to do."""

from __future__ import annotations

import functools
import hashlib
import html
import operator
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.dashboard_support import make_run, missing_ids_in_step, start

CLI = (sys.executable, "-m", "fulgor.cli.main")
ROLLOUTS = 60


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("dashboard") / "run"
    return path, make_run(path, rollouts=ROLLOUTS)


@pytest.fixture(scope="module")
def run_dir(made: tuple[Path, list[str]]) -> Path:
    return made[0]


@pytest.fixture(scope="module")
def dashboard(run_dir: Path) -> Iterator[str]:
    process, url = start("dashboard", str(run_dir), "--port", "0")
    try:
        yield url
    finally:
        process.terminate()
        assert process.wait(30) == 0


def digest(folder: Path) -> dict[str, str]:
    """Each file's hash but SQLite's WAL sidecars, which any reader of a WAL database may create; a
    write-ahead log the reader left must be empty (it wrote nothing)."""
    wal = folder / "store.sqlite-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


def rollout_ids(page: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'class="rollout-link" href="/rollouts/([^"]+)"', page)]


def test_every_page_answers_and_escapes_what_the_run_recorded(dashboard: str, run_dir: Path) -> None:
    first = httpx.get(f"{dashboard}/rollouts?per_page=1").text
    (newest,) = rollout_ids(first)
    pages = [
        "/",
        "/rollouts",
        f"/rollouts/{newest}",
        "/resources",
        "/workers",
        "/rollouts?step=2&problem=calls_missing_ids",
    ]
    oldest = rollout_ids(httpx.get(f"{dashboard}/rollouts?sort=oldest&per_page=1").text)[0]
    pages.append(f"/rollouts/{oldest}")
    for page in pages:
        response = httpx.get(dashboard + page)
        assert response.status_code == 200, page
        assert "script-src 'self'" in response.headers["content-security-policy"]
        body = response.text
        for markup in ("<script>window", "<img src=x", "<b>bold"):
            assert markup not in body, page
    # The markup is shown, as text, where it was recorded: the task, outputs, tool results, feedback.
    one = httpx.get(f"{dashboard}/rollouts/{oldest}").text
    assert one.count("&lt;script&gt;window.__xss=1&lt;/script&gt;&lt;img src=x onerror=") >= 6
    for static in ("/static/dashboard.css", "/static/dashboard.js"):
        assert httpx.get(dashboard + static).status_code == 200
    assert httpx.get(f"{dashboard}/static/../store.sqlite").status_code == 404


def test_the_rollouts_page_filters_sorts_and_pages_on_the_server(dashboard: str) -> None:
    everything = httpx.get(f"{dashboard}/rollouts?per_page=500").text
    assert len(rollout_ids(everything)) == ROLLOUTS + 2
    assert f"{ROLLOUTS + 2} rollouts" in everything
    pages = [rollout_ids(httpx.get(f"{dashboard}/rollouts?per_page=25&page={n}").text) for n in (1, 2, 3)]
    assert [len(p) for p in pages] == [25, 25, ROLLOUTS + 2 - 50]
    assert functools.reduce(operator.iadd, pages, []) == rollout_ids(everything)
    failed = httpx.get(f"{dashboard}/rollouts?status=failed&per_page=500").text
    assert len(rollout_ids(failed)) == len([i for i in range(ROLLOUTS) if i % 9 == 8])
    several = httpx.get(f"{dashboard}/rollouts?status=failed&status=preparing&per_page=500").text
    assert len(rollout_ids(several)) == len(rollout_ids(failed)) + 1
    rewards = re.findall(
        r'<td class="num">([0-9.]+)</td>',
        httpx.get(f"{dashboard}/rollouts?sort=reward_desc&reward_min=0.5").text,
    )
    values = [float(v) for v in rewards if "." in v]
    assert values
    assert values == sorted(values, reverse=True)
    assert min(values) >= 0.5


def test_a_drift_count_links_to_the_rollouts_behind_it(dashboard: str) -> None:
    runs = httpx.get(dashboard).text
    link = re.search(r'href="(/rollouts\?step=2&amp;problem=calls_missing_ids)"', runs)
    assert link is not None, "the runs page links step 2's calls_missing_ids count"
    behind = httpx.get(dashboard + html.unescape(link.group(1))).text
    ids = rollout_ids(behind)
    assert len(ids) == len(missing_ids_in_step(2, ROLLOUTS)) >= 1
    page = httpx.get(f"{dashboard}/rollouts/{ids[0]}").text
    assert "token ids missing" in page
    assert "the engine&#39;s token ids are missing" in page
    stats = re.search(r'href="(/rollouts\?status=failed)"', runs)
    assert stats is not None, "the store's counts link to their rollouts"


def test_a_rollout_shows_any_of_its_attempts(dashboard: str, made: tuple[Path, list[str]]) -> None:
    retried = made[1][-2]
    latest = httpx.get(f"{dashboard}/rollouts/{retried}").text
    assert "second try" in latest
    assert "first try" not in latest
    assert "the tool timed out" in latest  # the first attempt's error, in the attempts table
    first = httpx.get(f"{dashboard}/rollouts/{retried}?attempt=1").text
    assert "first try" in first
    assert "second try" not in first
    assert "only the latest attempt is trained on" in first


def test_only_train_rollouts_are_said_to_be_trained(dashboard: str) -> None:
    (val,) = rollout_ids(httpx.get(f"{dashboard}/rollouts?mode=val&status=succeeded&per_page=1").text)
    page = html.unescape(httpx.get(f"{dashboard}/rollouts/{val}").text)
    assert "Not trained on: a val rollout: training learns from train rollouts only" in page
    assert "trained; starts row" not in page
    (train,) = rollout_ids(httpx.get(f"{dashboard}/rollouts?mode=train&status=succeeded&per_page=1").text)
    assert "Trained on, call by call" in httpx.get(f"{dashboard}/rollouts/{train}").text


def test_the_workers_page_lists_heartbeats_and_current_rollouts(
    dashboard: str, made: tuple[Path, list[str]]
) -> None:
    page = httpx.get(f"{dashboard}/workers").text
    live = made[1][-1]
    assert f'href="/rollouts/{live}"' in page
    assert "synthetic-worker" in page
    assert "retry-worker" in page
    assert "&lt;script&gt;window.__xss=1" in page  # the worker's id and stats, as text


def test_bad_input_is_answered_with_what_to_do(dashboard: str) -> None:
    (some,) = rollout_ids(httpx.get(f"{dashboard}/rollouts?per_page=1&status=succeeded").text)
    cases = {
        "/rollouts?reward_min=lots": (400, "reward_min must be a number"),
        "/rollouts?status=finished": (400, "status must be one of"),
        "/rollouts?sort=sideways": (400, "sort must be one of"),
        "/rollouts?per_page=100000": (400, "limit must be between"),
        "/rollouts?problem=calls_missing_ids": (400, "needs a step"),
        "/rollouts/ro-nothing": (404, "not found"),
        f"/rollouts/{some}?attempt=x": (400, "attempt must be a whole number"),
        f"/rollouts/{some}?attempt=7": (404, "has no attempt 7"),
    }
    for page, (status, message) in cases.items():
        response = httpx.get(dashboard + page)
        assert (response.status_code, message in html.unescape(response.text)) == (status, True), page
    assert httpx.post(f"{dashboard}/rollouts").status_code == 405
    assert httpx.get(f"{dashboard}/healthz").json()["status"] == "ok"


def test_fulgor_dashboard_reads_without_writing(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    copy.mkdir()
    for path in run_dir.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    before = digest(copy)
    process, url = start("dashboard", str(copy), "--port", "0")
    try:
        for page in ("/", "/rollouts", "/workers", "/resources"):
            assert httpx.get(url + page).status_code == 200
        assert "read-only" in httpx.get(url).text
        assert httpx.get(f"{url}/api/v1/stats").status_code == 404  # no store API here
    finally:
        process.terminate()
        assert process.wait(30) == 0
    assert digest(copy) == before
    process, url = start("dashboard", str(copy / "store.sqlite"), "--port", "0")  # a store file too
    try:
        assert "rollout-link" in httpx.get(f"{url}/rollouts").text
    finally:
        process.terminate()
        assert process.wait(30) == 0


def test_fulgor_dashboard_names_what_to_pass(tmp_path: Path, run_dir: Path) -> None:
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "store.sqlite").write_bytes((run_dir / "store.sqlite").read_bytes())
    result = subprocess.run(
        [*CLI, "dashboard", str(tmp_path / "runs"), "--port", "0"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "holds no store.sqlite" in result.stderr
    assert str(tmp_path / "runs" / "a") in result.stderr
    refused = subprocess.run(
        [*CLI, "dashboard", str(run_dir), "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert refused.returncode == 2
    assert "without a token" in refused.stderr


def test_fulgor_serve_serves_the_dashboard_behind_its_token(run_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "serve" / "store.sqlite"
    store.parent.mkdir()
    store.write_bytes((run_dir / "store.sqlite").read_bytes())
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    process, url = start(
        "serve", "--port", "0", "--store", f"sqlite:///{store}", "--token-file", str(token_file)
    )
    try:
        with httpx.Client(base_url=url) as anonymous:
            refused = anonymous.get("/rollouts?status=failed")
            assert refused.status_code == 303
            assert refused.headers["location"] == "/login?next=%2Frollouts%3Fstatus%3Dfailed"
            assert anonymous.get("/login").status_code == 200
            wrong = anonymous.post("/login", data={"token": "guess", "next": "/rollouts"})
            assert wrong.status_code == 403
            assert "That token is wrong" in wrong.text
            assert "fulgor_token" not in wrong.headers.get("set-cookie", "")
            elsewhere = anonymous.post("/login", data={"token": "s3cret-token", "next": "//evil.example/x"})
            assert elsewhere.headers["location"] == "/"  # never sent to another site
        with httpx.Client(base_url=url) as browser:
            signed = browser.post("/login", data={"token": "s3cret-token", "next": "/rollouts?status=failed"})
            assert signed.status_code == 303
            assert signed.headers["location"] == "/rollouts?status=failed"
            cookie = signed.headers["set-cookie"]
            assert "HttpOnly" in cookie
            assert "SameSite=Strict" in cookie
            page = browser.get("/rollouts?status=failed")
            assert page.status_code == 200
            assert "rollout-link" in page.text
            assert browser.get("/logout").status_code == 303
        bearer = httpx.get(f"{url}/workers", headers={"Authorization": "Bearer s3cret-token"})
        assert bearer.status_code == 200
        assert (
            httpx.get(f"{url}/api/v1/stats", headers={"Authorization": "Bearer s3cret-token"}).status_code
            == 200
        )
        assert httpx.get(f"{url}/api/v1/stats", cookies={"fulgor_token": "s3cret-token"}).status_code == 401
    finally:
        process.terminate()
        assert process.wait(30) == 0


def test_fulgor_serve_shows_a_memory_store_and_says_when_it_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from fulgor.dashboard import Dashboard, StoreReader, reader
    from fulgor.server import BackgroundServer, ServerConfig, create_app
    from fulgor.store.memory import MemoryStore
    from fulgor.testing.rollouts import write_rollouts

    store = MemoryStore()
    asyncio.run(write_rollouts(store, 30))
    monkeypatch.setattr(reader, "SCAN_LIMIT", 20)
    server = BackgroundServer(create_app(ServerConfig(store=store, pages=Dashboard(StoreReader(store)))))
    url = server.start()
    try:
        assert httpx.get(url).status_code == 200
        plain = httpx.get(f"{url}/rollouts?status=succeeded").text
        assert "30 rollouts" in plain
        assert "filters applied to the newest" not in plain
        scanned = httpx.get(f"{url}/rollouts?agent=writer").text
        assert "10 rollouts" in scanned
        assert "filters applied to the newest 20 only" in scanned
        assert httpx.get(f"{url}/api/v1/stats").status_code == 200  # the store API beside it
    finally:
        server.stop()


def test_the_runs_agent_match_and_token_limit_decide_what_the_page_says_is_trained(
    run_dir: Path, tmp_path: Path
) -> None:
    from fulgor.training.run_report import write_run_info

    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "store.sqlite").write_bytes((run_dir / "store.sqlite").read_bytes())
    settings = {"agent_match": "^writer$", "max_trajectory_tokens": 12}
    write_run_info(copy, algorithm="grpo", hyperparameters=settings, model=None)
    process, url = start("dashboard", str(copy), "--port", "0")
    try:
        (checker,) = rollout_ids(httpx.get(f"{url}/rollouts?agent=checker&status=succeeded&per_page=1").text)
        (writer,) = rollout_ids(httpx.get(f"{url}/rollouts?agent=writer&status=succeeded&per_page=1").text)
        checker_page = html.unescape(httpx.get(f"{url}/rollouts/{checker}").text)
        writer_page = html.unescape(httpx.get(f"{url}/rollouts/{writer}").text)
    finally:
        process.terminate()
        assert process.wait(30) == 0
    assert checker_page.count("its agent is not one the run trains (agent_match)") == 3
    assert "trained; starts row 1" in writer_page
    assert (
        "cut off by max_trajectory_tokens (12)" in writer_page
        or "passes max_trajectory_tokens (12)" in writer_page
    )
