"""GGUF export, checked by llama.cpp itself (llama-cpp-python): the same tokens, logits and greedy
text for each architecture the export writes (GPT-2, Llama, Qwen3, GPT-NeoX, Qwen2, Mistral, Phi-3,
Gemma 3), and f16/q8_0 files that load
and agree on the next token. The command line's refusals run without llama.cpp.

Each model is a small random minitf model saved as a run directory; its weights are moved well
off their initial values (norm weights off one, biases off zero, logits of unit scale) so a
swapped, mis-permuted or dropped tensor shows in the logits.
"""

import ctypes
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import minitf
from minitf import MinitfError
from minitf.config import Config, ModelConfig, SampleConfig
from minitf.generate import generate_tokens
from minitf.model import Transformer
from minitf.training.checkpoint import WEIGHTS, save_weights, write_run_files
from tests.support import ROOT
from tests.support.corpus import make_play
from tests.support.sentencepiece import sentencepiece_style

INSTALL = "pip install -e '.[gguf,llamacpp]'"


# what the tokenizer sees: unicode, runs of spaces, newlines and tabs, emoji, digits, punctuation,
# contractions (GPT-2's regex splits 's 't 're 've 'm 'll 'd, case-sensitively), the separator
STRINGS = [
    "ROMEO: O love, sweet night!",
    "héllo wörld ✓  two  spaces",
    "   leading spaces and trailing   ",
    "line one\nline two\n\n\nthree blank\r\nwindows",
    "\ttabbed\t\tcolumns\t",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧",
    "digits 1234567890 and 3.14159, 1,000,000",
    "punctuation!?;:...---(())[]{}<>@#$%^&*_+=~`|\\/\"'",
    "it's they're we've I'm you'll he'd IT'S",
    "日本語のテキストと中文文本",
    "Ελληνικά и русский текст",
    "mixed123abc 45.6e-7 x_y z-w",
    " ",
    "\n",
    "a",
    "JULIET:\n\tgentle <|endoftext|> fair",
    "<|endoftext|>",
    "ﬁne ligatures and combining é (e + U+0301)",
    "Tschüß, Straße; naïve café; œuvre",
    "O sorrow, O fair heaven; gentle death.\n\nNURSE:\nO name!",
    "GATTACA" * 100,  # a piece longer than the tokenizer's training bound (MAX_PIECE_BYTES): split the same
]


# the tokenizer learns merges on the plays plus a little of every script above, so tokens span
# multi-byte characters and spaces as they do in a real vocabulary
EXTRA = "\n".join(STRINGS[:12]) * 20


PROMPT = "ROMEO:\nO gentle night, sweet love"


ARCHS = {
    "gpt2": dict(positions="learned"),
    "gpt2-sinusoidal-nobias-untied": dict(positions="sinusoidal", bias=False, tie_embeddings=False),
    "llama": dict(positions="rope", norm="rmsnorm", ffn="swiglu", bias=False),
    "llama-bias-untied": dict(
        positions="rope", norm="rmsnorm", ffn="swiglu", bias=True, tie_embeddings=False, rope_base=500.0
    ),
    "qwen3": dict(positions="rope", norm="rmsnorm", ffn="swiglu", qk_norm=True, bias=False),
    # grouped KV heads (model.n_kv_head): llama.cpp's head_count_kv
    "llama-gqa": dict(positions="rope", norm="rmsnorm", ffn="swiglu", bias=False, n_kv_head=2),
    "qwen3-gqa": dict(positions="rope", norm="rmsnorm", ffn="swiglu", qk_norm=True, bias=False, n_kv_head=1),
    "gptneox": dict(),  # the default recipe's shape: rotary positions, LayerNorm, tanh GELU
    "gptneox-nobias-untied": dict(positions="rope", bias=False, tie_embeddings=False, rope_base=500.0),
    # the downloaded families: Qwen3-0.6B's heads wider than n_embd / n_head, with learned q/k gains
    "qwen3-head-dim": dict(positions="rope", norm="rmsnorm", ffn="swiglu", qk_norm=True, bias=False, head_dim=32),
    # Llama 3.x's rotary scaling, with an original context short enough to matter in 40 tokens
    "llama-rope-llama3": dict(
        positions="rope",
        norm="rmsnorm",
        ffn="swiglu",
        bias=False,
        rope_scaling="llama3",
        rope_factor=8.0,
        rope_original_context=16,
    ),
    "llama-rope-linear": dict(
        positions="rope",
        norm="rmsnorm",
        ffn="swiglu",
        bias=False,
        rope_scaling="linear",
        rope_factor=2.0,
        rope_base=500.0,
    ),
    "qwen2": dict(
        positions="rope", norm="rmsnorm", ffn="swiglu", bias=False, qkv_bias=True, n_kv_head=2, rope_base=500.0
    ),
    "mistral": dict(positions="rope", norm="rmsnorm", ffn="swiglu", bias=False, family="mistral", sliding_window=64),
    "phi3": dict(positions="rope", norm="rmsnorm", ffn="swiglu", bias=False, family="phi3"),
    # Gemma 3 as llama.cpp's gemma3 graph takes it: five sliding layers in six (a window of 8, shorter
    # than the prompt), rotating at base 10,000 beside the global layers' 1,000,000
    "gemma3": dict(
        positions="rope",
        norm="rmsnorm",
        ffn="geglu",
        qk_norm=True,
        bias=False,
        embed_scale=True,
        sandwich_norm=True,
        family="gemma3",
        n_layer=6,
        n_kv_head=1,
        head_dim=32,
        sliding_window=8,
        global_every=6,
        rope_base=1e6,
        rope_local_base=10000.0,
        norm_eps=1e-6,
    ),
}


SEEDS = {"qwen2": 4, "gemma3": 6}


@pytest.fixture(scope="module")
def llama_cpp():
    pytest.importorskip("gguf", reason=f"the gguf package is not installed ({INSTALL})")
    return pytest.importorskip("llama_cpp", reason=f"llama-cpp-python is not installed ({INSTALL})")


@pytest.fixture(scope="module")
def tokenizer():
    return minitf.Tokenizer.train([make_play(i) for i in range(4)] + [EXTRA], 400)


def save_run(run_dir, tokenizer, seed: int = 1, **options):
    """A run directory (config.yaml, tokenizer.json, model.safetensors) of a random model."""
    cfg = Config()
    shape = dict(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=2, n_head=4, n_embd=64)
    cfg.model = ModelConfig(**{**shape, **options})
    torch.manual_seed(seed)
    model = Transformer(cfg.model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.2 if p.dim() == 1 else 0.1))
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_files(run_dir, cfg, tokenizer)
    save_weights(model, run_dir / WEIGHTS, step=0, tokenizer_hash=tokenizer.hash)
    return run_dir


def export(run_dir, out, *args):
    from minitf.cli.export_gguf import main

    main(["--run", str(run_dir), "--out", str(out), *args])
    return out


def load_llama(llama_cpp, path, n_ctx):
    """llama.cpp with its KV cache in float32 (its default, float16, rounds every key and value to
    11 significant bits: logits then move by ~1e-3, more than the f32 bound allows)."""
    f32 = llama_cpp.GGML_TYPE_F32
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=2, type_k=f32, type_v=f32
    )


def llama_logits(llm, ids) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)])  # (T, V)


def detokenized(llama_cpp, llm, ids) -> bytes:
    """llama.cpp's own text of `ids` (llama_detokenize, special tokens as their text), which takes off
    the space a SentencePiece-style vocabulary put before the text; llama-cpp-python's detokenize
    joins the tokens' pieces and keeps it."""
    buffer = ctypes.create_string_buffer(16 * len(ids) + 16)
    n = llama_cpp.llama_detokenize(
        llm._model.vocab, (llama_cpp.llama_token * len(ids))(*ids), len(ids), buffer, len(buffer), False, True
    )
    assert n >= 0
    return buffer.raw[:n]


def minitf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids]))[0][0].numpy()  # (T, V)


def test_tokenization_equals_minitf(llama_cpp, tokenizer, tmp_path):
    run = save_run(tmp_path / "run", tokenizer)
    llm = load_llama(llama_cpp, export(run, tmp_path / "m.gguf"), 64)
    assert llm.n_vocab() == tokenizer.vocab_size == 400
    assert llm.token_eos() == llm.token_bos() == tokenizer.eot_id
    merged = 0
    for text in STRINGS:
        ids = tokenizer.encode(text)
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids, text
        assert llm.detokenize(ids, special=True) == text.encode(), text
        merged += len(ids) < len(text.encode())
    assert merged >= 15  # the strings exercise merges, not only single bytes
    assert tokenizer.encode("<|endoftext|>") == [tokenizer.eot_id]


@pytest.mark.parametrize("name", ["llama-bpe", "qwen2", "smollm"])
def test_a_downloaded_tokenizers_own_split_is_written_by_its_llama_cpp_name(llama_cpp, tmp_path, name):
    """A Llama 3 tokenizer (its regex split, digits by three, ignore_merges), a Qwen one (digits one
    by one, Qwen's NFC normalizer) and a SmolLM2 one (each digit alone, then GPT-2's split) export
    under llama.cpp's names for them, and llama.cpp tokenizes every string as minitf does (GPT-2's
    name would split digits, newlines and contractions apart)."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    from minitf.export.gguf_vocab import NAMED_SPLITS, check_tokenizer

    regex, ignore_merges = next(((r, m) for r, (n, m) in NAMED_SPLITS.items() if n == name), (None, False))
    tok = minitf.Tokenizer.train([make_play(i) for i in range(4)] + [EXTRA, "2024 12345 1,000,000 it's\n\n" * 20], 400)
    if name == "smollm":  # SmolLM2's: each digit alone, then GPT-2's split
        split, level = pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False, use_regex=True)
    else:
        split = pre_tokenizers.Split(Regex(regex), behavior="isolated")
        level = pre_tokenizers.ByteLevel(False, use_regex=False)
    tok.backend.pre_tokenizer = pre_tokenizers.Sequence([split, level])
    tok.backend.model.ignore_merges = ignore_merges
    if name == "qwen2":
        tok.backend.normalizer = normalizers.NFC()
    assert json.loads(tok.to_json())["model"]["ignore_merges"] is ignore_merges
    llm = load_llama(llama_cpp, export(save_run(tmp_path / "run", tok), tmp_path / "m.gguf"), 64)
    assert llm.metadata["tokenizer.ggml.pre"] == name
    for text in [*STRINGS, "2024 12345 1,000,000\n\n  it's 3.14"]:
        ids = tok.encode(text)
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids, text
        assert llm.detokenize(ids, special=True) == text.encode(), text
    tok.backend.model.ignore_merges = not ignore_merges  # what llama.cpp's tokenizer of that name would not do
    with pytest.raises(MinitfError, match=f"ignore_merges={str(not ignore_merges).lower()} where llama.cpp's {name}"):
        check_tokenizer(tok)


@pytest.mark.parametrize("style, prefix", [("gemma", False), ("metaspace-never", False), ("mistral", True)])
def test_a_sentencepiece_style_tokenizer_is_written_as_llama_cpps_llama_vocabulary(llama_cpp, tmp_path, style, prefix):
    """Gemma's and Mistral's tokenizers as transformers writes them (▁ for a space, <0xXX> for a
    character the vocabulary lacks, a merge for every cut of a piece; Gemma's tab as itself, its
    whitespace runs of equal score with their merges interleaved) export as llama.cpp's
    SentencePiece-style vocabulary, with a space put before each text for Mistral's: llama.cpp
    tokenizes every string, special tokens among them, as minitf does, and decodes the ids to
    minitf's text (with the scores all equal, several strings split otherwise)."""
    from minitf.export.gguf_vocab import check_tokenizer

    tok = sentencepiece_style([make_play(i) for i in range(4)] + [EXTRA], 400, style)
    llm = load_llama(llama_cpp, export(save_run(tmp_path / "run", tok), tmp_path / "m.gguf"), 64)
    assert llm.metadata["tokenizer.ggml.model"] == "llama" and "tokenizer.ggml.merges" not in llm.metadata
    assert llm.metadata["tokenizer.ggml.add_space_prefix"] == str(prefix).lower()
    marked = ["[INST] What is 17?[/INST] It is 42.</s>", "<start_of_turn>user\nhi<end_of_turn>\n", "<unk> <s>"]
    marked += ["characters it never saw: Æ ∑ ♞ ₂ 🦜"]
    fallbacks = 0
    for text in [*STRINGS, *marked]:
        ids = tok.encode(text)
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids, text
        assert detokenized(llama_cpp, llm, ids) == tok.decode(ids).encode(), text
        fallbacks += any(tok.backend.id_to_token(i).startswith("<0x") for i in ids)
    assert fallbacks >= 5  # characters the vocabulary lacks went to bytes, in llama.cpp too
    # what llama.cpp would tokenize otherwise is refused: a ▁ a Metaspace does not put before " text",
    # merges that are not one for each cut of a piece (llama.cpp joins any pair that makes a piece)
    with pytest.raises(MinitfError, match=r"prepend_scheme.*first.*one before every text or before none"):
        check_tokenizer(sentencepiece_style([EXTRA], 300, "metaspace-first"))
    spec = json.loads(tok.to_json())
    del spec["model"]["merges"][-1]
    with pytest.raises(MinitfError, match="not one for each cut of a token in two"):
        check_tokenizer(minitf.Tokenizer.load_str(json.dumps(spec)))


class Fp16TableGelu(torch.nn.Module):
    """GELU as llama.cpp computes it on a CPU (ggml's GGML_GELU_FP16): the input rounded to float16,
    looked up in a table of float16 tanh-GELU values; 0 below -10, x above 10."""

    def forward(self, x):
        y = torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
        return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


class Fp16TableGeGLU(torch.nn.Module):
    """Gemma's gated GELU with llama.cpp's table GELU on the gate."""

    def forward(self, h):
        gate, up = h.chunk(2, dim=-1)
        return Fp16TableGelu()(gate) * up


@pytest.mark.parametrize("name", list(ARCHS))
def test_llama_cpp_computes_the_minitf_model(llama_cpp, tokenizer, tmp_path, name):
    """f32: llama.cpp's logits equal minitf's at every prompt position, greedy text identical for 32 tokens.

    Llama and Qwen3 agree within 1e-4 (Qwen3's q/k norm uses model.norm_eps, as llama.cpp's
    qwen3 graph). GPT-2, GPT-NeoX and Gemma 3 (its gate) agree within 1e-3 with a minitf whose GELU rounds as
    llama.cpp's CPU GELU does (a float16 table), and within 3e-3 (measured 1.3e-3) with minitf's own
    float32 GELU: the gap is that table, not the export.
    """
    from minitf.export.architecture import export_format

    # a seed under which this random model's greedy text does not repeat one token
    run = save_run(tmp_path / "run", tokenizer, seed=SEEDS.get(name, 1), **ARCHS[name])
    model, tok, cfg = minitf.load_run(run)
    fmt = export_format(cfg.model)
    assert fmt == name.split("-")[0]
    llm = load_llama(llama_cpp, export(run, tmp_path / "m.gguf"), cfg.model.block_size)
    ids = tok.encode(PROMPT)
    ours, theirs = minitf_logits(model, ids), llama_logits(llm, ids)
    assert ours.shape == theirs.shape == (len(ids), 400)
    assert ours.std() > 0.5  # logits of real scale, so the bounds are tight
    if fmt not in ("gpt2", "gptneox", "gemma3"):
        assert np.abs(ours - theirs).max() < 1e-4
    else:
        assert np.abs(ours - theirs).max() < 3e-3
        exact_gelu = [b.mlp.act for b in model.blocks]
        for b in model.blocks:
            b.mlp.act = Fp16TableGeGLU() if fmt == "gemma3" else Fp16TableGelu()
        assert np.abs(minitf_logits(model, ids) - theirs).max() < 1e-3
        for b, act in zip(model.blocks, exact_gelu):
            b.mlp.act = act

    greedy = SampleConfig(max_new_tokens=32, temperature=0.0, top_k=None)
    ours = [int(t[0]) for t in generate_tokens(model, ids, greedy)]
    llm.reset()
    theirs = []
    for t in llm.generate(ids, temp=0.0):
        theirs.append(t)
        if len(theirs) == 32:
            break
    assert ours == theirs and len(set(ours)) >= 5  # not one token repeated


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen3", "gptneox"])
def test_f16_and_q8_0_files_load_and_agree(llama_cpp, tokenizer, tmp_path, name):
    """Smaller files. f16 rounds each weight to 11 significant bits: logits move by < 5e-3 here
    (logit std 0.8) and the most likely next token never changes. q8_0 keeps 8 bits per weight with
    one scale per block of 32, a relative error up to 1/254 of the block's largest weight: logits
    move by < 0.12 here, and the top token changes only where the two best are that close (at most
    1 of the 9 prompt positions here; a trained model's margins are wider)."""
    run = save_run(tmp_path / "run", tokenizer, **ARCHS[name])
    model, tok, cfg = minitf.load_run(run)
    ids = tok.encode(PROMPT)
    ours = minitf_logits(model, ids)
    sizes = {}
    for dtype, tol, top1 in (("f16", 1e-2, 1.0), ("q8_0", 0.2, 0.75)):
        path = export(run, tmp_path / f"m-{dtype}.gguf", "--dtype", dtype)
        sizes[dtype] = path.stat().st_size
        llm = load_llama(llama_cpp, path, cfg.model.block_size)
        theirs = llama_logits(llm, ids)
        assert np.abs(ours - theirs).max() < tol, dtype
        assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= top1, dtype
        llm.reset()
        out = []
        for t in llm.generate(ids, temp=0.0):
            out.append(t)
            if len(out) == 8:
                break
        assert len(out) == 8
    f32 = export(run, tmp_path / "m-f32.gguf").stat().st_size
    assert sizes["q8_0"] < sizes["f16"] < f32


def test_refusals(tokenizer, tmp_path):
    pytest.importorskip("gguf", reason=f"the gguf package is not installed ({INSTALL})")
    from minitf.export.gguf_vocab import check_tokenizer

    run = save_run(tmp_path / "run", tokenizer)
    with pytest.raises(MinitfError, match="does not exist"):
        export(tmp_path / "nope", tmp_path / "x.gguf")
    with pytest.raises(MinitfError, match="is a directory; name the file to write"):
        export(run, tmp_path)
    out = tmp_path / "m.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(MinitfError, match="already exists; pass --force"):
        export(run, out)
    assert out.read_bytes() == b"keep me"
    with pytest.raises(MinitfError, match="is a file, not a directory"):
        export(run, out / "m.gguf")
    export(run, out, "--force")
    assert out.read_bytes()[:4] == b"GGUF"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left
    # a model no architecture computes: every blocking key named, nothing written
    odd = save_run(tmp_path / "odd", tokenizer, positions="rope", norm="rmsnorm", logit_softcap=30.0)
    with pytest.raises(MinitfError, match=r"\(model.ffn=gelu, model.logit_softcap=30.0, model.norm=rmsnorm block it\)"):
        export(odd, tmp_path / "odd.gguf")
    assert not (tmp_path / "odd.gguf").exists()
    # a Gemma 3 whose layer pattern llama.cpp's gemma3 graph does not follow (it fixes five sliding in six)
    gemma = save_run(tmp_path / "gemma", tokenizer, **{**ARCHS["gemma3"], "global_every": 2})
    with pytest.raises(MinitfError, match=r"llama.cpp's gemma3 graph fixes model.global_every \(llama.cpp's: 6\)"):
        export(gemma, tmp_path / "gemma.gguf")
    # a tokenizer llama.cpp would split differently is refused, not silently mis-tokenized
    from tokenizers import pre_tokenizers

    tokenizer.backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    try:
        with pytest.raises(MinitfError, match="cannot be exported to GGUF"):
            check_tokenizer(tokenizer)
    finally:
        tokenizer.backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    check_tokenizer(tokenizer)


def test_script_prints_one_line_and_exits_2(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "export_gguf.py"), "--run", str(tmp_path / "nope"), "--out", "x.gguf"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: run directory") and r.stderr.count("\n") == 1


def test_bench_rows_run(llama_cpp, monkeypatch):
    """bench.py --only generate's llama.cpp rows, at a tiny size (timings are printed, never asserted)."""
    from bench.llamacpp import llamacpp_decode

    cfg = Config()
    cfg.model = ModelConfig(vocab_size=300, block_size=32, n_layer=1, n_head=2, n_embd=32)
    lines = []
    res = llamacpp_decode(cfg, torch.device("cpu"), 8, 2, log=lines.append, compile=False)
    assert set(res["rows"]) == {"minitf eager", "minitf bfloat16", "llama.cpp f32", "llama.cpp f16", "llama.cpp q8_0"}
    assert res["new_tokens"] == 8 and res["format"] == "gptneox"  # the default shape
    assert all(len(r["rates"]) == 2 and r["tokens_per_s"] > 0 for r in res["rows"].values())
    assert len(lines) == 5 and all("x minitf eager" in line for line in lines)
    cfg.model.vocab_size = 97  # below the 256 bytes + <|endoftext|> a GGUF tokenizer holds
    assert llamacpp_decode(cfg, torch.device("cpu"), 8, 1, log=lines.append) is None
    assert "skipped" in lines[-1]


def test_f16_refuses_a_weight_beyond_its_range(tokenizer, tmp_path):
    pytest.importorskip("gguf", reason=f"the gguf package is not installed ({INSTALL})")
    from minitf.export.gguf import write_gguf

    model = Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=2, n_head=4, n_embd=64))
    with torch.no_grad():
        model.blocks[1].mlp.c_fc.weight[3, 5] = -70000.0  # float16 would hold it as -inf
    out = tmp_path / "m.gguf"
    with pytest.raises(MinitfError) as e:
        write_gguf(model, tokenizer, out, "f16")
    assert str(e.value) == (
        "--dtype f16 cannot hold blk.1.ffn_up.weight: its largest value is 70000, beyond float16's 65504; "
        "export with --dtype f32 or q8_0"
    )
    assert not out.exists()
    write_gguf(model, tokenizer, out, "q8_0")  # q8_0 scales the block by 1/127: it fits
    assert out.read_bytes()[:4] == b"GGUF"
