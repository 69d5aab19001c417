"""What the explorer's page asks of a run, as JSON-ready dicts: the run and its loss curve, a
generation token by token, one token's attention step by step, and for one position the next-token
distribution under the sampler's settings, the logit lens and the position signal. server.py
carries them over HTTP; here each request is a plain call over the loaded run, its input checked
and bounded first.

Every input comes from a browser, so each is checked: a wrong type, a value out of range, a
prompt too long or an unknown key raise BadRequest (a MinitfError) with one line the page shows.
The numbers are the library's own: generation is `stream_tokens`' loop (`token_steps`, from
the prompt's ids: a chat's are its template's `prompt_ids`), attention is `inspect`, the
distribution is `sampler_distribution` (the rules `sample_next_token` draws by), the lens is
`logit_lens`, positions are the model's own table or `rotary_angles`, heads and attribution are
minitf.interpret's (interpret_views.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from pathlib import Path

import torch

from ...budget import budget_steps
from ...config import SEED_RANGE, TrainConfig
from ...conversations.answer import checked_prompt
from ...errors import ConfigError, MinitfError
from ...export.hf import is_hf_model, load_model
from ...generate import prompt_ids, sample_settings, token_steps
from ...generation.args import SETTINGS
from ...inspection import Inspection, inspect, logit_lens, token_label
from ...positions import rope_scaling, rotary_angles
from ...run_dir import BEST, METRICS, WEIGHTS, read_rows, weights_step
from ...sampling import sampler_distribution, window_start
from ...system.runtime import eval_mode
from ...tokenizer import check_ids
from ..fields import BadRequest, number, whole
from .interpret_views import attribution_view, heads_view, predicted

MAX_PROMPT_CHARS = 4000
MAX_NEW_TOKENS = 1000
MAX_GENERATIONS = 4  # at once, all tabs together: each costs a KV cache and a share of the CPU
DIGITS = 6  # decimals sent for every number: well below what a page can show, small JSON
CURVE = ("step", "train_loss", "val_loss", "val_bpb", "lr", "val_exact", "reward_mean")
RULES = ("temperature", "top_k", "top_p", "repetition_penalty")  # the settings that shape one step's distribution
MAX_SHOWN = 100  # tokens listed per distribution or lens layer at most
MAX_TABLE = 65536  # position-table numbers sent beyond the window's own rows (a table of block_size x width)
# the views the page asks for by POST /api/<name>: each is an Explorer method, JSON body in, JSON out;
# a new view is a method here and a line in this table (the server routes every name in it)
VIEWS = {
    "attention": "attention",  # {"ids", "query", "layer", "head"} -> one token's attention, every step
    "distribution": "distribution",  # {"ids", "position", "temperature", ...} -> the next token under the sampler
    "lens": "lens",  # {"ids", "position"} -> the next token as each layer's residual stream predicts it
    "positions": "positions",  # {"ids", "position"} -> the position signal the model adds (or rotary's angles)
    "heads": "heads",  # {"ids", "position", "heads", "mode"} -> head scores; the next token with heads switched off
    "attribution": "attribution",  # {"ids", "position", "token", "against"} -> each part's share of a logit
}


class Busy(MinitfError):
    """Too many generations at once (HTTP 503)."""

    status = 503


class Explorer:
    """One loaded run and what the page asks of it.

    The model is only read. Each generation makes its own KV cache and random generator inside
    token_steps, and inspect runs without a cache, so requests from several tabs can run at the
    same time without touching each other's state; `slots` bounds how many generate at once.
    """

    def __init__(self, run_dir: str | Path, best: bool = False, device: str = "cpu"):
        """run_dir: a minitf run, or a Hugging Face model of a family minitf imports (a directory or
        a hub id), shown as it was downloaded: no training of its own to show."""
        self.run_dir, self.best = Path(run_dir), best
        self.downloaded = is_hf_model(run_dir)
        self.model, self.tok, self.cfg = load_model(run_dir, best=best, device=device)
        self.checkpoint = self.run_dir / (BEST if best else WEIGHTS)
        # read now: a trainer may write a newer one later
        self.step = None if self.downloaded else weights_step(self.checkpoint)
        self.slots = threading.BoundedSemaphore(MAX_GENERATIONS)

    def run_info(self) -> dict:
        m = self.cfg.model
        return {
            "run": str(self.run_dir) if self.downloaded else self.run_dir.name,  # a hub id names itself
            "downloaded": self.downloaded,  # the page then shows no data, budget or curves of its own
            "checkpoint": "the downloaded weights" if self.downloaded else self.checkpoint.name,
            "step": self.step,
            "params": self.model.num_params(),
            "budget": budget_words(self.cfg.train),
            "config": self.cfg.to_dict(),
            "chat": self.tok.chat_template is not None,  # a chat run: the page talks to it (messages)
            "limits": {
                "prompt_chars": MAX_PROMPT_CHARS,
                "max_new_tokens": MAX_NEW_TOKENS,
                "block_size": m.block_size,
                "n_layer": m.n_layer,
                "n_head": m.n_head,
            },
        }

    def loss_curve(self) -> dict:
        """The evaluations in metrics.jsonl: step, train and val loss, val bits per byte, lr; a chat
        run's held-out exact answers, and an RL run's mean reward (data.format=rl)."""
        rows = [] if self.downloaded else read_rows(self.run_dir / METRICS)
        points = [{k: r[k] for k in CURVE if isinstance(r.get(k), (int, float))} for r in rows]
        # an RL run's sampled groups of a few fixed prompts at each evaluation (rl/rollouts.py, watch)
        watched = [{"step": r["step"], "groups": r["watched"]} for r in rows if isinstance(r.get("watched"), list)]
        return {"points": [p for p in points if "step" in p], "watched": watched}

    @contextlib.contextmanager
    def generation(self, body: dict, cancelled=lambda: False):
        """Check a generate request, take a slot, and give its events (see `_events`); the slot is
        given back, and generation stops, when the `with` block ends (the page may have gone). A
        chat's template render ends once cancelled() is true (RenderCancelled): the page closed."""
        chat = "messages" in body
        ids, settings = self._chat_request(body, cancelled) if chat else self._generation_request(body)
        if not self.slots.acquire(blocking=False):
            raise Busy(f"{MAX_GENERATIONS} generations are running already; wait for one to finish")
        events = self._events(ids, settings, chat)
        try:
            yield events
        finally:
            events.close()
            self.slots.release()

    def _generation_request(self, body: dict):
        check_keys(body, {"prompt", *SETTINGS})
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            raise BadRequest(f"prompt must be text, got {type(prompt).__name__}")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise BadRequest(f"the prompt is {len(prompt)} characters; at most {MAX_PROMPT_CHARS}, shorten it")
        n, block = len(self.tok.encode(prompt)), self.cfg.model.block_size
        if n > block:
            raise BadRequest(f"the prompt is {n} tokens but this model reads at most block_size={block}; shorten it")
        settings = self._settings(body)
        if "max_new_tokens" in body and settings.max_new_tokens > MAX_NEW_TOKENS:  # the run's own may be more
            raise BadRequest(f"max_new_tokens is {settings.max_new_tokens}; at most {MAX_NEW_TOKENS} here")
        return prompt_ids(self.tok, prompt, block), settings  # <|endoftext|> for an empty prompt

    def _chat_request(self, body: dict, cancelled):
        """A chat run's turn: {"messages": [...], settings} -> the ids of the conversation and its
        generation prompt, as the run's template makes them (ChatTemplate.prompt_ids)."""
        check_keys(body, {"messages", *SETTINGS})
        template = self.tok.chat_template
        if template is None:
            raise BadRequest("this run is not a chat model (it has no chat template); send a prompt instead")
        messages = body["messages"]
        if not isinstance(messages, list) or sum(len(str(m)) for m in messages) > MAX_PROMPT_CHARS * 4:
            raise BadRequest(f"messages must be a list of at most {MAX_PROMPT_CHARS * 4} characters in all")
        with template.cancelled_by(cancelled):  # a downloaded template renders in a worker, bounded
            ids = template.prompt_ids(self.tok, checked_prompt("messages", messages))
        n, block = len(ids), self.cfg.model.block_size
        if n >= block:
            raise BadRequest(f"the conversation is {n} tokens, this model reads {block}; start a new conversation")
        settings = self._settings(body)
        if "max_new_tokens" in body and settings.max_new_tokens > MAX_NEW_TOKENS:
            raise BadRequest(f"max_new_tokens is {settings.max_new_tokens}; at most {MAX_NEW_TOKENS} here")
        # an answer ends where the context does: past it the window would slide the conversation's start
        # (its system prompt, its template) out of what the model reads; _events says "context" then
        return ids, dataclasses.replace(settings, max_new_tokens=min(settings.max_new_tokens, block - n))

    def _settings(self, body: dict):
        """The run's sample settings with those the body gives (any of SETTINGS) in their place."""
        given = {}
        for name, (kind, nullable) in SETTINGS.items():  # null: top_k/top_p off, a random seed
            if name in body:
                bounds = SEED_RANGE if name == "seed" else ()  # the others' ranges are SampleConfig's to check
                given[name] = None if nullable and body[name] is None else field(body, name, kind, *bounds)
        return sample_settings(self.cfg.sample, **given)  # ConfigError (one line) for bad values

    def _events(self, ids: list[int], settings, chat: bool):
        """{"prompt": tokens}, then {"token": ...} per sampled token (text, label, probability, top-5), then
        {"done": reason}: "eot" (the model ended the document or its turn), "length" (max_new_tokens),
        or "context" (a chat's answer filled the model's block_size)."""
        yield {"prompt": [{"id": i, "text": self.tok.decode([i]), "label": self.label(i)} for i in ids]}
        reason, template, length = "length", self.tok.chat_template, len(ids)
        ends = (template.end_of_turn(self.tok),) if template is not None else ()
        for t in token_steps(self.model, self.tok, ids, settings, ends=ends):  # load_run checked the vocabulary
            yield {
                "token": {
                    "id": t.id,
                    "text": t.text,
                    "label": self.label(t.id),
                    "prob": round(t.prob, DIGITS),
                    "top": [[token_label(s), round(p, DIGITS)] for s, p in t.top],
                }
            }
            reason = "eot" if t.id == self.tok.eot_id or t.id in ends else reason
            length += 1
        if chat and reason == "length" and length >= self.cfg.model.block_size:
            reason = "context"
        yield {"done": reason}

    def label(self, token: int) -> str:
        return token_label(self.tok.decode([token]))

    def attention(self, body: dict) -> dict:
        """One query token's attention in every layer and head, and one head's steps.

        body: ids (the prompt's and the sampled tokens), query (an index into ids), layer, head.
        Past block_size the model saw a window, so the block_size tokens ending at the query are
        inspected (or the first block_size, when they hold it); "offset" says where they start.
        """
        check_keys(body, {"ids", "query", "layer", "head"})
        block, m = self.cfg.model.block_size, self.cfg.model
        ids = self._ids(body)
        query = field(body, "query", int, 0, len(ids) - 1)
        layer = field(body, "layer", int, 0, m.n_layer - 1, default=0)
        head = field(body, "head", int, 0, m.n_head - 1, default=0)
        self._check_ids(ids)
        start = max(0, query + 1 - block)
        ins = inspect(self.model, self.tok, ids[start : start + block])
        return {"offset": start, **attention_view(ins, query - start, layer, head)}

    def _position(self, body: dict, known: set[str]) -> tuple[list[int], int, int]:
        """(ids, position, start) of a request about what the model predicts after ids[position]:
        it read ids[start : position + 1], the window generation gives it (window_start)."""
        check_keys(body, {"ids", "position", *known})
        ids = self._ids(body)
        position = field(body, "position", int, 0, len(ids) - 1)
        self._check_ids(ids)
        return ids, position, window_start(position + 1, self.cfg.model.block_size)

    def _ids(self, body: dict) -> list:
        """body's ids: a list of 1 to block_size + MAX_NEW_TOKENS items (checked as token ids by _check_ids)."""
        ids, most = body.get("ids"), self.cfg.model.block_size + MAX_NEW_TOKENS
        if not isinstance(ids, list) or not 0 < len(ids) <= most:
            raise BadRequest(f"ids must be a list of 1 to {most} token ids")
        return ids

    def _check_ids(self, ids: list) -> None:
        """Each of ids a token id of the run's vocabulary (tokenizer.check_ids), or a 400 that says which is not."""
        try:
            check_ids(ids, self.tok.vocab_size, "ids")
        except ConfigError as e:
            raise BadRequest(str(e)) from None

    def _next(self, ids: list[int], position: int) -> dict | None:
        """The token that follows the position on the page, if one does."""
        return None if position + 1 >= len(ids) else self.token(ids[position + 1])

    def token(self, i: int) -> dict:
        return {"id": i, "label": self.label(i)}

    @torch.no_grad()
    def distribution(self, body: dict) -> dict:
        """The next token after ids[position] as the sampler sees it, for the settings in body
        (temperature, top_k, top_p, repetition_penalty; the run's for those not given).

        For the `top` likeliest tokens (and the one that follows on the page): the logit, the
        model's probability, the probability after temperature, and the probability the sampler
        draws it with after top_k and top_p (0: cut). With the tokens before it as the history
        the repetition penalty counts, as in generation. Entropies in bits say how the settings
        sharpen or flatten the distribution.
        """
        ids, position, start = self._position(body, {*RULES, "top"})
        top = field(body, "top", int, 1, MAX_SHOWN, default=20)
        settings = self._settings({k: body[k] for k in RULES if k in body})
        w = self.model.wte.weight
        with eval_mode(self.model):
            logits = self.model(torch.tensor([ids[start : position + 1]], device=w.device))[0][:, -1]  # (1, V)
        history = torch.tensor([ids[: position + 1]], device=w.device)  # (1, n): what the sampler saw
        d = sampler_distribution(logits, settings, history)
        logits, model, tempered, probs = (t[0].float().cpu() for t in (logits, d.model, d.tempered, d.probs))
        kept = d.kept[0].cpu()  # (V,) bool
        shown = model.topk(min(top, model.numel())).indices.tolist()
        nxt = self._next(ids, position)
        if nxt is not None and nxt["id"] not in shown:
            shown.append(nxt["id"])
        rank = (model > model[shown].unsqueeze(1)).sum(dim=1) + 1  # 1: the likeliest
        return {
            "offset": start,
            "position": position,
            "token": self.token(ids[position]),
            "next": nxt,
            "settings": {k: getattr(settings, k) for k in RULES},
            "vocab": model.numel(),
            "kept": int(kept.sum()),
            "kept_mass": round(float(model[kept].sum()), DIGITS),
            "entropy": {
                k: round(entropy_bits(p), DIGITS)
                for k, p in (("model", model), ("tempered", tempered), ("sampled", probs))
            },
            "tokens": [
                {
                    **self.token(i),
                    "rank": int(r),
                    "logit": round(float(logits[i]), DIGITS),
                    "model": round(float(model[i]), DIGITS),
                    "tempered": round(float(tempered[i]), DIGITS),
                    "prob": round(float(probs[i]), DIGITS),
                    "kept": bool(kept[i]),
                }
                for i, r in zip(shown, rank.tolist())
            ],
        }

    def lens(self, body: dict) -> dict:
        """The logit lens at ids[position]: what the residual stream would predict for the next
        token at the embeddings and after every block (final norm and LM head applied,
        `logit_lens`); the last row is the model's real prediction. Per row, the `top` likeliest
        tokens (softmax at temperature 1) and the rank and probability of the token that follows."""
        ids, position, start = self._position(body, {"top"})
        top = field(body, "top", int, 1, MAX_SHOWN, default=5)
        ins = inspect(self.model, self.tok, ids[start : position + 1])
        probs = logit_lens(self.model, ins)[:, -1].softmax(dim=-1)  # (L + 1, V): the position's row
        nxt = self._next(ids, position)
        rows = []
        for layer, p in enumerate(probs):
            best = p.topk(min(top, p.numel()))
            row = {
                "name": "embeddings" if layer == 0 else f"block {layer - 1}",
                "top": [
                    {**self.token(i), "prob": round(float(q), DIGITS)}
                    for q, i in zip(best.values, best.indices.tolist())
                ],
            }
            if nxt is not None:
                row["next"] = {"prob": round(float(p[nxt["id"]]), DIGITS), "rank": int((p > p[nxt["id"]]).sum()) + 1}
            rows.append(row)
        return {"offset": start, "position": position, "token": self.token(ids[position]), "next": nxt, "layers": rows}

    @torch.no_grad()
    def positions(self, body: dict) -> dict:
        """The position signal of the model at ids[position], whose position in its window is
        position - offset. Learned or sinusoidal: the vectors the model adds to the token
        embeddings ("table", a row per position: the window's, and more up to block_size while
        the table stays small), with the norms of the position's vector and its token's embedding.
        Rotary: nothing is added; "angles" holds the rotation of each pair of query/key dimensions
        per position, in radians (position x base^(-2i/head_dim))."""
        ids, position, start = self._position(body, set())
        m, n = self.cfg.model, position + 1 - start
        view = {
            "kind": m.positions,
            "offset": start,
            "position": position - start,  # where the token sits in the window the model read
            "token": self.token(ids[position]),
            "n": n,
            "tokens": [self.label(i) for i in ids[start : position + 1]],
        }
        if m.positions == "rope":
            width = m.head_size // 2
            rows = max(n, min(m.block_size, MAX_TABLE // width))
            return {
                **view,
                "base": m.rope_base,
                "head_dim": m.head_size,
                "angles": numbers(rotary_angles(rows, m.head_size, m.rope_base, rope_scaling(m))),
            }
        rows = max(n, min(m.block_size, MAX_TABLE // m.n_embd))
        table = self.model.wpe(rows).float().cpu()  # (rows, C): the module's own forward, what it adds
        token = self.model.wte.weight[ids[position]].float().cpu()  # (C,)
        norms = {"position": float(table[position - start].norm()), "token": float(token.norm())}
        return {**view, "table": numbers(table), "norms": {k: round(v, DIGITS) for k, v in norms.items()}}

    def heads(self, body: dict) -> dict:
        """Every head's previous-token, duplicate-token and induction score on the window before
        ids[position], and the next token with the (layer, head) pairs in `heads` switched off
        ("zero", or "mean": each head's mean output over the window), beside the model's own."""
        ids, position, start = self._position(body, {"heads", "mode", "top"})
        m = self.cfg.model
        pairs = body.get("heads", [])
        if not isinstance(pairs, list) or len(pairs) > m.n_layer * m.n_head:
            raise BadRequest(f"heads must be a list of at most {m.n_layer * m.n_head} [layer, head] pairs")
        heads = []
        for p in pairs:
            if not isinstance(p, list) or len(p) != 2:
                raise BadRequest(f"each of heads must be a [layer, head] pair, got {p!r}")
            pair = {"layer": p[0], "head": p[1]}
            heads.append((field(pair, "layer", int, 0, m.n_layer - 1), field(pair, "head", int, 0, m.n_head - 1)))
        mode = body.get("mode", "zero")
        if mode not in ("zero", "mean"):
            raise BadRequest(f"mode must be 'zero' or 'mean', got {mode!r}")
        top = field(body, "top", int, 1, MAX_SHOWN, default=10)
        view = heads_view(self.model, ids[start : position + 1], heads, mode, top, self.label)
        return {"offset": start, "position": position, "token": self.token(ids[position]), **view}

    def attribution(self, body: dict) -> dict:
        """Direct logit attribution of one next token after ids[position]: `token` (by default the
        one that follows on the page, else the model's likeliest), minus `against` if given."""
        ids, position, start = self._position(body, {"token", "against"})
        window = ids[start : position + 1]
        V = self.tok.vocab_size
        nxt = self._next(ids, position)
        if "token" in body:
            token = field(body, "token", int, 0, V - 1)
        else:
            token = nxt["id"] if nxt is not None else predicted(self.model, window, 1)[0]
        against = None if body.get("against") is None else field(body, "against", int, 0, V - 1)
        view = attribution_view(self.model, window, token, against, self.label)
        return {"offset": start, "position": position, "token": self.token(ids[position]), "next": nxt, **view}


def budget_words(tc: TrainConfig) -> str:
    """What ended or would end the training, for the page: a time budget (max_steps is then only a
    cap, unless a typical machine reaches it first), or max_steps."""
    if tc.max_seconds is None:
        return f"{tc.max_steps} steps"
    expected = budget_steps(tc)
    cap = f" or {tc.max_steps} steps" if expected and tc.max_steps < expected else ""
    return f"{tc.max_seconds:g} s{cap} budget"


def attention_view(ins: Inspection, query: int, layer: int, head: int) -> dict:
    """The page's view of an inspection: for the query token, its weights over the tokens up to it
    in every layer x head ("grid"); the chosen head's T x T weights ("heatmap", null where the
    causal mask hides a later key); and that head's steps for the query, from q and k to the
    weighted sum of the values ("steps"; masked scores are null, as -inf has no JSON)."""
    s = ins.layers[layer]
    hidden = s.masked[head].isneginf()  # (T, T): the later keys
    return {
        "ids": ins.ids,
        "tokens": [token_label(t) for t in ins.tokens],
        "query": query,
        "layer": layer,
        "head": head,
        "grid": [[numbers(steps.weights[h, query, : query + 1]) for h in range(ins.n_head)] for steps in ins.layers],
        "heatmap": numbers(s.weights[head].masked_fill(hidden, -math.inf)),
        "steps": {
            "d": s.q.size(-1),
            "q": numbers(s.q[head, query]),
            "k": numbers(s.k[head]),
            "scores": numbers(s.scores[head, query]),
            "scaled": numbers(s.scaled[head, query]),
            "masked": numbers(s.masked[head, query]),
            "weights": numbers(s.weights[head, query]),
            "v": numbers(s.v[head]),
            "out": numbers(s.heads[head, query]),
        },
    }


def entropy_bits(p: torch.Tensor) -> float:
    """-sum p log2 p over the tokens with p > 0: 0 when one token has it all, log2 V when all are equal."""
    p = p[p > 0]
    return float(-(p * p.log2()).sum())


def numbers(t: torch.Tensor):
    """A tensor as (nested) lists of floats rounded to DIGITS places; -inf and nan as None."""

    def rounded(x):
        return [rounded(y) for y in x] if isinstance(x, list) else round(x, DIGITS) if math.isfinite(x) else None

    return rounded(t.tolist())


def check_keys(body: dict, known: set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}; expected some of {', '.join(sorted(known))}")


def field(body: dict, name: str, kind: type, lo=None, hi=None, default=None):
    """body[name] as an int (a whole number) or a float within lo..hi (web/fields.py's checks);
    absent: default. null is refused: the settings that take it (SETTINGS) are read before."""
    check = whole if kind is int else number
    return check(body.get(name, default), name, lo, hi)
