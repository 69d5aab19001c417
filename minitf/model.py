"""The Transformer: embeddings, attention and feed-forward blocks, the language-model head.

The decoder-only transformer, read top-down: norm -> feed-forward -> multi-head attention -> block ->
language model. The attention formula itself is attention.py's; positions are positions.py's."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from .attention import attention, attention_steps, causal_mask
from .config import ModelConfig
from .errors import ConfigError
from .fast.fused_attention import constant_while_compiling, fused_attention, repeat_heads
from .fast.lm_loss import IGNORE, LARGE_VOCAB, cross_entropy_in_chunks, linear_cross_entropy
from .fast.tied_embedding import TiedEmbedding
from .positions import LearnedPositions, Rotary, SinusoidalPositions, local_rope, rope_scaling
from .system.sizes import check_fits_in_memory, ffn_hidden, padded_vocab
from .tokenizer import check_ids


def make_norm(cfg: ModelConfig, after_sublayer: bool = False) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return (AfterNorm if after_sublayer else nn.RMSNorm)(cfg.n_embd, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=cfg.bias)


class AfterNorm(nn.RMSNorm):
    """Gemma's RMS norm of a sub-layer's output: bfloat16 under autocast beside float32 gains, normed in float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)  # (..., C): torch's bits, without its warning


class FeedForward(nn.Module):
    """Position-wise MLP: d -> hidden -> activation -> d (hidden: 4d unless model.ffn_hidden says;
    swiglu's about 8/3 d, see system/sizes.py)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = ffn_hidden(cfg)
        # swiglu's gate and up projections are fused in one matrix, split after the matmul
        gated = cfg.ffn in ("swiglu", "geglu")
        self.c_fc = nn.Linear(cfg.n_embd, 2 * hidden if gated else hidden, bias=cfg.bias)
        self.c_proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.act = activation(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.c_fc(x))  # (B, T, hidden)
        return self.dropout(self.c_proj(h))  # (B, T, C)


def activation(cfg: ModelConfig) -> nn.Module:
    """The feed-forward block's nonlinearity: model.ffn = gelu (model.gelu: exact or tanh), relu2 or swiglu."""
    other = {"swiglu": SwiGLU, "geglu": GeGLU, "relu2": ReLU2}.get(cfg.ffn)
    return other() if other else nn.GELU(approximate="tanh" if cfg.gelu == "tanh" else "none")


class ReLU2(nn.Module):
    """relu(x)^2: as cheap as relu, smooth at zero from one side, and sparse (modded-nanogpt)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


class SwiGLU(nn.Module):
    """(B, T, 2 x hidden) -> (B, T, hidden): silu(gate) * up, a gate learned per hidden unit (Llama)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = h.chunk(2, dim=-1)  # (B, T, hidden) each
        return F.silu(gate) * up


class GeGLU(nn.Module):
    """(B, T, 2 x hidden) -> (B, T, hidden): gelu_tanh(gate) * up, SwiGLU with a GELU gate (Gemma)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = h.chunk(2, dim=-1)  # (B, T, hidden) each
        return F.gelu(gate, approximate="tanh") * up


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused QKV projection.

    `forward(x, rope, cache, layer)`: `rope` rotates q and k (rotary positions); `cache` is a
    KVCache whose keys and values this layer appends to (the model advances its position once
    all layers have run). `steps(x, rope)` computes the same output with every step kept, for
    inspection.

    With model.n_kv_head < n_head (grouped-query attention) there are fewer key/value heads than
    query heads: query head h reads key/value head h // (n_head / n_kv_head), so the projection
    has n_head + 2 n_kv_head head-sized column blocks and the KV cache shrinks by the same factor.
    """

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_size
        # q (n_head heads), then k and v (n_kv_head heads each): 3 * n_embd columns without grouping
        self.c_attn = nn.Linear(cfg.n_embd, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_size, bias=cfg.has_qkv_bias)
        self.c_proj = nn.Linear(cfg.attn_width, cfg.n_embd, bias=cfg.bias)  # attn_width: n_embd, or n_head x head_dim
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.fused = cfg.attention == "sdpa"
        self.qk_norm = cfg.qk_norm
        self.norm_eps = cfg.norm_eps
        self.window = cfg.sliding_window if cfg.slides(layer) else None  # Gemma 3: some layers slide, some not
        self.scale = cfg.attn_scale  # None: 1/sqrt(head_dim)
        if cfg.qk_norm:  # a learned gain per dimension after each head's RMS norm (Qwen3, OLMo 2)
            self.q_norm = nn.RMSNorm(cfg.head_size, eps=cfg.norm_eps)
            self.k_norm = nn.RMSNorm(cfg.head_size, eps=cfg.norm_eps)

    def forward(self, x, rope=None, cache=None, layer: int = 0):
        if cache is not None:
            return self.forward_cached(x, rope, cache, layer)
        q, k, v = self.qkv(x, rope)  # (B, H, T, D), (B, KV, T, D), (B, KV, T, D)
        y = self.attend(q, k, v, self.window_mask(x.size(1), x.device))  # (B, H, T, D)
        return self.project(y)  # (B, T, C)

    def qkv(self, x: torch.Tensor, rope=None, offset=0):
        """Queries (B, H, T, D), keys and values (B, KV, T, D) each (KV = n_kv_head, = H without
        grouping), from one projection; q and k normalised and rotated when the model asks."""
        B, T, C = x.shape
        H, KV, D = self.n_head, self.n_kv_head, self.head_dim
        heads = self.c_attn(x).view(B, T, H + 2 * KV, D)  # q's H heads, then k's KV, then v's KV
        if self.qk_norm or rope is not None:
            q, k, v = self.norm_and_rotate(heads, rope, offset)
        else:
            q, k, v = heads.split((H, KV, KV), dim=2)  # (B, T, H, D), (B, T, KV, D), (B, T, KV, D)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D), (B, KV, T, D) x 2

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None) -> torch.Tensor:
        """softmax(q kᵀ / √D) v per head, (B, H, T, D): one fused kernel (model.attention=sdpa), or
        attention.py's written-out formula (model.attention=reference). mask (T, S) bool, or None
        for the plain causal rule: query i sees keys 0 .. S - T + i."""
        if not self.fused:
            return self.written_out(q, k, v, mask)
        p = self.dropout if self.training else 0.0
        # is_causal is top-left aligned, right only when S == T; one query (T == 1) sees every key
        is_causal = mask is None and q.size(2) > 1
        return fused_attention(q, k, v, mask, p, is_causal, self.scale)  # (B, H, T, D); grouped heads as it takes them

    def project(self, heads: torch.Tensor) -> torch.Tensor:
        """(B, H, T, D) head outputs -> (B, T, C): side by side, through the output projection."""
        B, H, T, D = heads.shape
        return self.resid_dropout(self.c_proj(heads.transpose(1, 2).reshape(B, T, H * D)))

    # ---- the options: each one a place the default path above does not need

    def norm_and_rotate(self, heads: torch.Tensor, rope, offset=0):
        """q, k and v (B, T, H, D), (B, T, KV, D) x 2 from the projection's heads (B, T, H+2KV, D),
        q and k RMS-normalised per head when model.qk_norm, then rotated by rope if given. q's and
        k's heads go together, head by head: half the small elementwise kernels of doing each on
        its own, and the same numbers."""
        qk, v = heads.split((self.n_head + self.n_kv_head, self.n_kv_head), dim=2)  # (B, T, H+KV, D), (B, T, KV, D)
        if self.qk_norm:  # unit-RMS rows bound every score, so no logit can run away with one head
            H, KV, D = self.n_head, self.n_kv_head, self.head_dim
            gains = torch.cat((self.q_norm.weight.expand(H, D), self.k_norm.weight.expand(KV, D)))  # (H+KV, D)
            # model.norm_eps, as every other norm: Qwen3 uses one eps for all, so the export is exact
            qk = F.rms_norm(qk, (D,), eps=self.norm_eps) * gains  # (B, T, H+KV, D)
        if rope is not None:
            qk = rope.rotate_heads(qk, offset)  # (B, T, H+KV, D)
        q, k = qk.split((self.n_head, self.n_kv_head), dim=2)  # (B, T, H, D), (B, T, KV, D)
        return q, k, v

    def window_mask(self, T: int, device) -> torch.Tensor | None:
        """model.sliding_window's (T, T) mask where the window hides keys the causal rule shows, else None."""
        return (
            causal_mask(T, device=device, window=self.window) if self.window is not None and T > self.window else None
        )

    def written_out(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None) -> torch.Tensor:
        """attend() through attention.py's formula, one step at a time, (B, H, T, D)."""
        k, v = repeat_heads(k, self.n_head), repeat_heads(v, self.n_head)  # (B, H, S, D)
        y, weights = attention(q, k, v, causal=mask is None, mask=mask, scale=self.scale)  # (B, H, T, D), (B, H, T, S)
        if self.training and self.dropout > 0:
            y = F.dropout(weights, self.dropout) @ v
        return y

    def forward_cached(self, x: torch.Tensor, rope, cache, layer: int) -> torch.Tensor:
        """forward() while decoding: x's T new tokens attend to the cached keys and values and
        their own, which the cache then keeps.

        A static cache (KVCache(static=True), made for torch.compile) takes the written-out formula:
        compiled, its mask and softmax fuse around the two small matmuls, cheaper than the fused
        kernel's fixed cost."""
        q, k, v = self.qkv(x, rope, offset=cache.pos)  # (B, H, T, D), (B, KV, T, D) x 2
        mask = cache.attn_mask(x.size(1), self.window)  # (T, S) bool, or None where the causal rule says the same
        k, v = cache.update(layer, k, v)  # (B, KV, S, D): the cached keys and values, then these
        if cache.static:
            return self.project(self.written_out(q, k, v, mask))
        return self.project(self.attend(q, k, v, mask))  # (B, T, C)

    def steps(self, x: torch.Tensor, rope=None) -> dict:
        """forward() for a whole sequence (no cache, no dropout), with every step kept.

        q, k, v (B, H, T, D), scores/scaled/masked/weights (B, H, T, T), heads (B, H, T, D), out
        (B, T, C). With grouped heads, a query head's k and v are its group's key/value head.
        """
        q, k, v = self.qkv(x, rope)
        k, v = repeat_heads(k, self.n_head), repeat_heads(v, self.n_head)  # (B, H, T, D)
        mask = self.window_mask(x.size(1), x.device)  # (T, T) or None
        s = attention_steps(q, k, v, causal=True, mask=mask, scale=self.scale)  # scores, ..., weights (B, H, T, T); out
        heads = s.pop("out")  # (B, H, T, D)
        return dict(q=q, k=k, v=v, **s, heads=heads, out=self.project(heads))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.ln_1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg, layer)
        self.ln_2 = make_norm(cfg)
        self.mlp = FeedForward(cfg)

    def forward(self, x, rope=None, cache=None, layer: int = 0):
        x = x + self.attn(self.ln_1(x), rope=rope, cache=cache, layer=layer)  # (B, T, C)
        return x + self.mlp(self.ln_2(x))  # (B, T, C)


class SandwichBlock(Block):
    """model.sandwich_norm (Gemma 2 and 3): each sub-layer's output is normalised too before it is
    added (after_attn, after_mlp). A class of its own, so the default block's step calls no
    do-nothing layer (decoding one token at a time pays for every call)."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        self.after_attn = make_norm(cfg, after_sublayer=True)
        self.after_mlp = make_norm(cfg, after_sublayer=True)
        # the layers in the order they compute: an optimizer's saved state lists parameters in it
        order = ("ln_1", "attn", "after_attn", "ln_2", "mlp", "after_mlp")
        self._modules = {name: self._modules[name] for name in order}

    def forward(self, x, rope=None, cache=None, layer: int = 0):
        x = x + self.after_attn(self.attn(self.ln_1(x), rope=rope, cache=cache, layer=layer))  # (B, T, C)
        return x + self.after_mlp(self.mlp(self.ln_2(x)))  # (B, T, C)


class Transformer(nn.Module):
    """Token embedding + positions -> n_layer blocks -> final norm -> LM head (tied by default)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size is None:
            raise ConfigError(
                "model.vocab_size is not set: it comes from the tokenizer "
                "(ModelConfig(vocab_size=tokenizer.vocab_size, ...))"
            )
        check_fits_in_memory(cfg)
        self.config = cfg
        # rows padded to a multiple of 64; tied to the head, its gradient is added into the head's
        self.wte = (TiedEmbedding if cfg.tie_embeddings else nn.Embedding)(padded_vocab(cfg.vocab_size), cfg.n_embd)
        additive = {"learned": LearnedPositions, "sinusoidal": SinusoidalPositions}.get(cfg.positions)
        self.wpe = additive(cfg.block_size, cfg.n_embd) if additive else None  # None: rope rotates q, k instead
        rotary = cfg.positions == "rope"
        self.rope = Rotary(cfg.block_size, cfg.head_size, cfg.rope_base, rope_scaling(cfg)) if rotary else None
        self.rope_local = local_rope(cfg)  # None, or the sliding layers' own (Gemma 3)
        self.drop = nn.Dropout(cfg.dropout)
        block = SandwichBlock if cfg.sandwich_norm else Block
        self.blocks = nn.ModuleList(block(cfg, i) for i in range(cfg.n_layer))
        self.ln_f = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, padded_vocab(cfg.vocab_size), bias=False)
        self.checkpoint_blocks = False  # activation checkpointing: set by training, see checkpointing()
        self.weights_dtype = torch.float32  # what training writes the weights files in (run.weights_dtype)
        self.compiled = False  # compile_regions() compiles the head with its loss (the plain path)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Every weight's initial value, in one place.

        - Linear and Embedding weights: normal(0, 0.02) (GPT-2).
        - Output projections that write into the residual stream (attn.c_proj, mlp.c_proj):
          normal(0, 0.02 / sqrt(2 * n_layer)), so the stream's variance stays about constant
          with depth; each block adds two such terms.
        - Biases: zero. Norm weights: one (their modules' own reset).
        - Embedding rows past vocab_size (padding): zero; they are never fed or predicted.
        - An untied LM head: zero, so every token starts equally likely and the first steps
          train the head from the features instead of undoing a random projection.
        """
        resid_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, resid_std)
            elif p.dim() == 2:  # linear and embedding matrices
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        for m in self.modules():
            if isinstance(m, (nn.LayerNorm, nn.RMSNorm)):
                m.reset_parameters()
        self.wte.weight[self.config.vocab_size :].zero_()
        if not self.config.tie_embeddings:
            self.lm_head.weight.zero_()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache=None, logits: bool = True):
        """idx (B, T) token ids -> (logits (B, T, vocab_size), loss or None).

        targets (B, T): next-token ids, -100 where no loss is wanted. cache: a KVCache to read
        and extend; the model advances cache.pos by T after all layers have run. logits=False (with
        targets, what training asks): the logits are not kept, (None, loss), and the loss may come
        from the fused head (lm_loss), which never holds them whole.
        """
        self._check_inputs(idx, targets, cache)
        B, T = idx.shape
        offset = 0 if cache is None else cache.pos  # where these T tokens stand in the sequence
        x = self.drop(self.embed(idx, offset))  # (B, T, C)
        for i, block in enumerate(self.blocks):
            if self.checkpointing(cache):
                x = torch.utils.checkpoint.checkpoint(block, x, self.rope_of(i), None, i, use_reentrant=False)
            else:
                x = block(x, rope=self.rope_of(i), cache=cache, layer=i)  # (B, T, C)
        if cache is not None:
            cache.advance(T)
        if targets is None or logits:
            return self.logits_and_loss(x, targets)
        return None, self.loss(x, targets)

    def embed(self, idx: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """idx (B, T) -> where the residual stream starts (B, T, C): token embeddings, plus learned
        or sinusoidal positions from `offset` on (rotary adds none here: it rotates q and k)."""
        x = self.wte(idx)  # (B, T, C)
        if self.config.embed_scale:  # Gemma: embeddings at the residual stream's scale, though tied to the head
            x = x * math.sqrt(self.config.n_embd)
        if self.wpe is not None:
            x = x + self.wpe(idx.size(1), offset)  # (B, T, C) + (T, C)
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output (B, T, C) -> logits (B, T, vocab_size): final norm, LM head,
        and the soft cap when model.logit_softcap is set (padding rows are never predicted)."""
        logits = self.lm_head(self.ln_f(x))[..., : self.config.vocab_size]  # (B, T, V)
        if self.config.logit_softcap is not None:
            logits = soft_cap(logits, self.config.logit_softcap)
        return logits

    def logits_and_loss(
        self, x: torch.Tensor, targets: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last block's output (B, T, C) -> (logits (B, T, V), mean cross-entropy over the
        targets that are not -100, or None without targets)."""
        logits = self.logits(x)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=IGNORE
            )
        return logits, loss

    # ---- the options: each one a place the default path above does not need

    def rope_of(self, layer: int):
        """The rotary positions block `layer` turns q and k by: the model's, or the sliding layers' own."""
        return self.rope_local if self.rope_local is not None and self.config.slides(layer) else self.rope

    def checkpointing(self, cache) -> bool:
        """Activation checkpointing (training sets checkpoint_blocks): a block keeps no activations
        and runs again in backward, less memory for about one more forward pass of compute."""
        return self.checkpoint_blocks and self.training and cache is None and torch.is_grad_enabled()

    def loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss alone, as training and evaluation ask for it: from the fused head (lm_loss), which
        never holds the logits whole, where that computes the same number; with no gradient to find
        (evaluation) from its chunks for a large vocabulary; else from logits_and_loss."""
        fused = self.fused_loss_applies(x)
        if fused or self.chunked_loss_applies(x):
            B, T, C = x.shape
            h = self.ln_f(x).reshape(B * T, C)  # (B*T, C)
            head = self.lm_head.weight[: self.config.vocab_size]  # (V, C)
            return (linear_cross_entropy if fused else cross_entropy_in_chunks)(h, head, targets.reshape(-1))
        return self.logits_and_loss(x, targets)[1]

    def chunked_loss_applies(self, x: torch.Tensor) -> bool:
        """A loss with no backward (evaluation) from the head's chunks: for a large vocabulary only
        (LARGE_VOCAB), whose whole logits are the largest tensors of a fine-tune of a downloaded model."""
        return (
            not (torch.is_grad_enabled() and x.requires_grad)
            and self.config.vocab_size >= LARGE_VOCAB
            and self.config.logit_softcap is None
            and not self.compiled
        )

    def fused_loss_applies(self, x: torch.Tensor) -> bool:
        """The fused head computes the plain loss for a step that will run backward: not with a soft
        cap or a compiled head; under autocast only for a large vocabulary (LARGE_VOCAB), where the
        logits are a step's largest tensors (a Llama 3's 128,256 per token, held in float32 several
        times over), while a small one's plain path is what its measured speeds are of."""
        autocast = torch.is_autocast_enabled(x.device.type)
        return (
            torch.is_grad_enabled()
            and x.requires_grad
            and x.dtype == torch.float32
            and self.config.logit_softcap is None
            and not self.compiled
            and (not autocast or self.config.vocab_size >= LARGE_VOCAB)
        )

    def compile_regions(self) -> None:
        """torch.compile what a training step spends its time on: each block, and the head with its loss.

        The token embedding stays eager: inductor's embedding backward adds gradient rows with atomic
        adds from several threads, in an order that changes from run to run, which would end
        bit-exact resume. The blocks share one compiled graph (their code is the same).
        """
        constant_while_compiling()  # the GPU check inside attention, read once while compiling
        for block in self.blocks:
            block.compile()
        self.logits_and_loss = torch.compile(self.logits_and_loss)
        self.compiled = True

    @classmethod
    def holding(cls, cfg: ModelConfig, state: dict[str, torch.Tensor]) -> Transformer:
        """A Transformer for cfg whose parameters are state's tensors themselves (a state dict, the
        embedding and head padded as wte is): no copy, and no random initialisation to overwrite,
        so a downloaded model is never held twice. Built on the meta device, given each tensor,
        its head tied again and its position tables computed."""
        with torch.device("meta"):
            model = cls(cfg)
        model.load_state_dict(state, strict=False, assign=True)  # strict=False: a tied head may come once
        if cfg.tie_embeddings:
            model.lm_head.weight = model.wte.weight  # assign gave each name its own parameter: share again
        if model.rope is not None:  # computed, never saved: computed now, off the meta device
            model.rope = Rotary(cfg.block_size, cfg.head_size, cfg.rope_base, rope_scaling(cfg))
            model.rope_local = local_rope(cfg)
        if isinstance(model.wpe, SinusoidalPositions):
            model.wpe = SinusoidalPositions(cfg.block_size, cfg.n_embd)
        left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if left:
            raise ValueError(f"the state dict has no {', '.join(left[:3])}")
        return model

    # ---- counting

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without position embeddings (as nanoGPT counts), since
        the token embedding is also the output layer when tied and so does real compute."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and isinstance(self.wpe, LearnedPositions):
            n -= self.wpe.wpe.weight.numel()
        return n

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6N for the matmuls forward and backward, plus 12·L·C·T for
        attention's scores and weighted sum."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * c.block_size

    # ---- the guard

    def _check_inputs(self, idx: torch.Tensor, targets: torch.Tensor | None, cache) -> None:
        """forward's inputs, refused in one line: ids that are not (B, T), outside the vocabulary,
        or a sequence longer than block_size."""
        if idx.dim() != 2:
            raise ValueError(f"idx must be (batch, time) token ids, got shape {tuple(idx.shape)}")
        # on the CPU only (a GPU check would wait for the device), and not while decoding with a
        # cache, where the ids come from the sampler and every token would pay for the check
        if cache is None and idx.device.type == "cpu" and not torch.compiler.is_compiling():
            check_ids(idx, self.config.vocab_size, "idx")  # one pass over the ids (aminmax)
            if targets is not None:
                check_ids(targets[targets != IGNORE], self.config.vocab_size, "targets")
        offset = 0 if cache is None else cache.pos
        # a static cache's position is a tensor: checking it would cost a device sync per step
        if isinstance(offset, int) and offset + idx.size(1) > self.config.block_size:
            raise ValueError(
                f"sequence of {offset + idx.size(1)} tokens exceeds block_size "
                f"{self.config.block_size}; crop the input to the last block_size tokens"
            )


def soft_cap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """model.logit_softcap: a smooth clip to (-cap, cap), so confident logits cannot grow without bound."""
    return cap * torch.tanh(logits.float() / cap)
