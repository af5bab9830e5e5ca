"""The dashboard in a real browser: headless Chromium (the OS package) driven by Playwright.

Every page loads without a console error and runs none of the markup the run recorded; filters and
pagination work from the form and the links; the token view shows the ids the store holds; a live
page picks up rollouts as they are written; the sign-in form lets a browser in. A screenshot of
each page goes to ``build/screenshots/`` (``FULGOR_SCREENSHOTS`` to put them elsewhere).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from tests.dashboard_support import make_run, start

from fulgor.dashboard import SqliteReader
from fulgor.store.sqlite import SqliteStore
from fulgor.testing.rollouts import write_rollouts
from fulgor.types import ModelCall

pytestmark = pytest.mark.browser
T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("FULGOR_SCREENSHOTS", ROOT / "build" / "screenshots"))
# Without the background-networking flags and the resolver rules Chromium keeps reaching for Google's
# hosts (tests/integration/test_loopback.py runs these tests under strace to keep it so).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    # No name is looked up: Chromium's own requests (autofill, updates) find no host.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]


def in_thread(function: Callable[[], T]) -> T:
    """``function()`` on a thread of its own: Playwright's sync API holds this thread's event loop,
    so the store's coroutines run (with asyncio.run) on another one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(function).result()


def chromium() -> str:
    named = os.environ.get("FULGOR_TEST_CHROMIUM")
    if named:
        if not Path(named).is_file():
            pytest.fail(f"FULGOR_TEST_CHROMIUM={named} does not exist")
        return named
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        message = (
            "no Chromium: apt-get install -y chromium (.ci/run installs it), or set FULGOR_TEST_CHROMIUM"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright_api = pytest.importorskip("playwright.sync_api")
    executable = chromium()
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    run_dir = tmp_path_factory.mktemp("browser") / "run"
    in_thread(lambda: make_run(run_dir, rollouts=120))
    process, url = start("dashboard", str(run_dir), "--port", "0")
    try:
        yield run_dir, url
    finally:
        process.terminate()
        process.wait(30)


class Watched:
    """A page whose console errors, uncaught exceptions and dialogs are collected."""

    def __init__(self, browser: Any) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.problems: list[str] = []
        self.page.on(
            "console", lambda m: self.problems.append(f"console: {m.text}") if m.type == "error" else None
        )
        self.page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        self.page.on(
            "dialog", lambda dialog: (self.problems.append(f"dialog: {dialog.message}"), dialog.dismiss())
        )

    def open(self, url: str) -> Any:
        response = self.page.goto(url)
        assert response is not None, url
        assert response.status == 200, url
        self.page.wait_for_load_state("load")
        return self.page

    def check(self) -> None:
        ran = self.page.evaluate("() => window.__xss === undefined")
        assert ran, "markup from the run was run as script"
        assert self.page.locator("main img").count() == 0, "markup from the run became an image element"
        assert self.page.locator("main b").count() == 0, "markup from the run became a bold element"
        assert not self.problems, self.problems


def newest_rollouts(watched: Watched, url: str, **query: str) -> list[str]:
    page = watched.open(f"{url}/rollouts?" + "&".join(f"{k}={v}" for k, v in query.items()))
    return [link.inner_text() for link in page.locator("a.rollout-link").all()]


def test_every_page_loads_without_errors_and_runs_nothing_recorded(
    browser: Any, run: tuple[Path, str]
) -> None:
    _, url = run
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    watched = Watched(browser)
    (newest,) = newest_rollouts(watched, url, per_page="1", status="succeeded", agent="checker")
    pages = {
        "runs": "/",
        "rollouts": "/rollouts",
        "rollout": f"/rollouts/{newest}",
        "resources": "/resources",
        "workers": "/workers",
        "drift": "/rollouts?step=2&problem=calls_missing_ids",
        "failed-rollout": f"/rollouts/{newest_rollouts(watched, url, per_page='1', status='failed')[0]}",
    }
    for name, path in pages.items():
        page = watched.open(url + path)
        for details in page.locator("details").all()[:3]:  # open span attributes too
            details.evaluate("d => d.open = true")
        watched.check()
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=name != "rollout")
    assert (SCREENSHOTS / "rollout.png").stat().st_size > 10_000
    # The markup is on the rollout page, as text.
    page = watched.open(url + pages["rollout"])
    assert "<script>window.__xss=1</script>" in page.locator("#task").inner_text()
    watched.check()


def test_filters_and_pagination_work_from_the_page(browser: Any, run: tuple[Path, str]) -> None:
    _, url = run
    watched = Watched(browser)
    page = watched.open(f"{url}/rollouts")
    assert page.locator("a.rollout-link").count() == 50
    page.select_option("select[name=status]", ["failed"])
    page.click("#apply")
    page.wait_for_load_state("load")
    statuses = {cell.inner_text() for cell in page.locator("#rollout-rows .status").all()}
    assert statuses == {"failed"}
    assert page.locator("a.rollout-link").count() == len([i for i in range(120) if i % 9 == 8])
    page = watched.open(f"{url}/rollouts?per_page=50")
    first = [a.inner_text() for a in page.locator("a.rollout-link").all()]
    page.click("#next-page")
    page.wait_for_load_state("load")
    second = [a.inner_text() for a in page.locator("a.rollout-link").all()]
    assert len(second) == 50
    assert not set(first) & set(second)
    page.click("#next-page")
    page.wait_for_load_state("load")
    assert page.locator("a.rollout-link").count() == 122 - 100
    assert page.locator("#next-page").count() == 0
    page.fill("input[name=reward_min]", "0.8")
    page.select_option("select[name=status]", [])
    page.select_option("select[name=sort]", "reward_desc")
    page.click("#apply")
    page.wait_for_load_state("load")
    rewards = [float(t) for t in page.locator("#rollout-rows td.num:nth-child(6)").all_inner_texts()]
    assert rewards
    assert rewards == sorted(rewards, reverse=True)
    assert min(rewards) >= 0.8
    watched.check()


def test_the_token_view_shows_the_ids_the_store_holds(browser: Any, run: tuple[Path, str]) -> None:
    run_dir, url = run
    watched = Watched(browser)
    (plain,) = newest_rollouts(watched, url, per_page="1", status="succeeded", mode="train", agent="writer")
    # Rollout 104 (step 7) is a train rollout whose first call came without token ids.
    (missing,) = newest_rollouts(watched, url, step="7", problem="calls_missing_ids")

    async def stored(rollout_id: str) -> list[ModelCall]:
        reader = SqliteReader(run_dir / "store.sqlite")
        try:
            spans = await reader.query_spans(rollout_id)
        finally:
            await reader.close()
        return [
            ModelCall.model_validate(s.attributes["fulgor.model_call"])
            for s in spans
            if s.name == "fulgor.model_call"
        ]

    for rollout_id in (plain, missing):
        page = watched.open(f"{url}/rollouts/{rollout_id}")
        calls = in_thread(lambda rollout_id=rollout_id: asyncio.run(stored(rollout_id)))
        assert len(calls) == page.locator("section.call").count() == 3
        for index, call in enumerate(calls):
            section = page.locator(f"#call-{index}")
            prompt = section.locator(".prompt-tokens .tok").evaluate_all(
                "els => els.map(e => Number(e.dataset.id))"
            )
            response = section.locator(".response-tokens .tok").evaluate_all(
                "els => els.map(e => Number(e.dataset.id))"
            )
            assert (prompt, response) == (call.prompt_token_ids or [], call.response_token_ids or [])
            assert section.locator(".ids-missing").count() == (1 if call.token_ids_missing else 0)
            shaded = section.locator(".response-tokens .tok").evaluate_all(
                "els => els.filter(e => e.style.background).length"
            )
            assert shaded == len(response)  # every sampled token carries its logprob's shade
        # A later call extends an earlier one's row: its prompt starts with tokens the row holds.
        assert page.locator("section.call .prompt-tokens .tok-seen").count() > 0
        watched.check()
    assert any(c.token_ids_missing for c in in_thread(lambda: asyncio.run(stored(missing))))


def test_a_live_page_shows_rollouts_as_they_are_written(browser: Any, run: tuple[Path, str]) -> None:
    run_dir, url = run
    watched = Watched(browser)
    page = watched.open(f"{url}/rollouts?mode=train&per_page=10")
    before = page.locator("a.rollout-link").first.inner_text()

    async def write() -> str:
        store = SqliteStore(run_dir / "store.sqlite")
        try:
            (added,) = await write_rollouts(store, 1, seed=7, start_time=1_900_000_000.0)
        finally:
            await store.close()
        return added

    added = in_thread(lambda: asyncio.run(write()))
    page.wait_for_function(
        "id => document.querySelector('a.rollout-link').textContent === id", arg=added, timeout=15_000
    )
    assert before != added
    watched.check()


def test_the_sign_in_form_lets_a_browser_in(browser: Any, run: tuple[Path, str], tmp_path: Path) -> None:
    run_dir, _ = run
    token_file = tmp_path / "token"
    token_file.write_text("browser-token")
    process, url = start("dashboard", str(run_dir), "--port", "0", "--token-file", str(token_file))
    try:
        watched = Watched(browser)
        page = watched.page
        page.goto(f"{url}/workers")
        assert page.url.startswith(f"{url}/login")
        page.fill("#token", "wrong")
        page.click("button[type=submit]")
        assert page.locator("#login-failed").is_visible()
        watched.problems.clear()  # the browser logs the 403 of a wrong token
        page.fill("#token", "browser-token")
        page.click("button[type=submit]")
        page.wait_for_url(f"{url}/workers")
        assert page.locator("table.workers").is_visible()
        watched.check()
    finally:
        process.terminate()
        process.wait(30)
