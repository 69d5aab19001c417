"""Conversations -> token cache with a loss mask (`prepare_chat_data`), once per corpus, tokenizer
and template.

Each conversation is checked (conversations.py), rendered with the chat template and tokenized
once; each split is stored as three flat files beside meta.json:

    train.bin    the conversations' token ids, one after another
    train.mask   one byte per token: 1 where training learns it (the assistant's tokens)
    train.idx    per conversation: where it starts, its longest turn, and where it came from
                 (file and line, or dataset row), so a problem found later names its line

and questions.jsonl: held-out conversations with an answer to check (a line's "answer"; every
conversation of the generated corpus), up to their last question, which train.eval_metric asks;
prompts.jsonl: the training ones, which reinforcement learning answers (data.format=rl).

Conversations are streamed a batch at a time, so memory stays bounded whatever the corpus size;
the directory is built under a temporary name and renamed when complete, as text caches are.
Conversation i is held out for val by the same even spread as documents (corpus/split.py);
with data.val_fraction=0 none is, and the val numbers are the training conversations' own.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..chat_template import ChatTemplate
from ..config import DataConfig
from ..corpus.sources import Source, cache_dir, load_hf
from ..corpus.split import val_rule
from ..corpus.token_cache import cache_build, progress
from ..data import SPLITS, CacheError, token_dtype
from ..errors import MinitfError
from ..system.runtime import give_back_freed_memory
from ..tokenizer import Tokenizer
from .data import INDEX, PROMPTS, QUESTIONS, ChatData
from .rules import BadConversation, Skipped, check_messages, check_question, jsonl_conversations

FORMAT = 7  # bump when the layout or the ids change, so old caches rebuild (6: questions and every prompt)
FLUSH = 4096  # conversations buffered per split before they are appended to its files


def prepare_chat_data(cfg: DataConfig, tokenizer: Tokenizer, template: ChatTemplate, log=print) -> ChatData:
    """Build, or reuse, the chat token cache of cfg.source under cache_dir()/chat-tokens/<key>/."""
    source = Source(cfg, log)
    key = {
        "format": FORMAT,
        "source": cfg.source,
        "fingerprint": source.fingerprint,
        "val_fraction": cfg.val_fraction,
        "max_documents": cfg.max_documents,
        "tokenizer": tokenizer.hash,
        "template": hashlib.sha256(template.source.encode()).hexdigest(),
        "skip_invalid": cfg.skip_invalid,
    }
    out = cache_dir() / "chat-tokens" / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    if (out / "meta.json").is_file():
        try:
            data = ChatData(out, tokenizer, log, skip_long=cfg.skip_invalid)
            log(f"data: reusing the chat token cache {out}")
            return data
        except CacheError as e:
            log(f"data: the chat token cache {out} is damaged ({e.why}); building it again")
            shutil.rmtree(out, ignore_errors=True)
    _build(_conversations(source, cfg, log), cfg, tokenizer, template, out, key, log)
    return ChatData(out, tokenizer, log, skip_long=cfg.skip_invalid)


def _conversations(source: Source, cfg: DataConfig, log) -> Iterator[tuple[str, object, str | None]]:
    """(where, messages, answer) of every conversation of the source, in order, up to
    data.max_documents; answer: what counts as right for its last question, where one is given."""

    def every():
        if source.kind == "hf":
            ds = load_hf(source.spec, cfg, source.local, column="messages", text=False)
            columns = ["messages", "answer"] if "answer" in ds.column_names else ["messages"]
            for row, batch in enumerate(ds.select_columns(columns).iter(batch_size=256)):
                answers = batch.get("answer") or [None] * len(batch["messages"])
                for i, (m, answer) in enumerate(zip(batch["messages"], answers)):
                    yield f"{cfg.source} row {row * 256 + i}", m, answer if isinstance(answer, str) else None
            return
        if source.kind not in ("file", "chat"):
            raise MinitfError(
                f"data.format=chat reads conversations; data.source={cfg.source} is text (use chat, "
                f"file:<JSONL files> or hf:<dataset with a messages column>)"
            )
        for path in source.files:
            yield from jsonl_conversations(path)

    for n, item in enumerate(every()):
        if cfg.max_documents is not None and n >= cfg.max_documents:
            return
        yield item


def _build(conversations, cfg: DataConfig, tok: Tokenizer, template: ChatTemplate, out: Path, key: dict, log) -> None:
    t0, dtype = time.perf_counter(), token_dtype(tok.vocab_size)
    with cache_build(out) as tmp:
        writers = {s: _SplitWriter(tmp, s, dtype) for s in SPLITS}
        skipped, is_val, origins = Skipped(), val_rule(None, cfg.val_fraction), _Origins()
        questions, generated = _Questions(cfg.val_fraction), cfg.source == "chat"  # its answers are all exact
        with progress(None, "tokenizing conversations") as bar:
            for i, (where, messages, answer) in enumerate(conversations):
                split = "val" if cfg.val_fraction > 0 and is_val(i) else "train"
                try:
                    if cfg.format == "rl" and _asks(messages):  # a question alone: RL answers it, none to imitate
                        questions.add(check_question(messages, where), answer, split)
                        continue
                    messages = check_messages(messages, where)
                except BadConversation as bad:
                    if not cfg.skip_invalid:
                        raise
                    skipped.add(bad)
                    continue
                ids, learned = template.encode_conversation(tok, messages)
                answers = sum(len(m["content"].encode("utf-8")) for m in messages if m["role"] == "assistant")
                writers[split].add(ids, learned, _longest_turn(learned), origins.of(where), answers)
                questions.add(messages[:-1], messages[-1]["content"] if generated else answer, split)
                bar.update(len(ids))
        splits = {s: w.close() for s, w in writers.items()}
        if skipped and not any(counts["conversations"] for counts in splits.values()):  # why: the reasons
            raise MinitfError(
                f"data.source={cfg.source}: every conversation was skipped as invalid: {skipped.summary()}; "
                f"fix the file (one OpenAI-style messages object per line)"
            )
        for s, counts in splits.items():
            if not counts["conversations"] and (s == "train" or cfg.val_fraction > 0):
                whole = " whole (with its answer, whose loss evaluation measures)" if cfg.format == "rl" else ""
                raise MinitfError(
                    f"data.source={cfg.source}: the {s} split holds no{whole} conversation; give more conversations "
                    f"or another data.val_fraction"
                )
        meta = {**key, "vocab_size": tok.vocab_size, "dtype": dtype.name, "splits": splits, "files": origins.files}
        meta["skipped"], meta["questions"] = dict(skipped), questions.save(tmp)
        tok.save(tmp / "tokenizer.json")
        template.save(tmp)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    give_back_freed_memory()
    if skipped:
        log(f"data: {skipped.summary()}")
    tr, va = splits["train"], splits["val"]
    log(
        f"data: tokenized {tr['conversations'] + va['conversations']:,} conversations in "
        f"{time.perf_counter() - t0:.1f} s: train {tr['conversations']:,} ({tr['tokens']:,} tokens, "
        f"{tr['learned']:,} learned), val {va['conversations']:,} ({va['tokens']:,}, {va['learned']:,})"
    )


class _Questions:
    """Conversations up to their last question, with the answer to check (the line's "answer"; for
    the generated corpus, the conversation's own last answer): the held-out ones that give one,
    which evaluation asks (at most KEPT), and every training one, the prompts RL answers
    (data.format=rl; "answer" None where the line gives none: a reward of your own may need none).
    With data.val_fraction=0 nothing is held out, and evaluation asks the training ones."""

    KEPT = {"val": 1000, "train": 200_000}  # each evaluation asks the first 100 (conversations/metrics.py)

    def __init__(self, val_fraction: float):
        self.val_fraction, self.kept = val_fraction, {"val": [], "train": []}

    def add(self, question: list[dict], answer: str | None, split: str) -> None:
        """question: the conversation up to and with the question, the user's message."""
        for s in (split, "val") if self.val_fraction == 0 else (split,):
            if len(self.kept[s]) < self.KEPT[s] and (answer is not None or s == "train"):
                self.kept[s].append({"messages": question, "answer": answer})

    def save(self, folder: Path) -> dict[str, int]:
        for split, name in (("val", QUESTIONS), ("train", PROMPTS)):
            (folder / name).write_text("".join(json.dumps(q) + "\n" for q in self.kept[split]), encoding="utf-8")
        return {split: len(kept) for split, kept in self.kept.items()}


def _asks(messages) -> bool:
    """Whether a line's messages end with the user's question (a prompt, with no answer to imitate)."""
    return (
        isinstance(messages, list)
        and bool(messages)
        and isinstance(messages[-1], dict)
        and messages[-1].get("role") == "user"
    )


def _longest_turn(learned: list[bool]) -> int:
    """Tokens of the longest run of one kind (context or learned): a turn, roughly, and what must fit."""
    longest = run = 0
    for i, flag in enumerate(learned):
        run = run + 1 if i and flag == learned[i - 1] else 1
        longest = max(longest, run)
    return longest


class _Origins:
    """Where each conversation came from, as (file number, line): file names are kept once."""

    def __init__(self):
        self.files: list[str] = []
        self._number: dict[str, int] = {}

    def of(self, where: str) -> tuple[int, int]:
        name, _, line = where.rpartition(":") if " row " not in where else where.rpartition(" row ")
        if name not in self._number:
            self._number[name] = len(self.files)
            self.files.append(name)
        return self._number[name], int(line)


class _SplitWriter:
    """Appends conversations to <split>.bin, .mask and .idx, FLUSH at a time."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype):
        self.paths = [folder / f"{split}{ext}" for ext in (".bin", ".mask", ".idx")]
        for p in self.paths:
            p.touch()
        self.dtype, self.ids, self.masks, self.rows = dtype, [], [], []
        self.tokens = self.learned = self.conversations = self.bytes = 0

    def add(self, ids: list[int], learned: list[bool], longest: int, origin: tuple[int, int], nbytes: int) -> None:
        self.rows.append((self.tokens, len(ids), longest, *origin))
        self.ids.append(np.asarray(ids, self.dtype))
        self.masks.append(np.asarray(learned, np.uint8))
        self.tokens += len(ids)
        self.learned += sum(learned)
        self.conversations += 1
        self.bytes += nbytes
        if len(self.rows) >= FLUSH:
            self._flush()

    def _flush(self) -> None:
        if not self.rows:
            return
        for path, arrays in zip(self.paths[:2], (self.ids, self.masks)):
            with open(path, "ab") as f:
                np.concatenate(arrays).tofile(f)
        with open(self.paths[2], "ab") as f:
            np.array(self.rows, INDEX).tofile(f)
        self.ids, self.masks, self.rows = [], [], []

    def close(self) -> dict:
        self._flush()
        return {
            "tokens": self.tokens,
            "learned": self.learned,
            "conversations": self.conversations,
            "bytes": self.bytes,  # of the answers' text: bits per byte are of what is learned
        }
