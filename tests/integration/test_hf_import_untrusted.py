"""A downloaded Hugging Face directory is untrusted input: its index never leads a
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


def test_a_broken_tokenizer_is_called_the_downloads(model_dir):
    path = model_dir / "tokenizer.json"
    path.write_text(path.read_text()[:200])  # a download cut short
    msg = refusal(model_dir, load_pretrained)
    assert msg.startswith(f"{path} is broken (") and msg.endswith(
        "): the downloaded model's tokenizer cannot be read; fetch the model again"
    )
    assert "train" not in msg


LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


@pytest.mark.parametrize(
    "changes, kind",
    [
        # transformers: a non-empty rope_scaling replaces rope_parameters whole, default or not
        (dict(rope_scaling={"rope_type": "llama3", **LLAMA3}, rope_parameters={"rope_type": "default"}), "llama3"),
        (dict(rope_scaling={"type": "linear", "factor": 2.0}), "linear"),  # the older key
    ],
)
def test_rope_scaling_is_read_where_transformers_reads_it(model_dir, tok, changes, kind):
    tf = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    edit_config(model_dir, **changes)
    model = from_hf(model_dir)
    assert model.config.rope_scaling == kind
    hf = tf.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([tok.encode("the quick brown fox jumps over the lazy dog " * 2)])
    with torch.no_grad():
        assert (model(ids)[0][0] - hf(ids).logits[0]).abs().max() < 1e-4


@pytest.mark.parametrize(
    "changes, kind",
    [
        (dict(rope_parameters={"type": "dynamic", "factor": 2.0, "rope_theta": 500.0}), "dynamic"),
        (dict(rope_parameters={"rope_type": "yarn", "factor": 2.0}, rope_scaling={}), "yarn"),
    ],
)
def test_other_rope_scaling_is_refused(model_dir, changes, kind):
    edit_config(model_dir, **changes)
    assert refusal(model_dir) == (
        f"{model_dir}: Llama config rope_scaling (rope_type={kind!r}; minitf computes default, linear, llama3) "
        f"has no minitf equivalent; minitf imports the plain architecture only"
    )


@pytest.mark.parametrize("factor", [None, "8", -1.0, True])
def test_a_llama3_scaling_without_a_number_is_named(model_dir, factor):
    edit_config(model_dir, rope_scaling={"rope_type": "llama3", **LLAMA3, "factor": factor})
    assert f"rope_parameters.factor={factor!r} (a positive number)" in refusal(model_dir)


def test_plain_rotary_takes_its_theta_where_transformers_does(model_dir, tok):
    tf = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    # rope_scaling, though plain, replaces rope_parameters: its 500 is not read, the top level's 700 is
    edit_config(
        model_dir, rope_scaling={"rope_type": "default"}, rope_parameters={"rope_theta": 500.0}, rope_theta=700.0
    )
    model = from_hf(model_dir)
    hf = tf.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([tok.encode("the quick brown fox jumps over the lazy dog")])
    with torch.no_grad():
        ours, theirs = model(ids)[0][0], hf(ids).logits[0]
    assert model.config.rope_base == 700.0 and (ours - theirs).abs().max() < 1e-4


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(num_key_value_heads="2"), "num_key_value_heads='2' (a positive integer or null)"),
        (dict(num_key_value_heads=-2), "num_key_value_heads=-2 (a positive integer or null)"),
        (dict(rope_theta="abc"), "rope_theta='abc' (a positive number)"),
        (dict(rope_parameters=5), "rope_parameters=5 (an object or null)"),
        (dict(rope_parameters={"rope_theta": -1.0}), "rope_parameters.rope_theta=-1.0 (a positive number)"),
        (dict(layer_types=5), "layer_types=5 (a list of strings or null)"),
        (dict(rms_norm_eps=-1e-6), "rms_norm_eps=-1e-06 (a positive number)"),
        (dict(max_position_embeddings=0), "max_position_embeddings=0 (a positive integer)"),
        (dict(tie_word_embeddings="no", head_dim=16.0), "head_dim=16.0 (a positive integer or null), "
         "tie_word_embeddings='no' (true or false)"),
    ],
)  # fmt: skip
def test_a_wrong_value_in_config_json_is_named_by_its_key(model_dir, changes, named):
    edit_config(model_dir, **changes)
    assert refusal(model_dir) == f"{model_dir}: config.json has {named}; correct config.json or fetch the model again"


def test_a_long_context_beyond_the_weights_is_refused_before_allocating(model_dir):
    edit_config(model_dir, max_position_embeddings=20_000_000)  # 2e7 rows of 16-wide rotary tables
    msg = refusal(model_dir)
    assert msg.startswith(
        f"{model_dir}: config.json has max_position_embeddings=20000000, for which minitf would build 3.8 GB of "
        f"rotary tables (one row per position) beside "
    ) and msg.endswith(" KB of weights; lower it to the context the model was trained with")


def test_a_model_larger_than_memory_is_refused_naming_config_json_keys(model_dir, tok):
    edit_config(model_dir, num_hidden_layers=10**7)  # the weights hold 2 layers: never built
    msg = refusal(model_dir)
    assert msg.startswith(
        f"{model_dir}: config.json (vocab_size={tok.vocab_size}, hidden_size=64, num_hidden_layers=10000000, "
        f"num_attention_heads=4, intermediate_size=192, max_position_embeddings=64) asks for 2.0 TB of memory, "
        f"more than this machine's "
    ) and msg.endswith("; fine-tune a smaller model")


def test_an_oversized_config_or_tokenizer_is_refused_unread(model_dir):
    from minitf.export.hf_files import MAX_JSON_BYTES, MAX_TOKENIZER_BYTES

    with open(model_dir / "config.json", "r+b") as f:
        f.truncate(MAX_JSON_BYTES + 1)  # sparse: the size is on disk, no bytes are written or read
    assert refusal(model_dir) == (
        f"{model_dir / 'config.json'} is 17 MB, more than a save_pretrained config.json holds "
        f"(at most 17 MB are read); fetch the model again"
    )
    with open(model_dir / "tokenizer.json", "r+b") as f:
        f.truncate(MAX_TOKENIZER_BYTES + 1)
    assert refusal(model_dir, load_pretrained).startswith(f"{model_dir / 'tokenizer.json'} is 268 MB, more than")


def test_a_config_or_index_that_is_a_fifo_is_refused_instead_of_waiting_forever(model_dir):
    (model_dir / "config.json").unlink()
    os.mkfifo(model_dir / "config.json")
    assert refusal(model_dir).startswith(f"{model_dir} has no config.json; pass a directory written by")
    index = model_dir / "model.safetensors.index.json"
    os.mkfifo(index)
    assert _json_refusal(index) == (
        f"{index} is not a regular file; is it a save_pretrained index? Fetch the model again"
    )


def _json_refusal(path) -> str:
    from minitf.export.hf_files import _json

    with pytest.raises(MinitfError) as e:
        _json(path, "a save_pretrained index")
    return str(e.value)
