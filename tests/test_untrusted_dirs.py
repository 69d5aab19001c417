"""A downloaded Hugging Face directory is untrusted input (issue 38 §1): its index never leads a
read outside it, its config.json is read as transformers reads it (rope scaling in any of its
forms refused), a wrong value is named by its Hugging Face key and file in one line, a broken
tokenizer is called the download's, and what its config asks for is bounded before allocating."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import minitf
from minitf.errors import MinitfError
from minitf.export.hf import from_hf, load_pretrained


@pytest.fixture(scope="module")
def tok():
    return minitf.Tokenizer.train(["the quick brown fox jumps over the lazy dog " * 40], vocab_size=300)


@pytest.fixture(scope="module")
def llama_dir(tok, tmp_path_factory):
    """A small Llama directory as save_pretrained writes it (config.json, model.safetensors, tokenizer.json)."""
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    from minitf.export.hf import to_hf

    torch.manual_seed(0)
    cfg = minitf.ModelConfig(
        vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=2,
        positions="rope", norm="rmsnorm", ffn="swiglu", bias=False,
    )  # fmt: skip
    out, fmt = to_hf(minitf.Transformer(cfg).eval(), tok, tmp_path_factory.mktemp("hf") / "llama")
    assert fmt == "llama"
    return out


@pytest.fixture
def model_dir(llama_dir, tmp_path):
    """A private copy of llama_dir, to break."""
    return shutil.copytree(llama_dir, tmp_path / "model")


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def refusal(path, call=from_hf) -> str:
    with pytest.raises(MinitfError) as e:
        call(path)
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


# ---------------------------------------------------------------------------------------------
# a sharded index never leads outside the directory


def shard(path, entry: str) -> None:
    """Split model.safetensors into two shards, the second named `entry` in the index."""
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    names = sorted(state)
    save_file({k: state[k] for k in names[:3]}, str(path / "model-1.safetensors"))
    index = {k: "model-1.safetensors" for k in names[:3]} | {k: entry for k in names[3:]}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))


@pytest.mark.parametrize("entry", ["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors"])
def test_an_index_naming_a_file_outside_is_refused(model_dir, tmp_path, entry):
    (tmp_path / "outside.safetensors").write_bytes(b"not for minitf")
    shard(model_dir, entry)
    words = "an absolute path" if entry.startswith("/") else "a path leading out of the directory"
    assert refusal(model_dir) == (
        f"{model_dir / 'model.safetensors.index.json'}: weight_map entry {entry!r} is {words}; shards must be "
        f"files inside {model_dir}: fetch the model again (a download's --local-dir holds real files)"
    )


def test_an_index_naming_a_link_out_is_refused_and_a_link_inside_read(model_dir, tmp_path):
    state = load_file(str(model_dir / "model.safetensors"))
    shard(model_dir, "model-2.safetensors")
    save_file({k: v for k, v in state.items() if k not in load_file(str(model_dir / "model-1.safetensors"))},
              str(tmp_path / "elsewhere.safetensors"))  # fmt: skip
    os.symlink(tmp_path / "elsewhere.safetensors", model_dir / "model-2.safetensors")
    msg = refusal(model_dir)
    assert "weight_map entry 'model-2.safetensors' is a link leading out of the directory;" in msg
    (tmp_path / "elsewhere.safetensors").rename(model_dir / "real.safetensors")
    (model_dir / "model-2.safetensors").unlink()
    os.symlink("real.safetensors", model_dir / "model-2.safetensors")  # inside: read as ever
    assert from_hf(model_dir).config.n_kv_head == 2


# ---------------------------------------------------------------------------------------------
# a broken tokenizer is the download's


def test_a_broken_tokenizer_is_called_the_downloads(model_dir):
    path = model_dir / "tokenizer.json"
    path.write_text(path.read_text()[:200])  # a download cut short
    msg = refusal(model_dir, load_pretrained)
    assert msg.startswith(f"{path} is broken (") and msg.endswith(
        "): the downloaded model's tokenizer cannot be read; fetch the model again"
    )
    assert "train" not in msg
