"""Small causal language models and tokenizers built on this machine, saved in Hugging Face format.

Model hubs are often out of reach (air-gapped clusters, CI, laptops on a train), yet the engine,
the gateway and the trainers need a real model to run end to end. ``init_model`` trains a byte-level
BPE tokenizer with the ``tokenizers`` package on a synthetic corpus, builds a randomly initialised
Llama or Qwen2 model through ``transformers`` and saves both with a chat template that supports
tools. The result is an ordinary Hugging Face directory: the engine loads it through the same code
as downloaded weights (:mod:`fulgor.weights.loading`).

This module knows nothing about serving.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fulgor.engine.template import CHAT_TEMPLATE, END_OF_TEXT, IM_END, SPECIAL_TOKENS, TEXT_MARKERS
from fulgor.weights.errors import ModelLoadError
from fulgor.weights.loading import no_progress_bars, require_torch, require_transformers

__all__ = ["MODEL_SIZES", "Architecture", "ModelSize", "ModelSpec", "init_model", "train_tokenizer"]

logger = logging.getLogger(__name__)

ModelSize = Literal["tiny", "small"]
Architecture = Literal["llama", "qwen2"]


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a locally built model (``vocab_size`` is the most the tokenizer may learn: it stops
    earlier when its corpus offers no more merges)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int


MODEL_SIZES: dict[str, ModelSpec] = {
    # Under 1M parameters: fast enough for tests and the CPU demo. Two layers, not more: at this
    # width a deeper model takes far longer to learn to copy (tokens from the prompt into its reply).
    "tiny": ModelSpec(2048, 128, 512, 2, 8, 8, 2048),
    # About 7M parameters: still trains on a laptop CPU, shows learning curves more clearly.
    "small": ModelSpec(4096, 256, 1024, 6, 8, 4, 4096),
}

_WORDS = [
    "the",
    "a",
    "an",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "zero",
    "number",
    "sum",
    "total",
    "result",
    "answer",
    "add",
    "subtract",
    "multiply",
    "divide",
    "plus",
    "minus",
    "times",
    "over",
    "equals",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "has",
    "have",
    "had",
    "what",
    "which",
    "who",
    "where",
    "when",
    "why",
    "how",
    "please",
    "compute",
    "calculate",
    "find",
    "give",
    "tell",
    "show",
    "me",
    "you",
    "we",
    "they",
    "it",
    "this",
    "that",
    "these",
    "those",
    "and",
    "or",
    "not",
    "no",
    "yes",
    "if",
    "then",
    "else",
    "for",
    "with",
    "without",
    "of",
    "to",
    "in",
    "on",
    "at",
    "by",
    "from",
    "question",
    "problem",
    "step",
    "first",
    "second",
    "next",
    "last",
    "final",
    "so",
    "because",
    "therefore",
    "use",
    "call",
    "tool",
    "function",
    "query",
    "table",
    "row",
    "column",
    "value",
    "name",
    "id",
    "user",
    "assistant",
    "system",
    "search",
    "read",
    "write",
    "open",
    "file",
    "text",
    "city",
    "country",
    "river",
    "book",
    "store",
    "apple",
    "orange",
    "price",
    "cost",
    "each",
    "more",
    "less",
    "than",
    "many",
    "much",
    "few",
    "all",
    "hello",
    "thanks",
    "sure",
    "here",
    "let",
    "think",
    "check",
    "again",
    "done",
    "error",
    "ok",
    "true",
    "false",
    "null",
    "list",
    "item",
    "order",
]

_TOOL_NAMES = ("calculator", "add", "multiply", "search", "lookup", "get_weather", "run_sql", "read_file")


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice((".", "?", "!", "."))


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    op, value = rng.choice((("+", a + b), ("-", a - b), ("*", a * b)))
    return f"What is {a} {op} {b}? The answer is {value}."


def _tool_call(rng: random.Random) -> str:
    name = rng.choice(_TOOL_NAMES)
    arguments = {rng.choice(("a", "b", "x", "expression", "query", "city")): rng.randint(0, 99)}
    call = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{call}\n</tool_call>\n<tool_response>\n{rng.randint(0, 9999)}\n</tool_response>"


def _chat(rng: random.Random) -> str:
    return (
        f"<|im_start|>user\n{_sentence(rng)}<|im_end|>\n"
        f"<|im_start|>assistant\n{_sentence(rng)}<|im_end|>\n<|endoftext|>"
    )


def corpus_lines(count: int, seed: int = 0) -> Iterator[str]:
    """Deterministic synthetic text: sentences, arithmetic, JSON tool calls and chat turns."""
    rng = random.Random(seed)
    makers = (_sentence, _arithmetic, _tool_call, _chat)
    for maker in itertools.islice(itertools.cycle(makers), count):
        yield maker(rng)


def train_tokenizer(vocab_size: int, seed: int = 0, corpus: Iterable[str] = ()) -> Any:
    """Train a byte-level BPE ``tokenizers.Tokenizer`` with fulgor's special tokens and tool markers.

    It learns from the synthetic corpus followed by ``corpus`` (the user's own texts).
    """
    require_torch()
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    # A number stands apart from the space before it and is cut into chunks of at most two digits
    # from the left, so it gets the same ids wherever it stands, and every number is made of the
    # same hundred-odd frequent tokens: copying it (from a question into a tool call, from a tool
    # result into an answer) is copying ids the model has seen many times, even for a number it
    # has never seen whole.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d{1,2}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TEXT_MARKERS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(itertools.chain(corpus_lines(20_000, seed), corpus), trainer=trainer)
    tokenizer.add_tokens(list(TEXT_MARKERS))
    return tokenizer


def _fast_tokenizer(spec: ModelSpec, seed: int, corpus: Iterable[str]) -> Any:
    transformers = require_transformers()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(spec.vocab_size, seed, corpus),
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# The tokens that end a turn or a text in the families whose tokenizers fulgor has met; a model built
# on a real tokenizer stops on every one of them that the tokenizer holds.
_END_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<eos>",
    "</s>",
)


def _end_ids(tokenizer: Any) -> list[int]:
    """The tokenizer's end-of-sequence id first, then the other end tokens it holds."""
    vocabulary = tokenizer.get_vocab()
    first = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    found = [vocabulary[token] for token in _END_TOKENS if token in vocabulary]
    return list(dict.fromkeys(first + found))


def _read_tokenizer(folder: Path) -> Any:
    transformers = require_transformers()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # transformers raises many kinds for missing or broken tokenizer files
        raise ModelLoadError(
            f"cannot load a tokenizer from --tokenizer {folder}: {exc}; pass a directory with "
            "tokenizer.json and tokenizer_config.json"
        ) from exc
    if not _end_ids(tokenizer):
        raise ModelLoadError(f"the tokenizer in {folder} names no end-of-sequence token; a model needs one")
    return tokenizer


def _model_config(spec: ModelSpec, arch: Architecture, tokenizer: Any) -> Any:
    from transformers import LlamaConfig, Qwen2Config

    config_class = LlamaConfig if arch == "llama" else Qwen2Config
    eos_ids = _end_ids(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    return config_class(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_ids,
        pad_token_id=pad,
    )


def init_model(
    out_dir: str | Path,
    size: ModelSize = "tiny",
    *,
    arch: Architecture = "llama",
    seed: int = 0,
    corpus: Iterable[str] = (),
    tokenizer: str | Path | None = None,
) -> Path:
    """Build a randomly initialised causal LM and its tokenizer in ``out_dir`` (Hugging Face format).

    ``size`` picks a shape from :data:`MODEL_SIZES`; ``arch`` picks the transformers architecture.
    ``corpus`` adds texts of the task at hand to the tokenizer's training data, so that its prompts
    take fewer tokens (on a CPU, fewer tokens is faster training). The same ``seed`` and ``corpus``
    give the same tokenizer and the same weights. ``tokenizer`` names a directory holding a real
    model's tokenizer files instead: the model is built on that tokenizer and its chat template
    (random weights, so nothing it says makes sense, but every id and template is the family's own).
    Returns the directory.
    """
    if tokenizer is not None and corpus:
        raise ModelLoadError("--corpus trains fulgor's own tokenizer; it does not apply with --tokenizer")
    if size not in MODEL_SIZES:
        raise ModelLoadError(f"unknown model size {size!r}; choose one of {sorted(MODEL_SIZES)}")
    if arch not in ("llama", "qwen2"):
        raise ModelLoadError(f"unknown architecture {arch!r}; choose 'llama' or 'qwen2'")
    torch = require_torch()
    transformers = require_transformers()
    out = _output_directory(Path(out_dir))
    spec = MODEL_SIZES[size]
    built = _read_tokenizer(Path(tokenizer)) if tokenizer is not None else _fast_tokenizer(spec, seed, corpus)
    config = _model_config(spec, arch, built)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=True
    )
    with no_progress_bars():
        model.save_pretrained(out)
    built.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    logger.info("built a %s %s model with %d parameters in %s", size, arch, params, out)
    return out


def _output_directory(out: Path) -> Path:
    """``out``, created and writable: checked before any work, so a bad --out fails at once."""
    if (out / "config.json").exists():
        raise ModelLoadError(f"{out} already holds a model; pick an empty --out directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelLoadError(
            f"cannot create the directory {out}: {exc.strerror}; pass --out a new or empty directory"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ModelLoadError(f"cannot write into {out}; pass --out a directory you can write to")
    return out
