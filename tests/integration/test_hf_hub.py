"""A hub id (`owner/name`) wherever a Hugging Face directory is taken: run.init_from, minitf chat,
generate and serve, resolved through huggingface_hub's own cache. The tests build that cache here
(refs/main, snapshots/<commit>/ whose files are links into blobs/, as huggingface_hub lays it out)
and never touch the network: the hub is offline (HF_HUB_OFFLINE) throughout.
"""

import hashlib
import io
import json
import os

import pytest
import torch

import minitf
from minitf.chat_template import add_chat_tokens, chatml

# the module itself: a plain `import huggingface_hub` does not load its constants in every version
constants = pytest.importorskip(
    "huggingface_hub.constants", reason="huggingface_hub is not installed (pip install -e '.[hf]')"
)

REPO = "local-org/tiny-qwen3"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty hub cache, offline, in this process (huggingface_hub read its settings at import)."""
    path = tmp_path / "hub"
    path.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(path))  # and in the processes the tests start
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return path


def put_in_cache(cache, repo: str, files: dict[str, bytes]):
    """files as huggingface_hub's cache holds a download of repo: each in blobs/ under its hash, linked
    from snapshots/<commit>/, with refs/main naming the commit. Returns the snapshot's directory."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / COMMIT
    (folder / "blobs").mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, (snapshot / name).parent), snapshot / name)
    return snapshot


@pytest.fixture(scope="module")
def downloaded(tmp_path_factory):
    """A Qwen3-shaped chat model's files as the hub serves them (config.json, sharded safetensors with
    their index, tokenizer.json, tokenizer_config.json with a ChatML template), trained-like weights."""
    tf = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    tok = add_chat_tokens(minitf.Tokenizer.train(["What is 17 plus 25? It is 42. " * 50], vocab_size=300))
    torch.manual_seed(0)
    cfg = tf.Qwen3Config(
        vocab_size=tok.vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    model = tf.Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.05))
    out = tmp_path_factory.mktemp("downloaded")
    model.save_pretrained(out, max_shard_size="40KB")  # several shards and an index, as larger models have
    tok.save(out / "tokenizer.json")
    template = chatml()
    (out / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template.source, "eos_token": "<|im_end|>"})
    )
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert sum(n.endswith(".safetensors") for n in files) > 1
    return files, model.eval(), tok


def test_a_hub_id_loads_from_the_cache_as_the_directory_does(cache, downloaded):
    files, hf, tok = downloaded
    snapshot = put_in_cache(cache, REPO, files)
    model, loaded = minitf.export.hf.load_pretrained(REPO)
    assert loaded.hash == tok.hash and loaded.chat_template is not None
    ids = torch.tensor([tok.encode("What is 17 plus 25?")])
    with torch.no_grad():
        assert (model.eval()(ids)[0] - hf(ids).logits).abs().max() < 1e-4
    assert all((snapshot / n).is_symlink() for n in files)  # what was read: the links into blobs/


def test_an_id_not_in_the_cache_while_offline_is_one_line(cache):
    with pytest.raises(minitf.MinitfError) as e:
        minitf.export.hf.load_pretrained("someone/not-downloaded")
    assert str(e.value) == (
        "run.init_from=someone/not-downloaded: the Hugging Face hub cannot be reached and someone/not-downloaded "
        "is not in its cache; fetch it where there is a network (hf download someone/not-downloaded) or pass a "
        "local directory"
    )


def test_a_shard_linked_outside_the_repository_folder_is_refused(cache, downloaded, tmp_path):
    files, _, _ = downloaded
    snapshot = put_in_cache(cache, REPO, files)
    shard = sorted(n for n in files if n.startswith("model-"))[0]
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(files[shard])
    (snapshot / shard).unlink()
    os.symlink(outside, snapshot / shard)  # a link out of models--local-org--tiny-qwen3/
    with pytest.raises(minitf.MinitfError, match=f"weight_map entry '{shard}' is a link leading out of the directory"):
        minitf.export.hf.load_pretrained(REPO)


def test_fine_tune_and_chat_from_a_hub_id(cache, downloaded, tmp_path, corpus, monkeypatch, capsys):
    from minitf.cli import chat, generate
    from tests.support.runs import tiny_config

    files, _, _ = downloaded
    put_in_cache(cache, REPO, files)
    lines = []
    cfg = tiny_config(tmp_path / "ft", corpus, f"run.init_from={REPO}", "train.max_steps=2")
    run = minitf.train(cfg, log=lines.append)
    assert any(f"init_from {REPO}: 2 layers x 64 wide" in line for line in lines)
    assert minitf.load_run(run)[2].model.head_dim == 32  # Qwen3's wider heads, kept

    # the downloaded model itself, talked to and sampled from by its id
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"What is 17 plus 25?\n")))
    chat.main(["--run", REPO, "--temperature", "0", "--max-new-tokens", "4"])
    said = capsys.readouterr()
    assert f"[chatting with {REPO}: a downloaded Hugging Face model, as it is" in said.err and said.out.strip()
    generate.main(["--run", REPO, "--prompt", "What is", "--max-new-tokens", "3", "--temperature", "0"])
    assert capsys.readouterr().out.startswith("What is")
    with pytest.raises(minitf.MinitfError, match="is a Hugging Face model: leave --best out"):
        chat.main(["--run", REPO, "--best"])


def test_serve_names_the_model_by_its_id(cache, downloaded):
    from minitf.web.serve.completions import Completions

    files, _, _ = downloaded
    put_in_cache(cache, REPO, files)
    api = Completions(REPO)
    assert api.models()["data"][0]["id"] == REPO and api.block == 64
    body = {"model": REPO, "prompt": "What is", "max_tokens": 3, "temperature": 0}
    assert api.complete(api.parse(body))["choices"][0]["finish_reason"] in ("length", "stop")


def test_explore_shows_a_downloaded_model_by_its_id(cache, downloaded):
    from minitf.conversations.answer import chat
    from minitf.web.explore import Explorer

    files, _, tok = downloaded
    put_in_cache(cache, REPO, files)
    ex = Explorer(REPO)
    info = ex.run_info()
    assert info["run"] == REPO and info["downloaded"] is True and info["chat"] is True and info["step"] is None
    assert ex.loss_curve() == {"points": [], "watched": []}  # no training of its own
    question = [{"role": "user", "content": "What is 17 plus 25?"}]
    with ex.generation({"messages": question, "temperature": 0, "max_new_tokens": 4}) as events:
        tokens = [e["token"]["id"] for e in events if "token" in e]
    end = ex.tok.chat_template.end_of_turn(ex.tok)
    answer = chat(ex.model, ex.tok, question, temperature=0, max_new_tokens=4)
    assert tokens and ex.tok.decode([t for t in tokens if t != end]) == answer  # the page's answer is minitf.chat's
