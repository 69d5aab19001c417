"""A minitf model's tensors as a Hugging Face state dict, and back, named and laid out as the weight
map (minitf.export.weights) says for each format. The import checks the file's tensors first and
names every one that does not make one complete model of its config.json, all in one error."""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..errors import MinitfError
from ..model import Transformer
from ..run_dir import refuse_non_finite
from ..system.runtime import give_back_freed_memory
from .architecture import FORMAT_NAMES
from .hf_files import loaded
from .layouts import VOCAB_ROWS
from .weights import HEAD, TABLES, exported, hf_weights, minitf_tensors

TRIM_EVERY = 256 * 2**20  # bytes read between two hand-backs of freed memory while importing

# buffers some checkpoints carry that hold no trained value
IGNORED = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias")


def hf_state(model: Transformer, fmt: str) -> dict[str, torch.Tensor]:
    """`fmt`'s *ForCausalLM state dict (float32, CPU) holding `model`'s weights. A model on the
    meta device gives meta tensors: the names and shapes a checkpoint of its config holds."""
    cfg, table = model.config, TABLES[fmt]
    tensors = minitf_tensors(model)
    out: dict[str, torch.Tensor] = {}
    for name, hf_names, w in hf_weights(table, cfg.n_layer):
        out.update(zip(hf_names, exported(w, name, tensors, table, w.hf_layout, cfg)))
    return {k: v.contiguous() for k, v in out.items()}


def minitf_weights(
    state: dict, cfg: ModelConfig, fmt: str, config: dict, where, frozen: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """minitf parameter name -> tensor (padding rows not included), from `fmt`'s HF state dict that
    config.json (`config`) describes as `cfg`. The tensors that do not make one complete model of
    the config (of another shape, holding NaN/inf, missing, left over) are named in one MinitfError:
    no layer is ever left at its random initial value.

    Every tensor is float32, but with `frozen` (a LoRA run under a 16-bit autocast, whose frozen
    matrices are read in that dtype at every use): the blocks' matrices are made in it straight
    from the file, and the embedding and head too where the file holds them so (exactly, then), so
    no float32 copy of them is ever held."""
    state, base, head = dict(state), TABLES[fmt].hf_prefix, HEAD.hf[0]  # the head: lm_head.weight, in every format
    if not any(k.startswith(base) for k in state):  # a base-model checkpoint (gpt2 on the hub): names unprefixed
        state = {k if k == head else base + k: v for k, v in state.items()}
    if "embed_out.weight" in state:  # older GPT-NeoX files name the head embed_out
        state[head] = state.pop("embed_out.weight")
    if cfg.tie_embeddings:
        state.pop(head, None)
    with torch.device("meta"):  # the names and shapes this config's checkpoint holds, without any memory
        expected = {k: tuple(v.shape) for k, v in hf_state(Transformer(cfg), fmt).items()}
    _check_shapes(state, expected, cfg.vocab_size, fmt, where)
    missing: list[str] = []
    weights = _minitf_state(state, cfg, fmt, config, expected, missing, where, frozen)
    left = sorted(k for k in state if not k.endswith(IGNORED))
    if missing or left:
        raise MinitfError(
            f"{where} does not hold one complete {FORMAT_NAMES[fmt]} model of its config.json: "
            + "; ".join(
                f"{what} {_some(names)}" for what, names in (("missing", missing), ("no place for", left)) if names
            )
            + "; minitf never fills a layer with random values: use the directory save_pretrained wrote"
        )
    return weights


def _check_shapes(state: dict, expected: dict, vocab: int, fmt: str, where) -> None:
    """Every tensor of the checkpoint that the config knows has the shape the config gives it (an
    embedding or head may hold more rows than the tokenizer's vocab: the extra ones are dropped).
    All that differ are named together, with the file's names and shapes."""
    rows = {n for _, names, w in hf_weights(TABLES[fmt], n_layer=0) if w.hf_layout is VOCAB_ROWS for n in names}
    wrong = []
    for name in sorted(state.keys() & expected.keys()):
        have, want = tuple(state[name].shape), expected[name]
        if name in rows:
            fits = len(have) == 2 and have[1] == want[1] and have[0] >= vocab
            want_text = f"({vocab} or more, {want[1]})"
        else:
            fits, want_text = have == want, str(want)
        if not fits:
            wrong.append(f"{name} {have} where config.json needs {want_text}")
    if wrong:
        raise MinitfError(
            f"{where}: tensors of another shape than its config.json describes: {_some(wrong)}; "
            f"the weights and config.json do not belong together"
        )


def _minitf_state(
    state: dict,
    cfg: ModelConfig,
    fmt: str,
    config: dict,
    expected: dict,
    missing: list[str],
    where,
    frozen: torch.dtype | None,
) -> dict:
    """minitf parameter name -> tensor, from `fmt`'s HF state dict. Pops what it uses from `state`,
    so what is left over is what minitf has no place for. expected: {HF name: shape} of cfg's
    checkpoint. A tensor the checkpoint lacks is added to `missing` (so that every missing name
    can be reported at once); one the format may lack (where config.json's attention_bias is false,
    say) stands in as zeros."""
    with torch.device("meta"):
        params = {k for k, _ in Transformer(cfg).named_parameters()}  # a tied head is listed once, as wte
    out, unreturned = {}, 0
    for name, hf_names, w in hf_weights(TABLES[fmt], cfg.n_layer):
        if name not in params:
            continue  # a bias of a model without biases, a tied head: nothing of minitf's to fill
        optional = w.optional is True or (bool(w.optional) and not config.get(w.optional, False))
        absent = [n for n in hf_names if n not in state and not optional]
        missing += absent
        parts = [_read(state.pop(n), n, where) if n in state else torch.zeros(expected[n]) for n in hf_names]
        t = None if absent else _joined(w, name, parts, hf_names, cfg, frozen)
        unreturned += sum(p.nbytes for p in parts)
        del parts  # the parts in the file's dtype go before the next is read
        if unreturned >= TRIM_EVERY:  # their pages too, now and then: freed between kept tensors, they
            give_back_freed_memory()  # would stay the process's (each trim walks the heap: not every tensor)
            unreturned = 0
        if t is not None:
            out[name] = t
    return out


def _joined(w, name: str, parts: list[torch.Tensor], names: tuple[str, ...], cfg: ModelConfig, frozen):
    """minitf's tensor `name` from its parts in the file: float32; with `frozen`, a block's matrix
    in that dtype, and the embedding or head too where the file holds them in it."""
    if w.hf_layout is VOCAB_ROWS:
        exact = frozen is not None and parts[0].dtype == frozen
        return VOCAB_ROWS.join(parts, names, cfg, frozen if exact else torch.float32)
    t = w.hf_layout.join(parts, names, cfg)
    return t.to(frozen) if frozen is not None and t.dim() == 2 and name.startswith("blocks.") else t.float()


def _read(t, name: str, where) -> torch.Tensor:
    """One tensor of the checkpoint, read (a FileTensor) and checked as it comes: finite, in the
    file's dtype (made float32 once joined, so a bfloat16 file never holds two float32 copies)."""
    t = loaded(t)
    refuse_non_finite([(name, t)], where, "it cannot be fine-tuned from; fetch or convert the model again")
    return t


def _some(names: list[str], n: int = 3) -> str:
    """Up to n names, and how many more."""
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")
