"""minitf.system.sizes: the size counted from the config is the model's, and what would not fit in memory
is refused before allocating."""

import importlib

import pytest

import minitf
from minitf.cli.common import run_main
from minitf.cli.generate import main as generate_main
from minitf.errors import ConfigError
from minitf.system.memory import physical_memory
from minitf.system.sizes import model_floats, sample_row_bytes
from tests.support.models import spread_model

# Sampling settings at their extremes: every value either samples from finite probabilities or is
# refused in one line naming the setting and its range; and the number of samples is bounded by
# memory before anything is allocated.


@pytest.fixture(scope="module")
def model():
    return spread_model()


def test_num_samples_beyond_memory_is_refused_before_allocating(model, monkeypatch, tiny_run, capsys):
    # a row: the KV cache's (keys and values, 2 layers, 2 heads, 16 positions, 16 dims, float32)
    # and 6 float32 rows of the padded vocabulary's logits in the sampler
    assert sample_row_bytes(model) == 2 * 2 * 2 * 16 * 16 * 4 + 6 * 4 * 128
    run_model, tok, _ = minitf.load_run(tiny_run)
    row = sample_row_bytes(run_model)
    module = importlib.import_module("minitf.system.sizes")
    monkeypatch.setattr(module, "physical_memory", lambda: 1000 * row)  # a machine that holds 1000
    with pytest.raises(ConfigError) as e:
        minitf.generate(run_model, tok, "O", max_new_tokens=2, num_samples=5000)
    message = str(e.value)
    assert (
        "\n" not in message and message.startswith("num_samples=5000 needs ") and "more than this machine's" in message
    )
    assert message.endswith("ask for at most 1000")
    # the command: one line naming --num-samples, before the line that says what it samples from
    argv = ["--run", str(tiny_run), "--num-samples", "2000000", "--max-new-tokens", "2"]
    with pytest.raises(SystemExit) as exit:
        run_main(lambda: generate_main(argv))
    out = capsys.readouterr()
    assert exit.value.code == 2 and out.out == ""
    assert out.err.startswith("error: --num-samples=2000000 needs ") and len(out.err.strip().splitlines()) == 1
    # as many as fit: unchanged
    assert len(minitf.generate(run_model, tok, "O", max_new_tokens=2, num_samples=1000, seed=0)) == 1000


# Mistakes a user makes that used to end in a traceback or an unclear error: each is now one line
# naming the problem and the fix (a ConfigError or MinitfError; the scripts print it as 'error: ...').


@pytest.mark.parametrize(
    "overrides",
    [
        dict(positions="learned"),
        dict(positions="sinusoidal", tie_embeddings=False, ffn="swiglu", norm="rmsnorm"),
        dict(positions="rope", bias=False, n_kv_head=2, ffn="relu2", ffn_hidden=48),
    ],
)
def test_the_size_counted_from_the_config_is_the_models(overrides):
    cfg = minitf.ModelConfig(vocab_size=300, n_layer=2, n_embd=32, n_head=4, block_size=16, **overrides)
    model = minitf.Transformer(cfg)
    held = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    assert model_floats(cfg) == held


@pytest.mark.parametrize(
    "overrides, size",
    [(dict(block_size=10**15), "128.0 PB"), (dict(n_layer=10**7), "7.9 TB")],
)
def test_a_model_too_big_for_memory_is_refused_before_allocating(overrides, size):
    cfg = minitf.ModelConfig(vocab_size=4096, **overrides)  # the default shape otherwise
    assert physical_memory() is not None
    with pytest.raises(ConfigError) as e:
        minitf.Transformer(cfg)  # at once: neither 10**15 rows nor 10**7 layers are built
    assert str(e.value).startswith(
        f"this model (n_layer={cfg.n_layer}, n_embd=128, block_size={cfg.block_size}, vocabulary 4096) needs "
        f"{size} for its float32 weights alone, more than this machine's "
    )
    assert str(e.value).endswith(" of memory; choose smaller model.* values")
