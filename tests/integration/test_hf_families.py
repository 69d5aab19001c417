"""The models people download, imported with transformers' logits and written back as themselves:
Qwen3 (learned q/k-norm gains, head_dim apart from hidden / heads), Llama 3.x (rope_type llama3),
Qwen2 and Qwen2.5 (biases on q, k, v only), Mistral (sliding window), Phi-3 (fused q|k|v and
gate|up) and Gemma 3 (scaled embeddings, (1 + w) norms before and after each sub-layer, GeGLU,
sliding layers with their own rotary base between global ones, query_pre_attn_scalar).

Each model is built by transformers from its family's real config (the attention's real shape:
width, heads, key/value heads, head_dim, rotary settings; one layer and a smaller vocabulary and
MLP where the real ones would take gigabytes) with every weight moved off its initial value, norm
gains and biases included, as in a trained checkpoint.
"""

import json

import pytest
import torch

import minitf
from minitf.config import ROPE_SCALING_DEFAULTS
from minitf.export.hf import from_hf, load_pretrained, to_hf
from tests.support import ROOT
from tests.support.models import LLAMA

V = 300  # the test tokenizer's vocabulary: every family's embedding is cut to it

# each family's config.json as published (the attention and rotary keys), one layer
FAMILIES = {
    "qwen3-0.6b": (
        "Qwen3",
        dict(
            hidden_size=1024,
            intermediate_size=3072,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=40960,
        ),
    ),
    "qwen3-4b": (
        "Qwen3",
        dict(
            hidden_size=2560,
            intermediate_size=1024,  # 9728 in the real model: the MLP's width is not what is tested here
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=40960,
        ),
    ),
    "llama-3.2-1b": (
        "Llama",
        dict(
            hidden_size=2048,
            intermediate_size=1024,  # 8192 in the real model
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            max_position_embeddings=131072,
            rope_scaling=dict(
                rope_type="llama3",
                factor=32.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8192,
                rope_theta=500000.0,
            ),
        ),
    ),
    "qwen2.5-0.5b": (
        "Qwen2",
        dict(
            hidden_size=896,
            intermediate_size=4864,
            num_attention_heads=14,
            num_key_value_heads=2,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=32768,
            use_sliding_window=False,
            sliding_window=32768,
        ),
    ),
    "mistral-7b-v0.1": (
        "Mistral",
        dict(
            hidden_size=4096,
            intermediate_size=512,  # 14336 in the real model
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            max_position_embeddings=32768,
            sliding_window=4096,
        ),
    ),
    "phi-3-mini-4k": (
        "Phi3",
        dict(
            hidden_size=3072,
            intermediate_size=1024,  # 8192 in the real model
            num_attention_heads=32,
            num_key_value_heads=32,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            max_position_embeddings=4096,
            sliding_window=2047,
            pad_token_id=0,  # 32000 in the real one, a token of its 32064
        ),
    ),
    "gemma-3-1b": (
        "Gemma3",
        dict(
            hidden_size=1152,
            intermediate_size=1024,  # 6912 in the real model
            num_hidden_layers=6,  # five sliding layers, then a global one, as its 26 go
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=16,  # 512 in the real model: shorter, so the test's 20 tokens reach past it
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=32768,
            pad_token_id=0,
        ),
    ),
    "gemma-3-270m": (
        "Gemma3",
        dict(
            hidden_size=640,
            intermediate_size=2048,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=512,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=32768,
            pad_token_id=0,
        ),
    ),
}

# the transformers classes of an arch, where they are not {arch}Config and {arch}ForCausalLM
CLASSES = {"Gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")


@pytest.fixture(scope="module")
def tok():
    text = "the quick brown fox jumps over the lazy dog; ROMEO: O love, sweet night! 12345 " * 40
    return minitf.Tokenizer.train([text], vocab_size=V)


def trained_like(hf, seed: int = 0):
    """hf with every parameter moved off its init (norm gains off one, biases off zero), eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 1 else 0.02))
    return hf.eval()


def build(tf, arch: str, tok, **config):
    """A trained-like transformers model of `arch` (Llama, Qwen3, ...) of one layer."""
    torch.manual_seed(0)
    base = dict(vocab_size=V, num_hidden_layers=1, bos_token_id=tok.eot_id, eos_token_id=tok.eot_id)
    config_class, model_class = CLASSES.get(arch, (f"{arch}Config", f"{arch}ForCausalLM"))
    cfg = getattr(tf, config_class)(**{**base, **config})
    return trained_like(getattr(tf, model_class)(cfg))


def logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return (out.logits if hasattr(out, "logits") else out[0])[0]  # (T, V)


def greedy(model, ids, n: int = 12) -> list[int]:
    ids = list(ids)
    for _ in range(n):
        ids.append(int(logits(model, ids)[-1].argmax()))
    return ids[-n:]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_downloaded_family_imports_with_transformers_logits_and_exports_as_itself(tf, tok, tmp_path, family):
    arch, config = FAMILIES[family]
    hf = build(tf, arch, tok, **config)
    hf.save_pretrained(tmp_path / "hf")
    tok.save(tmp_path / "hf" / "tokenizer.json")
    model, _ = load_pretrained(tmp_path / "hf")
    model.eval()
    assert model.config.family == arch.lower()
    ids = tok.encode("ROMEO: O love, sweet night! the quick brown fox")
    a, b = logits(model, ids), logits(hf, ids)
    assert a.std() > 0.1 and (a - b).abs().max() < 1e-4, (a - b).abs().max()
    assert greedy(model, ids) == greedy(hf, ids)

    out, fmt = to_hf(model, tok, tmp_path / "back")
    assert fmt == arch.lower()  # written back as itself, not as the Llama that computes it too
    written = json.loads((out / "config.json").read_text())
    for key in ("head_dim", "num_key_value_heads") + (("sliding_window",) if arch in ("Mistral", "Phi3") else ()):
        assert written.get(key) == config.get(key, written.get(key)), key
    if "rope_scaling" in config:
        assert written["rope_parameters"] == config["rope_scaling"]
    again = tf.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(again).__name__ == type(hf).__name__
    assert (logits(again, ids) - a).abs().max() < 1e-4


SMALL = dict(
    hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64
)


@pytest.mark.parametrize(
    "arch, config, without",
    [
        ("Qwen3", dict(head_dim=32), "q/k gains"),
        (
            "Llama",
            dict(
                rope_scaling=dict(
                    rope_type="llama3",
                    factor=8.0,
                    low_freq_factor=1.0,
                    high_freq_factor=4.0,
                    original_max_position_embeddings=16,
                    rope_theta=10000.0,
                )
            ),
            "rope_scaling",
        ),
        ("Llama", dict(rope_scaling=dict(rope_type="linear", factor=4.0, rope_theta=10000.0)), "rope_scaling"),
        ("Mistral", dict(sliding_window=8, head_dim=16), "sliding_window"),
        ("Phi3", dict(sliding_window=8, pad_token_id=0), "sliding_window"),
        ("Gemma3", dict(sliding_window=8, num_hidden_layers=3, head_dim=32, pad_token_id=0), "sliding_window"),
        ("Gemma3", dict(sliding_window=8, num_hidden_layers=3, pad_token_id=0), "rope_local_base"),
        ("Gemma3", dict(sliding_window=64, num_hidden_layers=1, pad_token_id=0), "embed_scale"),
        ("Gemma3", dict(sliding_window=64, num_hidden_layers=1, query_pre_attn_scalar=8, pad_token_id=0), "attn_scale"),
    ],
)
def test_each_option_is_computed_where_it_changes_the_logits(tf, tok, arch, config, without):
    """At a small size where each option matters within 40 tokens (a context of 16 stretched 8
    times, a window of 8): minitf's logits are transformers', and dropping the option changes them."""
    hf = build(tf, arch, tok, **SMALL, **config)
    model = from_hf(hf)
    ids = tok.encode("the quick brown fox jumps over the lazy dog; ROMEO: O love, sweet night! 12345 " * 2)[:40]
    assert len(ids) == 40
    a = logits(model, ids)
    assert (a - logits(hf, ids)).abs().max() < 1e-4
    if without == "q/k gains":  # trained gains, not the ones a fresh model starts from
        other = from_hf(hf)
        with torch.no_grad():
            for block in other.blocks:
                block.attn.q_norm.weight.fill_(1.0)
                block.attn.k_norm.weight.fill_(1.0)
    else:
        plain = {
            "rope_scaling": dict(rope_scaling="none", **ROPE_SCALING_DEFAULTS),
            "sliding_window": dict(sliding_window=None, global_every=None, rope_local_base=None),
            "embed_scale": dict(embed_scale=False),
        }.get(without, {without: None})
        other = minitf.Transformer(minitf.ModelConfig(**{**vars(model.config), **plain}))
        other.load_state_dict(model.state_dict())
    assert (logits(other.eval(), ids) - a).abs().max() > 1e-2


def test_decoding_with_the_cache_matches_the_whole_sequence_under_a_window(tok):
    """The KV cache hides the keys a sliding window hides, token by token and with a static cache."""
    from minitf.kv_cache import KVCache

    torch.manual_seed(0)
    cfg = minitf.ModelConfig(vocab_size=V, block_size=32, n_layer=2, n_embd=32, n_head=4, sliding_window=5, **LLAMA)
    model = minitf.Transformer(cfg).eval()
    ids = torch.randint(0, V, (1, 20))
    whole = logits(model, ids[0].tolist())
    for static in (False, True):
        cache = KVCache(model, static=static)
        with torch.no_grad():
            first = model(ids[:, :7], cache=cache)[0][0]  # a prompt longer than the window
            steps = [model(ids[:, t : t + 1], cache=cache)[0][0, -1] for t in range(7, 20)]
        torch.testing.assert_close(torch.cat([first, torch.stack(steps)]), whole, atol=1e-5, rtol=0)


def test_refused_families_and_settings_name_the_key_and_the_nearest_family(tf, tok):
    hf = build(tf, "Llama", tok, **SMALL, rope_scaling=dict(rope_type="yarn", factor=4.0, rope_theta=10000.0))
    with pytest.raises(minitf.MinitfError) as e:
        from_hf(hf)
    assert "rope_type='yarn'" in str(e.value) and "minitf computes default, linear, llama3" in str(e.value)
    phi4 = build(tf, "Phi3", tok, **SMALL, pad_token_id=0, partial_rotary_factor=0.75)
    with pytest.raises(minitf.MinitfError, match=r"partial_rotary_factor=0.75 \(minitf rotates every dimension\)"):
        from_hf(phi4)


def test_gemma3_as_the_hub_holds_it(tf, tok, tmp_path):
    """Gemma 3's config.json as its downloads have it (written by transformers 4.50: rope_theta and
    rope_local_base_freq, sliding_window_pattern, no layer_types) is read as transformers 5 reads it."""
    hf = build(tf, "Gemma3", tok, **SMALL, num_hidden_layers=4, sliding_window=8, pad_token_id=0)
    hf.save_pretrained(tmp_path / "g")
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    del config["layer_types"], config["rope_parameters"]
    config.update(rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None, sliding_window_pattern=2)
    (tmp_path / "g" / "config.json").write_text(json.dumps(config))
    again = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "g").eval()  # transformers' own reading of it
    assert again.config.layer_types == ["sliding_attention", "full_attention"] * 2
    model = from_hf(tmp_path / "g")
    assert (model.config.global_every, model.config.rope_local_base) == (2, 10000.0)
    ids = tok.encode("the quick brown fox jumps over the lazy dog; ROMEO: O love, sweet night! 12345 " * 2)[:40]
    assert (logits(model, ids) - logits(again, ids)).abs().max() < 1e-4
    with pytest.raises(minitf.MinitfError, match=r"llama.cpp's gemma3 graph fixes model.global_every"):
        from minitf.export.gguf import write_gguf

        write_gguf(model, tok, tmp_path / "g.gguf")


def test_a_sentencepiece_model_without_endoftext_chats_as_transformers_does(tf, tmp_path):
    """Mistral's, Llama 2's and Gemma's tokenizers are SentencePiece-style (▁ for spaces, no
    <|endoftext|>): the model's own end of text separates documents, and minitf.chat's greedy answer
    from Mistral v0.3's template is transformers' generate() from apply_chat_template."""
    from tokenizers import SentencePieceBPETokenizer

    from minitf.conversations.answer import chat as answer

    sp = SentencePieceBPETokenizer()
    text = "the quick brown fox jumps over the lazy dog. What is 17 plus 25? It is 42, of course. " * 40
    sp.train_from_iterator([text], vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", "[INST]", "[/INST]"])
    templates = json.loads((ROOT / "tests" / "data" / "chat_templates.json").read_text(encoding="utf-8"))
    path = tmp_path / "mistral"
    torch.manual_seed(0)
    config = tf.MistralConfig(**SMALL, vocab_size=sp.get_vocab_size(), num_hidden_layers=2, pad_token_id=0)
    trained_like(tf.MistralForCausalLM(config)).save_pretrained(path)
    (path / "tokenizer.json").write_text(sp._tokenizer.to_str())
    spec = templates["mistral-v0.3"]
    keys = {k: spec[k] for k in ("chat_template", "bos_token", "eos_token")}
    (path / "tokenizer_config.json").write_text(json.dumps({**keys, "tokenizer_class": "PreTrainedTokenizerFast"}))
    hf = tf.AutoModelForCausalLM.from_pretrained(path).eval()
    model, tok = load_pretrained(path)
    assert (tok.eot, tok.eot_id) == ("</s>", sp.token_to_id("</s>"))
    messages = [{"role": "user", "content": "What is 17 plus 25?"}]
    hf_tok = tf.AutoTokenizer.from_pretrained(str(path))
    prompt = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tok.chat_template.prompt_ids(tok, messages) == prompt
    out = hf.generate(
        torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=tok.eot_id, pad_token_id=0
    )
    new = out[0, len(prompt) :].tolist()
    theirs = hf_tok.decode(new[: new.index(tok.eot_id)] if tok.eot_id in new else new)
    assert len(set(new)) > 2  # an answer of several tokens, not one repeated
    assert answer(model.eval(), tok, messages, temperature=0, max_new_tokens=12) == theirs


@pytest.mark.parametrize(
    "arch, config",
    [("Qwen3", dict(head_dim=32)), ("Gemma3", dict(sliding_window=8, num_hidden_layers=3, pad_token_id=0))],
)
def test_inspect_and_interpret_a_downloaded_family(tf, tok, arch, config):
    """minitf.inspect and minitf.interpret run the model's own modules on an imported model: the
    inspected logits are the forward pass's (Gemma's norms after each sub-layer included), heads are
    scored and ablated; attribution, whose shares must sum to the logit, refuses Gemma's sandwich norms."""
    from minitf import interpret

    model = from_hf(build(tf, arch, tok, **SMALL, **config)).eval()
    ids = tok.encode("the quick brown fox jumps over the lazy dog; ROMEO: O love, sweet night! 12345 " * 2)[:40]
    ins = minitf.inspect(model, tok, ids)
    torch.testing.assert_close(ins.logits, logits(model, ids), atol=1e-4, rtol=0)
    assert ins.layers[0].q.shape == (4, 40, model.config.head_size)
    scores = interpret.head_scores(model, interpret.repeated_tokens(model.config.vocab_size, 8, 2, seed=0))
    assert set(scores) >= {"previous_token", "induction"}
    ablated = interpret.ablate(model, torch.tensor(ids), heads=[(0, 1)])
    torch.testing.assert_close(ablated.logits_before[0], logits(model, ids), atol=1e-4, rtol=0)
    assert (ablated.logits_after - ablated.logits_before).abs().max() > 1e-3  # the head did something
    if model.config.sandwich_norm:
        with pytest.raises(minitf.MinitfError, match="sandwich_norm"):
            interpret.attribute(model, ids, token=ids[-1])
    else:
        parts = interpret.attribute(model, ids, token=ids[-1])
        assert (
            abs(parts.total() - parts.logit) < 1e-3 and abs(parts.logit - float(logits(model, ids)[-1, ids[-1]])) < 1e-3
        )


def test_a_bfloat16_download_samples_in_bfloat16_as_transformers_computes_it(tf, tok, tmp_path):
    """`minitf generate --dtype bfloat16` on a downloaded bfloat16 model (as the hub holds Qwen3):
    every weight is read into bfloat16 as stored (no float32 copy), and the logits are those of
    transformers running the same model in bfloat16, up to the order of the roundings."""
    from minitf.export.hf import load_model

    hf = build(tf, "Qwen3", tok, **SMALL, head_dim=32).to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "hf")
    tok.save(tmp_path / "hf" / "tokenizer.json")
    model, _, _ = load_model(tmp_path / "hf", dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ids = tok.encode("ROMEO: O love, sweet night! the quick brown fox")
    a, b = logits(model, ids).float(), logits(hf, ids).float()
    float32 = logits(load_model(tmp_path / "hf")[0], ids)
    assert a.std() > 0.1 and (a - b).abs().max() < 0.05 * b.abs().max()
    assert (a - b).abs().mean() < (float32 - b).abs().mean() * 2  # bfloat16's rounding, not another model
