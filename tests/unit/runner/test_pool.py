"""The process pool's checks in the parent, before any runner process starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fulgor.errors import ConfigError
from fulgor.runner.pool import RunnerPool, load_agent

AGENT = "tests.integration.sample_agents.slow_agent:sleeper"


@pytest.mark.parametrize(
    ("store_url", "message"),
    [
        ("foo://", "unknown store URL"),
        ("http://", "must look like http://HOST:PORT"),
        ("sqlite:///", "names no file"),
    ],
)
def test_a_bad_store_url_is_one_error_in_the_parent(store_url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunnerPool(AGENT, store_url)


def test_a_good_store_url_passes_the_check(tmp_path: Path) -> None:
    RunnerPool(AGENT, f"sqlite:///{tmp_path}/store.sqlite")
    assert (tmp_path / "store.sqlite").exists()


def test_agents_in_the_current_directory_are_found_without_it_on_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed ``fulgor`` script puts its own folder first on sys.path, not the current one."""
    (tmp_path / "fulgor_cwd_agent.py").write_text(
        "import fulgor\n\n@fulgor.rollout\ndef solve(task):\n    return 1.0\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "fulgor_cwd_agent", raising=False)
    assert load_agent("fulgor_cwd_agent:solve").name == "solve"
    assert sys.path[-1] == str(tmp_path)


def test_a_store_url_the_backend_cannot_parse_is_shown_without_its_password() -> None:
    with pytest.raises(ConfigError, match="Invalid IPv6") as refused:
        RunnerPool(AGENT, "postgresql://user:s3cret@[::1/db")
    assert "s3cret" not in str(refused.value)
    assert "user:***@" in str(refused.value)
