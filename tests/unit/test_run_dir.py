"""minitf.run_dir: load_run refuses weights holding NaN or infinity and a tokenizer of the same size from elsewhere."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

import minitf
from minitf.errors import MinitfError
from minitf.training import checkpoint as ckpt
from tests.support.corpus import make_play
from tests.support.runs import TENSOR, poison, refusal

# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_a_tokenizer_of_the_same_size_from_elsewhere_is_refused(tmp_path, corpus, tiny_run):
    run = tmp_path / "copy"
    shutil.copytree(tiny_run, run)
    other = minitf.Tokenizer.train([make_play(seed) for seed in range(10, 16)], vocab_size=300)
    assert other.vocab_size == 300 and other.hash != minitf.Tokenizer.load(run / "tokenizer.json").hash
    (run / "tokenizer.json").write_text(other.to_json())
    with pytest.raises(minitf.MinitfError, match="tokenizer.json is not the tokenizer this model was trained with"):
        minitf.load_run(run)


# Nothing broken that minitf reads is used silently: weights holding NaN or infinity are refused
# wherever a run is loaded (generate, evaluate, both exports, the explorer, resume, the sharded
# checkpoint), a run.init_from directory that does not describe one complete model is refused in
# one line naming what is wrong (never random layers), and a resume without the run's tokenizer
# says what is missing.


def test_load_run_names_the_file_and_the_tensor_and_a_way_out(nan_run):
    with pytest.raises(MinitfError) as e:
        minitf.load_run(nan_run)
    line = str(e.value)
    assert line.startswith(refusal(nan_run)) and "\n" not in line
    assert line.endswith("use best.safetensors (--best) or train again with a lower train.lr")
    model, _, _ = minitf.load_run(nan_run, best=True)  # the way out it names works
    assert all(torch.isfinite(p).all() for p in model.parameters())
    poison(nan_run / ckpt.BEST, "wte.weight" if "wte.weight" in load_file(nan_run / ckpt.BEST) else "lm_head.weight")
    with pytest.raises(MinitfError, match=r"best.safetensors: tensor (wte|lm_head).weight holds NaN/inf .*--best\)"):
        minitf.load_run(nan_run, best=True)


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_infinities_are_refused_too(nan_run, value):
    poison(nan_run / ckpt.WEIGHTS, "ln_f.weight", value)
    poison(nan_run / ckpt.WEIGHTS, TENSOR, 0.0)
    with pytest.raises(MinitfError, match=r"model.safetensors: tensor ln_f.weight holds NaN/inf values \(1 of 32\)"):
        minitf.load_run(nan_run)


@pytest.mark.parametrize("where", [0, 6, 7, 99], ids=["first", "end-of-a-chunk", "next-chunk", "last"])
def test_the_check_goes_chunk_by_chunk_and_misses_no_element(monkeypatch, where):
    """A downloaded embedding is checked FINITE_CHUNK elements at a time (isfinite over all of a
    Llama 3's would hold 1.2 GB of temporaries): a NaN anywhere, at a chunk's edge too, is found."""
    import minitf.run_dir

    monkeypatch.setattr(minitf.run_dir, "FINITE_CHUNK", 7)
    t = torch.ones(10, 10, dtype=torch.bfloat16)
    assert minitf.run_dir.all_finite(t)
    t.view(-1)[where] = float("nan")
    assert not minitf.run_dir.all_finite(t)
    with pytest.raises(MinitfError, match=r"m.safetensors: tensor wte.weight holds NaN/inf values \(1 of 100\)"):
        minitf.run_dir.refuse_non_finite([("wte.weight", t)], "m.safetensors", "fetch it again")
