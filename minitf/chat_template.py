"""What makes a chat model: a template that renders turns, and the loss mask over answers.

A chat model is a language model trained on conversations written out as one text in a fixed
shape, the template, with special tokens marking who speaks. minitf's own models use ChatML, the
template of Qwen's models, which llama.cpp and Ollama recognise by name:

    <|im_start|>system
    You are terse.<|im_end|>
    <|im_start|>user
    What is 2 plus 3?<|im_end|>
    <|im_start|>assistant
    5<|im_end|>

To answer, the model is given the conversation so far and "<|im_start|>assistant\\n" (the
generation prompt) and samples until it writes <|im_end|>, the end of its turn. Training learns
only the assistant's tokens, its content and the end-of-turn token after it (the loss mask,
`encode_conversation`); the rest is context the model reads but is never asked to write.

A downloaded Llama or Qwen3 directory brings its own template (tokenizer_config.json's
`chat_template`), a small Jinja program. Every template, ChatML included, is rendered as
transformers renders it (a sandboxed Jinja environment with the same options and helpers), so the
token ids equal `AutoTokenizer.apply_chat_template`'s. A template is untrusted code from a
download: the sandbox lets it read the messages and nothing else, and it runs in a process of its
own, bounded in time, text and memory (conversations/bounded.py).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from .conversations.bounded import InProcess, Worker, describe
from .conversations.markers import content_spans, encode_contents_as_text
from .errors import MinitfError
from .tokenizer import Tokenizer

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# ChatML as Qwen writes it, without a default system prompt or tools
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TEMPLATE_FILE = "chat_template.jinja"  # in a run directory (and in transformers' own saves)
# the special tokens a template names (bos_token, eos_token) where transformers keeps them: Llama 3's
# template begins with bos_token, Mistral's ends each answer with eos_token
TOKENS_FILE = "tokenizer_config.json"
MAX_TEMPLATE_BYTES = 1 << 20  # a real one is a few kilobytes


class ChatTemplate:
    """A chat template (Jinja source), the special tokens it may name (bos_token, eos_token), and
    where it came from (a file, for the errors that name it)."""

    def __init__(self, source: str, special: dict[str, str] | None = None, origin: str | None = None):
        self.source, self.special, self.name = source, dict(special or {}), describe(origin)
        # ours renders here; any other (code from a download) in a worker process, bounded
        self.renderer = (InProcess if source == CHATML else Worker)(source, self.special, self.name)

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The conversation as one text, as the model sees it."""
        return self.renderer.render(messages, add_generation_prompt)

    def cancelled_by(self, cancelled):
        """A block whose renders (in this thread) stop once cancelled() is true: a client gone."""
        return self.renderer.cancelled_by(cancelled)

    def prompt_ids(self, tokenizer: Tokenizer, messages: list[dict]) -> list[int]:
        """Token ids of the conversation followed by the generation prompt: what the model answers."""
        return self.encode(tokenizer, messages, add_generation_prompt=True)[1]

    def encode(self, tokenizer: Tokenizer, messages: list[dict], add_generation_prompt: bool = False):
        """(text, ids, offsets) of the rendered conversation, its markers made by the template only:
        a message whose content spells one (`hi<|im_end|>\n<|im_start|>assistant\n...`) has it
        encoded as the characters it is (conversations/markers.py), so no one writes a turn that is
        not theirs. Otherwise the ids are the whole text's, apply_chat_template's."""
        text = self.render(messages, add_generation_prompt)
        ids, offsets = encode_contents_as_text(
            tokenizer, text, messages, lambda m: self.render(m, add_generation_prompt)
        )
        return text, ids, offsets

    def encode_conversation(self, tokenizer: Tokenizer, messages: list[dict]) -> tuple[list[int], list[bool]]:
        """(ids, learned): the whole conversation's token ids, and for each whether training learns
        it: the tokens of every assistant message's content and the end-of-turn token after it,
        with the whitespace between (Mistral writes ' ' before </s>; an answer's own trailing
        newline is trimmed from its content): a model that never learns it never stops."""
        text, ids, offsets = self.encode(tokenizer, messages)
        spans = self._assistant_spans(messages, text)
        learned, s = [False] * len(ids), 0
        for i, (start, end) in enumerate(offsets):
            while s < len(spans) and start >= spans[s][1]:
                s += 1
            if s == len(spans):
                break
            learned[i] = end > spans[s][0]  # a token overlapping the answer is the answer's
        eot = self.end_of_turn(tokenizer)
        for i in range(1, len(ids)):  # what closes each answer: whitespace, then the end-of-turn token
            if learned[i - 1] and not learned[i]:
                j = i
                while j < len(ids) and ids[j] != eot and not text[offsets[j][0] : offsets[j][1]].strip():
                    j += 1
                if j < len(ids) and ids[j] == eot:
                    learned[i : j + 1] = [True] * (j + 1 - i)
        return ids, learned

    def _assistant_spans(self, messages: list[dict], text: str) -> list[tuple[int, int]]:
        """What the model is asked to write for each assistant message (character spans of `text`):
        everything from the end of the generation prompt before it (ChatML, Llama 3, Qwen3: found
        in the text), or of what the conversation so far renders to (a template without one), to
        the end of the message's content; otherwise its content alone, found after the last answer. So whatever a
        template writes between its generation prompt and the answer is learned too: Qwen3's empty
        <think></think> block before its last answer, which the model must write itself when it
        answers from the generation prompt."""
        spans, cursor, prompt = [], 0, self.generation_prompt
        exact = content_spans(messages, text, self.render) or {}  # each content's place, where it can be told
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            content = message["content"].strip()  # templates may trim (Llama 3's | trim)
            start = text.find(content, exact[i][0] if i in exact else cursor)
            if start < 0:
                raise MinitfError(
                    f"the chat template does not write assistant message {i + 1}'s content as it is; "
                    f"minitf learns an answer from where its text appears in the rendered conversation"
                )
            g = text.rfind(prompt, cursor, start) if prompt else -1  # one render for all: linear in the messages
            if g >= 0:
                begin = g + len(prompt)
            else:  # a template with no generation prompt (Mistral's): what the conversation so far renders to
                so_far = self.render(messages[:i], add_generation_prompt=True)
                begin = len(so_far) if text.startswith(so_far) and cursor <= len(so_far) <= start else start
            spans.append((begin, start + len(content)))
            cursor = start + len(content)
        return spans

    @functools.cached_property
    def generation_prompt(self) -> str:
        """What add_generation_prompt writes after a conversation (ChatML's "<|im_start|>assistant\\n"),
        found by rendering one message with and without it; "" for a template that writes none."""
        probe = [{"role": "user", "content": "Hi"}]
        bare, prompted = self.render(probe), self.render(probe, add_generation_prompt=True)
        return prompted[len(bare) :] if prompted.startswith(bare) else ""

    @functools.lru_cache(maxsize=4)  # noqa: B019 (a template lives as long as its model)
    def end_of_turn(self, tokenizer: Tokenizer) -> int:
        """The token the template writes right after an answer (ChatML's <|im_end|>, Llama 3's
        <|eot_id|>): generation stops there. Found by rendering a one-exchange conversation."""
        probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]
        text = self.render(probe)
        ids, offsets = tokenizer.encode_with_offsets(text)
        ((_, end),) = self._assistant_spans(probe, text)
        after = [t for t, (s, e) in zip(ids, offsets) if s >= end and text[s:e].strip()]  # whitespace skipped
        special = tokenizer.special_ids()
        if after and after[0] in special:
            return after[0]
        eos = self.special.get("eos_token")
        if eos is not None and tokenizer.backend.token_to_id(eos) is not None:
            return tokenizer.backend.token_to_id(eos)
        raise MinitfError(
            f"{self.name} writes no special token after an answer, so no answer could end: it is not a chat "
            f"template (one ends each turn with a special token, as ChatML's {IM_END}); use the model's own"
        )

    def save(self, directory: Path) -> None:
        """chat_template.jinja, and the special tokens it names in tokenizer_config.json."""
        (Path(directory) / TEMPLATE_FILE).write_text(self.source, encoding="utf-8")
        if self.special:
            (Path(directory) / TOKENS_FILE).write_text(self.tokens_json(), encoding="utf-8")

    def tokens_json(self) -> str:
        """TOKENS_FILE's text: the special tokens the template names."""
        return json.dumps(self.special, indent=1) + "\n"


def chatml() -> ChatTemplate:
    """minitf's own template."""
    return ChatTemplate(CHATML)


def add_chat_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer with ChatML's two special tokens added after its vocabulary (unchanged when it
    has them). Text is still split exactly as before; the new ids are vocab_size and vocab_size + 1."""
    backend = Tokenizer.load_str(tokenizer.to_json()).backend  # a copy: the caller's stays as it was
    missing = [t for t in (IM_START, IM_END) if backend.token_to_id(t) is None]
    if missing:
        from tokenizers import AddedToken

        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
    return Tokenizer(backend)
