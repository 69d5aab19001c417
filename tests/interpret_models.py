"""Hand-built models for minitf.interpret's tests: attention weights set by hand, so a head's
pattern, and so its score, is known exactly.

The residual stream (width 48) is laid out in three slots of 16: a one-hot of the position
(learned positions), a one-hot of the token, and a slot where layer 0 writes the previous token.
- layer 0, head 0: a previous-token head (query of position p = the key of position p - 1), whose
  value is the token and whose output lands in the previous-token slot;
- layer 1, head 0: an induction head: the query is the current token, the key the previous-token
  slot, so position i looks at the token after an earlier copy of its own, and copies that token
  (10x) into the token slot, which the tied LM head reads: the model predicts it;
- head 1 of each layer has zero queries and keys: uniform attention over the tokens so far.
The feed-forward networks are zero and there are no biases.
"""

import torch

import minitf

SLOT = 16  # positions, tokens and previous tokens each take 16 dimensions of the residual stream
SHARP = 100.0  # scale of the hand-set queries: a match out-scores a miss by hundreds, softmax ~ one-hot
COPY = 10.0  # how loudly the induction head writes the token it found: the model then predicts it


def induction_model(norm: str = "rmsnorm") -> minitf.Transformer:
    cfg = minitf.ModelConfig(
        vocab_size=SLOT,
        block_size=SLOT,
        n_layer=2,
        n_head=2,
        n_embd=3 * SLOT,
        bias=False,
        norm=norm,
        positions="learned",
    )
    model = minitf.Transformer(cfg)
    D = cfg.n_embd // cfg.n_head  # 24: head 0's q, k, v rows are 0..15 of each 24-row block
    eye = torch.eye(SLOT)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for m in model.modules():
            if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
                m.reset_parameters()
        model.wpe.wpe.weight[:, :SLOT] = eye  # position p -> dimension p
        model.wte.weight[:SLOT, SLOT : 2 * SLOT] = eye  # token t -> dimension 16 + t
        q_rows, k_rows, v_rows = slice(0, SLOT), slice(2 * D, 2 * D + SLOT), slice(4 * D, 4 * D + SLOT)
        w0 = model.blocks[0].attn.c_attn.weight  # (3 * 48, 48): q heads, k heads, v heads
        w0[q_rows, 1:SLOT] = SHARP * eye[:, : SLOT - 1]  # query row p - 1 reads position p
        w0[k_rows, :SLOT] = eye  # key row p reads position p
        w0[v_rows, SLOT : 2 * SLOT] = eye  # value: the token
        model.blocks[0].attn.c_proj.weight[2 * SLOT :, :SLOT] = eye  # head 0's output -> previous-token slot
        w1 = model.blocks[1].attn.c_attn.weight
        w1[q_rows, SLOT : 2 * SLOT] = SHARP * eye  # query: the current token
        w1[k_rows, 2 * SLOT :] = eye  # key: the previous token, written by layer 0
        w1[v_rows, SLOT : 2 * SLOT] = eye  # value: the token there, the one after the earlier copy
        model.blocks[1].attn.c_proj.weight[SLOT : 2 * SLOT, :SLOT] = COPY * eye  # -> the token slot, read by the head
    return model.eval()
