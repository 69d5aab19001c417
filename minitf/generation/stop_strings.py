"""One sample's token ids -> the text pieces a reader is handed: whole characters only, cut at
<|endoftext|> or at a stop string.

A token can end in the middle of a UTF-8 character, and the text of the tokens so far can end
in the first characters of a stop string; neither is handed out until the next tokens say what
it is. generate, stream and the OpenAI-compatible server all assemble their text here.
"""

from __future__ import annotations

from ..tokenizer import Tokenizer

CONTEXT = 4  # ids decoded before each new piece: enough for any tokenizer's space or byte to join up


class TextAssembler:
    """One sample's ids -> text pieces: whole characters only, cut at <|endoftext|> or a stop string."""

    def __init__(self, tokenizer: Tokenizer, stop: list[str], ends: tuple[int, ...] = ()):
        self.tok, self.stop = tokenizer, [s for s in stop if s]
        self.ends = {tokenizer.eot_id, *ends}  # tokens that end the text: <|endoftext|>, a chat's end of turn
        self.pending: list[int] = []  # ids whose bytes do not yet end on a whole character
        # the last ids handed out, and their text: a piece is decoded after them, since a
        # SentencePiece tokenizer (Mistral's, Gemma's) drops the space of a piece decoded alone
        self.context: list[int] = []
        self.context_text = ""
        self.text, self.emitted, self.done = "", 0, False
        self.tokens = 0  # ids pushed: the sampled tokens, <|endoftext|> included

    def push(self, token: int) -> str:
        self.tokens += 1
        if token in self.ends:
            self.done = True
            return self.flush()
        self.pending.append(token)
        both = self.tok.decode(self.context + self.pending)
        piece = both[len(self.context_text) :] if both.startswith(self.context_text) else self.tok.decode(self.pending)
        if piece.endswith("\ufffd") and len(self.pending) < 4:  # a UTF-8 character cut in two
            return ""
        start = len(self.text)
        self.text += piece
        self.context = (self.context + self.pending)[-CONTEXT:]
        self.context_text = self.tok.decode(self.context)
        self.pending = []
        for s in self.stop:  # only where the new piece could complete a stop string
            i = self.text.find(s, max(0, start - len(s) + 1))
            if i >= 0:
                self.text, self.done = self.text[:i], True
        return self._emit(final=self.done)

    def flush(self) -> str:
        """Everything not yet handed out, held-back tail included: generation has ended."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        safe = len(self.text)
        if not final:  # hold back a tail that could still become a stop string
            for s in self.stop:
                for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(s[:k]):
                        safe = min(safe, len(self.text) - k)
                        break
        out, self.emitted = self.text[self.emitted : safe], max(self.emitted, safe)
        return out
