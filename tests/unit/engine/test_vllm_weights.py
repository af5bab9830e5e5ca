"""The view of a checkpoint vLLM's in-place reload reads: tied word embeddings made explicit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from fulgor.engine._vllm_weights import reload_view  # noqa: E402

EMBED = "model.embed_tokens.weight"


def _checkpoint(path: Path, tensors: dict[str, object], tied: bool, *, index: bool = False) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"tie_word_embeddings": tied}))
    (path / "tokenizer.json").write_text("{}")
    safetensors_torch.save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    if index:
        weight_map = {name: "model.safetensors" for name in tensors}
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return path


def _weights() -> dict[str, object]:
    generator = torch.Generator().manual_seed(0)
    return {
        EMBED: torch.randn(7, 3, generator=generator),
        "model.norm.weight": torch.randn(3, generator=generator).to(torch.bfloat16),
    }


def test_tied_embeddings_get_an_lm_head_of_their_own(tmp_path: Path) -> None:
    weights = _weights()
    checkpoint = _checkpoint(tmp_path / "step-1", weights, tied=True)
    view = reload_view(checkpoint, tmp_path / "scratch" / "weights")
    assert view == tmp_path / "scratch" / "weights"
    assert sorted(p.name for p in view.iterdir()) == sorted(
        ["config.json", "tokenizer.json", "model.safetensors", "lm_head.safetensors"]
    )
    assert (view / "model.safetensors").resolve() == (checkpoint / "model.safetensors").resolve()
    head = safetensors_torch.load_file(view / "lm_head.safetensors")
    assert list(head) == ["lm_head.weight"]
    assert torch.equal(head["lm_head.weight"], weights[EMBED])
    # A second reload replaces the view (vLLM reads the newest weights, not a mix).
    again = _weights()
    again[EMBED] = again[EMBED] * 2  # type: ignore[operator]
    reload_view(_checkpoint(tmp_path / "step-2", again, tied=True), view)
    assert torch.equal(
        safetensors_torch.load_file(view / "lm_head.safetensors")["lm_head.weight"], again[EMBED]
    )
    assert (view / "model.safetensors").resolve() == (tmp_path / "step-2" / "model.safetensors").resolve()


def test_an_index_names_the_lm_head_file(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path / "step-1", _weights(), tied=True, index=True)
    view = reload_view(checkpoint, tmp_path / "view")
    index = json.loads((view / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["lm_head.weight"] == "lm_head.safetensors"
    assert index["weight_map"][EMBED] == "model.safetensors"
    assert not (view / "model.safetensors.index.json").is_symlink()


def test_untied_or_explicit_heads_are_read_as_they_are(tmp_path: Path) -> None:
    untied = _checkpoint(tmp_path / "untied", _weights(), tied=False)
    assert reload_view(untied, tmp_path / "view") == untied
    explicit = _checkpoint(
        tmp_path / "explicit", {**_weights(), "lm_head.weight": torch.zeros(7, 3)}, tied=True
    )
    assert reload_view(explicit, tmp_path / "view") == explicit
    assert not (tmp_path / "view").exists()


def test_a_truncated_checkpoint_is_an_error(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path / "step-1", _weights(), tied=True)
    data = (checkpoint / "model.safetensors").read_bytes()
    (checkpoint / "model.safetensors").write_bytes(data[:-40])
    with pytest.raises(OSError, match="damaged"):
        reload_view(checkpoint, tmp_path / "view")
