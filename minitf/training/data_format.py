"""What each data.format asks of a run before its first step: the tokenizer and model it trains,
and the token cache it reads.

Every format hands the loop the same batches: ids x (B, T) and targets y holding IGNORE where
nothing is learned (text: nowhere; conversations: everything but the answers); rl's are answers the
model sampled, and carry each one's advantage too (B,), which the step weighs its tokens by. So the
loop, the evaluation and the reports never ask which format they train on: this table is the one
place that knows. Conversations first fit the tokenizer and the model to a chat template
(conversations/sft.py: the template of the pretrained model, or ChatML's tokens added to its vocabulary).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import Config
from ..conversations.cache import prepare_chat_data
from ..conversations.sft import chat_model
from ..corpus.prepare import prepare_data
from ..rl.rollouts import RolloutData


@dataclass(frozen=True)
class DataFormat:
    """fit(cfg, pretrained, tokenizer, resumed run_dir or None, log) -> (pretrained, tokenizer);
    prepare(cfg, tokenizer, log) -> the data the loop reads (TokenData, ChatData or RolloutData)."""

    fit: Callable
    prepare: Callable


def _as_it_is(cfg, pretrained, tokenizer, run_dir, log):
    return pretrained, tokenizer  # text asks nothing of the tokenizer or the model


def _conversations(cfg, tok, log):
    return prepare_chat_data(cfg.data, tok, tok.chat_template, log=log)


FORMATS = {
    "text": DataFormat(_as_it_is, lambda cfg, tok, log: prepare_data(cfg.data, tok, log=log)),
    "chat": DataFormat(chat_model, _conversations),
    # the same conversations' questions, answered by the model being trained and rewarded (rl/rollouts.py)
    "rl": DataFormat(chat_model, lambda cfg, tok, log: RolloutData(_conversations(cfg, tok, log), cfg, log)),
}


def data_format(cfg: Config) -> DataFormat:
    return FORMATS[cfg.data.format]
