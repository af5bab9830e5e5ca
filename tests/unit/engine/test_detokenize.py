"""Incremental detokenisation: deltas add up to the full text, stop strings cut it."""

from __future__ import annotations

from typing import Any

from fulgor.engine.detokenize import TextTracker


def _ids(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


def test_deltas_add_up_to_the_decoded_text(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    text = "Héllo wörld, what is 12 + 30? ✓ done <tool_call>{}</tool_call>"
    tracker = TextTracker(tokenizer)
    deltas = []
    for token in _ids(tokenizer, text):
        assert tracker.push(token) is False
        deltas.append(tracker.take_delta())
    tracker.finish()
    deltas.append(tracker.take_delta(final=True))
    assert "".join(deltas) == text == tracker.text
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_across_tokens_cuts_the_text(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    tracker = TextTracker(tokenizer, stop=("STOP here",))
    hit_at = None
    ids = _ids(tokenizer, "The answer is 5. STOP here and more")
    for position, token in enumerate(ids):
        if tracker.push(token):
            hit_at = position
            break
    assert hit_at is not None
    assert hit_at < len(ids) - 1
    assert tracker.finish() == "The answer is 5. "
    assert tracker.stop_string == "STOP here"


def test_the_stop_string_that_matched_is_named(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    tracker = TextTracker(tokenizer, stop=("more", "answer"))
    assert tracker.stop_string is None
    for token in _ids(tokenizer, "The answer is 5, and more"):
        if tracker.push(token):
            break
    assert tracker.finish() == "The "
    assert tracker.stop_string == "answer"


def test_text_that_may_become_a_stop_string_is_held_back(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    tracker = TextTracker(tokenizer, stop=("###",))
    streamed = ""
    for token in _ids(tokenizer, "abc ##"):
        tracker.push(token)
        streamed += tracker.take_delta()
    assert not streamed.endswith("##")
    tracker.finish()
    assert streamed + tracker.take_delta(final=True) == "abc ##"


def test_special_tokens_are_not_text(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    tracker = TextTracker(tokenizer)
    for token in _ids(tokenizer, "ok<|im_end|>"):
        tracker.push(token)
    assert tracker.finish() == "ok"
