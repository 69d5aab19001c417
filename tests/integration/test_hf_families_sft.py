"""Each downloaded family, fine-tuned on conversations in its own chat template and taken back out:
a trained-like transformers model of the family (every norm gain and bias off its init) with its
real template and special tokens is fine-tuned by configs/chat.yaml, fully and with LoRA, and
exported; transformers loads the export as the same family with minitf's logits, and its
apply_chat_template gives the token ids minitf trained on."""

import json

import pytest
import torch
from tokenizers import Regex, pre_tokenizers

import minitf
from minitf.config import load_run_config
from minitf.export.hf import to_hf
from tests.integration.test_hf_families import SMALL, greedy, logits, trained_like
from tests.support import ROOT
from tests.support.corpus import make_play
from tests.support.sentencepiece import ADDED, sentencepiece_style

TEMPLATES = json.loads((ROOT / "tests" / "data" / "chat_templates.json").read_text(encoding="utf-8"))
LLAMA3 = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,
    rope_theta=10000.0,
)
# (transformers architecture, what the family adds to SMALL, its template, the end of an answer)
FAMILIES = {
    "qwen3": ("Qwen3", dict(head_dim=32), "qwen3", "<|im_end|>"),
    "llama-3.2": ("Llama", dict(rope_scaling=LLAMA3), "llama3.2", "<|eot_id|>"),
    "qwen2.5": ("Qwen2", {}, "qwen2.5", "<|im_end|>"),
    "mistral": ("Mistral", dict(sliding_window=64, tie_word_embeddings=False), "mistral-v0.3", "</s>"),
    "phi-3.5": ("Phi3", dict(sliding_window=63, pad_token_id=0, tie_word_embeddings=False), "phi3.5", "<|end|>"),
    "gemma-3": ("Gemma3", dict(sliding_window=8, num_hidden_layers=2, pad_token_id=0), "gemma3", "<end_of_turn>"),
}
QWEN2_SPLIT = pre_tokenizers.Sequence(
    [
        pre_tokenizers.Split(
            Regex(
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                r"\s+(?!\S)|\s+"
            ),
            behavior="isolated",
        ),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
)
CLASSES = {"Gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}
ASK = [{"role": "user", "content": "What is 4 plus 3?"}]


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    path = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"What is {a} plus {b}?"},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        for a in range(8)
        for b in range(4)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def downloaded(tf, family: str, where, sentencepiece: str | None = None, **config):
    """A directory as the hub holds the family: config.json and safetensors of a trained-like model
    of two layers (or as `config` says), tokenizer.json with the template's special tokens (byte-level,
    or SentencePiece-style as Gemma's and Mistral's are: tests/support/sentencepiece.py's style),
    tokenizer_config.json with the template."""
    from tokenizers import AddedToken

    arch, extra, template, _ = FAMILIES[family]
    extra = {**extra, **config}
    spec = TEMPLATES[template]
    texts = [make_play(i) for i in range(2)] + ["What is 4 plus 3? It is 7. " * 20]
    if sentencepiece:
        # the style's own first tokens (Phi-3's <unk> <s> </s> are Llama 2's), then the template's
        tok = sentencepiece_style(texts, 300, sentencepiece, {**ADDED[sentencepiece], **spec["added_tokens"]})
    else:
        tok = minitf.Tokenizer.train(texts, 400)
        tok.backend.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in spec["added_tokens"].items()])
    if arch == "Qwen2":  # transformers reads a qwen2 tokenizer with Qwen's own split (digits one by one),
        tok.backend.pre_tokenizer = QWEN2_SPLIT  # whatever tokenizer.json says: a real one says the same
    torch.manual_seed(0)
    base = dict(SMALL, vocab_size=tok.vocab_size, num_hidden_layers=2, max_position_embeddings=160)
    base.update(bos_token_id=tok.eot_id, eos_token_id=tok.eot_id)  # Llama 3.2 says the date: 97 tokens a prompt
    config_class, model_class = CLASSES.get(arch, (f"{arch}Config", f"{arch}ForCausalLM"))
    hf = trained_like(getattr(tf, model_class)(getattr(tf, config_class)(**{**base, **extra})))
    hf.save_pretrained(where)
    tok.save(where / "tokenizer.json")
    keys = {k: spec[k] for k in ("chat_template", "bos_token", "eos_token")}
    (where / "tokenizer_config.json").write_text(json.dumps({**keys, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return hf


def sft_config(tmp_path, chats, method: str, *overrides) -> minitf.Config:
    """configs/chat.yaml from tmp_path/downloaded into tmp_path/run on the chats file, 2 steps,
    in full or with LoRA (method)."""
    return minitf.load_config(
        ROOT / "configs" / "chat.yaml",
        [
            f"run.out_dir={tmp_path / 'run'}",
            f"run.init_from={tmp_path / 'downloaded'}",
            f"data.source=file:{chats}",
            "data.val_fraction=0",
            "train.max_steps=2",
            "train.max_seconds=null",
            "train.eval_every=100",
            "train.eval_metric=null",
            "train.batch_size=4",
            *(["train.lora_rank=4"] if method == "lora" else []),
            *overrides,
        ],
    )


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_fine_tunes_on_its_own_template_and_exports_as_itself(tf, chats, tmp_path, family, method):
    arch, _, _, end = FAMILIES[family]
    hf = downloaded(tf, family, tmp_path / "downloaded")
    lines = []
    overrides = ["train.warmup_steps=1", "train.dtype=float32"]
    run = minitf.train(sft_config(tmp_path, chats, method, *overrides), log=lines.append)
    said = next(line for line in lines if line.startswith("chat: the template of"))
    assert f"ending each answer with {end!r}" in said, said
    tuned, tok, tuned_cfg = minitf.load_run(run)
    # configs/chat.yaml names no optimizer: a download's fine-tune is AdamW's, said once, kept for a resume
    assert tuned_cfg.train.optimizer == "adamw"
    assert sum(line.startswith("optimizer: AdamW, as a downloaded") for line in lines) == (method == "full")
    tuned.eval()
    ids = tok.chat_template.prompt_ids(tok, ASK)
    assert (logits(tuned, ids) - logits(hf, ids)).abs().max() > 1e-4  # it trained

    out, fmt = to_hf(tuned, tok, tmp_path / "back")
    assert fmt == arch.lower()
    again = tf.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(again).__name__ == type(hf).__name__
    assert (logits(again, ids) - logits(tuned, ids)).abs().max() < 1e-4
    theirs = tf.AutoTokenizer.from_pretrained(str(out))
    assert theirs.apply_chat_template(ASK, add_generation_prompt=True, tokenize=True, return_dict=False) == ids
    assert theirs.convert_ids_to_tokens(again.generation_config.eos_token_id)[0] == end


@pytest.mark.parametrize("method", ["full", "lora", "bfloat16-weights"])
def test_a_bfloat16_download_is_fine_tuned_and_written_back_in_bfloat16(tf, chats, tmp_path, method):
    """run.weights_dtype=auto takes the download's dtype: the run's weights file and its export are
    bfloat16, as the hub holds the model, not a float32 file twice the size; transformers reads the
    export with the logits minitf computes from that file. train.param_dtype=bfloat16 trains the
    download in bfloat16 itself (its matrices; the norms' gains stay float32) and moves it."""
    from safetensors import safe_open

    from minitf.cli import export

    downloaded(tf, "qwen3", tmp_path / "downloaded")
    tf.AutoModelForCausalLM.from_pretrained(tmp_path / "downloaded").to(torch.bfloat16).save_pretrained(
        tmp_path / "downloaded"
    )
    held = ["train.dtype=bfloat16", "train.param_dtype=bfloat16"] if method == "bfloat16-weights" else []
    lines = []
    run = minitf.train(sft_config(tmp_path, chats, method, *held), log=lines.append)
    assert load_run_config(run / "config.yaml").run.weights_dtype == "bfloat16"
    assert any("weights in bfloat16, updates stochastically rounded" in line for line in lines) == bool(held)
    with safe_open(run / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    tuned, tok, _ = minitf.load_run(run)

    export.main(["--run", str(run), "--out", str(tmp_path / "back")])
    assert json.loads((tmp_path / "back" / "config.json").read_text())["dtype"] == "bfloat16"
    again = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "back", dtype=torch.float32).eval()
    ids = tok.chat_template.prompt_ids(tok, ASK)
    assert (logits(again, ids) - logits(tuned, ids)).abs().max() < 1e-4
    before = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "downloaded", dtype=torch.float32).eval()
    assert (logits(before, ids) - logits(tuned, ids)).abs().max() > 1e-3  # it trained


def test_a_lora_fine_tune_of_a_download_is_the_same_run_after_run(tf, chats, tmp_path):
    """Two LoRA runs of one config make the same weights whatever the process drew before each:
    the adapters' initial values come from run.seed (they came from the process's generator)."""
    downloaded(tf, "qwen3", tmp_path / "downloaded")
    weights = []
    for i in range(2):
        torch.manual_seed(100 + i)  # a caller that drew something else before
        cfg = sft_config(tmp_path, chats, "lora", f"run.out_dir={tmp_path / f'run{i}'}", "train.lora_dropout=0.1")
        run = minitf.train(cfg, log=lambda *a: None)
        weights.append(minitf.load_run(run)[0].state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_lora_run_holds_a_bfloat16_downloads_frozen_matrices_as_they_came(tf, tmp_path):
    """Under a bfloat16 autocast a LoRA run loads the blocks' matrices and the embedding in bfloat16
    (no float32 copy is ever made), the norms in float32, and computes the same loss and gradients
    as from the float32 load that adapt() casts."""
    from minitf.config import TrainConfig
    from minitf.export.hf import load_pretrained
    from minitf.training import lora

    pytest.importorskip("peft", reason="LoRA needs the lora extra: pip install -e '.[lora]'")
    downloaded(tf, "qwen3", tmp_path / "d")
    tf.AutoModelForCausalLM.from_pretrained(tmp_path / "d").to(torch.bfloat16).save_pretrained(tmp_path / "d")
    plain, tok = load_pretrained(tmp_path / "d")
    held, _ = load_pretrained(tmp_path / "d", frozen=torch.bfloat16)
    assert plain.wte.weight.dtype == plain.blocks[0].mlp.c_fc.weight.dtype == torch.float32
    assert held.wte.weight.dtype == held.blocks[0].mlp.c_fc.weight.dtype == torch.bfloat16
    assert held.ln_f.weight.dtype == held.blocks[0].attn.q_norm.weight.dtype == torch.float32
    tc = TrainConfig(optimizer="adamw", lora_rank=4)
    steps = []
    for model in (plain, held):
        torch.manual_seed(0)  # the same adapters' initial values
        model = lora.adapt(model, tc, log=str, dtype=torch.bfloat16)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)  # B starts at zero: adapters that do something
        ids = torch.tensor([tok.chat_template.prompt_ids(tok, ASK)])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(ids[:, :-1], ids[:, 1:])
        loss.backward()
        steps.append((loss, [p.grad for p in model.parameters() if p.requires_grad]))
    (a, ga), (b, gb) = steps
    assert torch.equal(a, b) and len(ga) == len(gb) > 0
    assert all(torch.equal(x, y) for x, y in zip(ga, gb))


def test_a_llama_3_gguf_begins_its_prompts_with_its_own_bos(tf, tmp_path):
    """llama.cpp renders the template's {{ bos_token }} from the file's bos id: a Llama 3.2's is
    <|begin_of_text|>, not <|endoftext|>."""
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[gguf]')")
    from gguf import GGUFReader

    from minitf.export.gguf import write_gguf
    from minitf.export.hf import load_pretrained

    downloaded(tf, "llama-3.2", tmp_path / "d")
    model, tok = load_pretrained(tmp_path / "d")
    write_gguf(model, tok, tmp_path / "m.gguf")
    fields = GGUFReader(tmp_path / "m.gguf").fields
    bos = int(fields["tokenizer.ggml.bos_token_id"].parts[-1][0])
    eos = int(fields["tokenizer.ggml.eos_token_id"].parts[-1][0])
    assert tok.backend.id_to_token(bos) == "<|begin_of_text|>" and tok.backend.id_to_token(eos) == "<|eot_id|>"


def test_a_fine_tuned_qwen_goes_to_llama_cpp_with_its_own_tokenizer(tf, chats, tmp_path):
    """import -> LoRA fine-tune -> export-gguf -> llama.cpp, for a Qwen2.5 whose tokenizer splits as
    Qwen's does (digits one by one: llama.cpp's 'qwen2'): llama.cpp tokenizes the chat prompt as
    minitf does, its f32 logits equal minitf's at every position and its greedy answer is the same."""
    llama_cpp = pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed (pip install -e '.[llamacpp]')"
    )
    from minitf.cli.export_gguf import main as export_gguf
    from tests.integration.test_gguf_llamacpp import llama_logits, load_llama

    downloaded(tf, "qwen2.5", tmp_path / "downloaded")
    run = minitf.train(sft_config(tmp_path, chats, "lora", "train.dtype=float32"), log=lambda *a: None)
    tuned, tok, _ = minitf.load_run(run)
    export_gguf(["--run", str(run), "--out", str(tmp_path / "m.gguf")])
    llm = load_llama(llama_cpp, tmp_path / "m.gguf", 160)
    assert llm.metadata["tokenizer.ggml.pre"] == "qwen2"
    ids = tok.chat_template.prompt_ids(tok, [{"role": "user", "content": "What is 1234 plus 56?"}])
    text = tok.decode(ids)
    assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids
    ours = logits(tuned.eval(), ids).numpy()  # (T, V)
    assert abs(llama_logits(llm, ids) - ours).max() < 1e-4
    answer = greedy(tuned, ids)  # 12 new tokens
    llm.reset()
    theirs = [t for _, t in zip(range(len(answer)), llm.generate(ids, temp=0.0))]
    assert theirs == answer


# Gemma 3 as llama.cpp's gemma3 graph computes it (five sliding layers in six), Mistral and Phi-3.5
# without a window (llama.cpp's llama and phi3 graphs have none), each with its SentencePiece-style
# tokenizer (Phi-3's is Llama 2's, written as Mistral's is): (tokenizer style, config)
SENTENCEPIECE_FAMILIES = {
    "gemma-3": ("gemma", dict(num_hidden_layers=6)),
    "mistral": ("mistral", dict(sliding_window=None)),
    "phi-3.5": ("mistral", dict(sliding_window=None)),
}


@pytest.mark.parametrize("family", SENTENCEPIECE_FAMILIES)
def test_a_fine_tuned_gemma_mistral_or_phi_goes_to_llama_cpp_with_its_own_tokenizer(tf, chats, tmp_path, family):
    """import -> LoRA fine-tune -> export-gguf -> llama.cpp for the families whose tokenizer is
    SentencePiece's (llama.cpp's "llama" vocabulary: Gemma 3, Mistral, Phi-3.5): llama.cpp tokenizes
    the chat prompt as minitf does, its f32 logits equal minitf's at every position (Gemma's with
    llama.cpp's float16 GELU table in minitf's gate) and its greedy answer is the same."""
    llama_cpp = pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed (pip install -e '.[llamacpp]')"
    )
    from minitf.cli.export_gguf import main as export_gguf
    from tests.integration.test_gguf_llamacpp import Fp16TableGeGLU, llama_logits, load_llama

    style, config = SENTENCEPIECE_FAMILIES[family]
    downloaded(tf, family, tmp_path / "downloaded", sentencepiece=style, **config)
    run = minitf.train(sft_config(tmp_path, chats, "lora", "train.dtype=float32"), log=lambda *a: None)
    tuned, tok, _ = minitf.load_run(run)
    export_gguf(["--run", str(run), "--out", str(tmp_path / "m.gguf")])
    llm = load_llama(llama_cpp, tmp_path / "m.gguf", 160)
    assert llm.metadata["tokenizer.ggml.model"] == "llama"
    ask = [{"role": "user", "content": "What is 1234 plus 56?"}]
    ids = tok.chat_template.prompt_ids(tok, ask)
    prompt = tok.chat_template.render(ask, add_generation_prompt=True)
    assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == ids
    if family == "gemma-3":
        for b in tuned.blocks:
            b.mlp.act = Fp16TableGeGLU()
    ours = logits(tuned.eval(), ids).numpy()  # (T, V)
    # Gemma's bound is test_gguf_llamacpp's for its gate: llama.cpp's table also rounds the GELU's input
    assert abs(llama_logits(llm, ids) - ours).max() < (1e-3 if family == "gemma-3" else 1e-4)
    answer = greedy(tuned, ids)  # 12 new tokens
    llm.reset()
    theirs = [t for _, t in zip(range(len(answer)), llm.generate(ids, temp=0.0))]
    assert theirs == answer and len(set(answer)) > 2
