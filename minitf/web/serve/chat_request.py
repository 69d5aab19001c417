"""A chat completion request, checked: the fields of OpenAI's /v1/chat/completions, turned into
the same Request a completion is (request.py), so that the same engine samples it.

The conversation is rendered with the run's chat template and its generation prompt (the ids
minitf.chat starts from), and the choice ends at the template's end-of-turn token. The messages
follow a training conversation's rules (conversations/rules.py: known roles, non-empty text,
system first if at all, user and assistant taking turns) and end with the user's message, the
one to answer; a conversation that leaves no room for an answer in block_size is refused
(context_length_exceeded). A run with no template answers 404 "not a chat model", as OpenAI's API
answers for a completions-only model. A downloaded template renders in a worker process within its
bounds (conversations/bounded.py; past one, a 400 naming it), ended as soon as `cancelled()` is
true (the client went away, the server is stopping): the request is then Cancelled.

- max_tokens or max_completion_tokens (its newer name; one of the two): 1 to the server's
  --max-tokens; left out: the run's sample.max_new_tokens. temperature, top_p, seed, stop, n,
  stream, stream_options, and minitf's top_k and repetition_penalty, as for completions.
- logprobs: true or false; top_logprobs: 0..20, with logprobs true only.
"""

from __future__ import annotations

from ...conversations.bounded import RenderCancelled
from ...conversations.rules import BadConversation, check_question
from ..fields import flag
from .engine import Cancelled
from .request import (
    KNOWN,
    MAX_CHOICES,
    MAX_LOGPROBS,
    APIError,
    Request,
    Requests,
    api_errors,
    bad,
    check_fields,
    check_model,
    integer,
    stops,
    unsupported,
    usage_option,
)

CHAT_KNOWN = (KNOWN - {"prompt", "echo", "suffix", "best_of"}) | {"messages", "max_completion_tokens", "top_logprobs"}


def not_a_chat_model() -> APIError:
    return APIError(
        "This is not a chat model and thus not supported in the v1/chat/completions endpoint. "
        "Did you mean to use v1/completions?",
        404,
        param="model",
    )


def parse_chat(requests: Requests, body: dict, cancelled=lambda: False) -> Request:
    """The chat request as a Request of one prompt (the templated conversation), or APIError;
    Cancelled once cancelled() is true while the template renders."""
    with api_errors():
        return _parse(requests, body, cancelled)


def _parse(requests: Requests, body: dict, cancelled) -> Request:
    template = getattr(requests.tok, "chat_template", None)
    if template is None:  # whatever else the request says
        check_model(body.get("model"), requests.name)
        raise not_a_chat_model()
    check_fields(body, CHAT_KNOWN, requests.name, required={"model", "messages"})
    unsupported(body)
    messages = checked_messages(body["messages"])
    try:
        with template.cancelled_by(cancelled):
            ids, end = template.prompt_ids(requests.tok, messages), template.end_of_turn(requests.tok)
    except RenderCancelled as e:
        raise Cancelled(str(e)) from None
    if len(ids) >= requests.block:
        raise bad(
            "messages",
            f"This model's maximum context length is {requests.block} tokens (block_size), and the conversation "
            f"is {len(ids)}, which leaves no room for an answer; shorten it",
            code="context_length_exceeded",
        )
    n = integer(body, "n", 1, MAX_CHOICES, default=1)
    stream = flag(body.get("stream"), "stream")
    settings = requests.settings(body, _max_tokens(requests, body))
    requests.check_n(n)
    logprobs = flag(body.get("logprobs"), "logprobs")
    top = integer(body, "top_logprobs", 0, MAX_LOGPROBS, default=None)
    if top is not None and not logprobs:
        raise bad("top_logprobs", "top_logprobs needs logprobs: true")
    return Request(
        prompts=[""],
        ids=[ids],
        max_tokens=settings.max_new_tokens,
        settings=settings,
        n=n,
        stop=stops(body),
        stream=stream,
        logprobs=(top or 0) if logprobs else None,
        echo=False,
        include_usage=usage_option(body, stream),
        ends=(end,),
    )


def _max_tokens(requests: Requests, body: dict) -> int | None:
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise bad("max_tokens", "give max_tokens or max_completion_tokens (its newer name), not both")
    name = "max_tokens" if body.get("max_tokens") is not None else "max_completion_tokens"
    return integer(body, name, 1, requests.max_tokens, default=None)


def checked_messages(messages) -> list[dict]:
    """The conversation to answer (conversations.check_question), or a 400 naming messages."""
    try:
        return check_question(messages, "messages")
    except BadConversation as e:
        raise bad("messages", f"messages: {e.why}") from None
