"""What each data.format asks of a run before its first step: the tokenizer and model it trains,
and the token cache it reads.

Both formats hand the loop the same batches: ids x (B, T) and targets y holding IGNORE where nothing
is learned (text: nowhere; conversations: everything but the answers). So the loop, the evaluation
and the reports never ask which format they train on: this table is the one place that knows.
Conversations first fit the tokenizer and the model to a chat template (conversations/sft.py: the
template of the pretrained model, or ChatML's tokens added to its vocabulary).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import Config
from ..conversations.cache import prepare_chat_data
from ..conversations.sft import chat_model
from ..corpus.prepare import prepare_data


@dataclass(frozen=True)
class DataFormat:
    """fit(cfg, pretrained, tokenizer, resumed run_dir or None, log) -> (pretrained, tokenizer);
    prepare(cfg.data, tokenizer, log) -> the data the loop reads (TokenData or ChatData)."""

    fit: Callable
    prepare: Callable


def _as_it_is(cfg, pretrained, tokenizer, run_dir, log):
    return pretrained, tokenizer  # text asks nothing of the tokenizer or the model


FORMATS = {
    "text": DataFormat(_as_it_is, lambda data_cfg, tok, log: prepare_data(data_cfg, tok, log=log)),
    "chat": DataFormat(
        chat_model, lambda data_cfg, tok, log: prepare_chat_data(data_cfg, tok, tok.chat_template, log=log)
    ),
}


def data_format(cfg: Config) -> DataFormat:
    return FORMATS[cfg.data.format]
