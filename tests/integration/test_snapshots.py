"""train.snapshot_every: the weights every N steps, kept through a resume, refused for large
models; and minitf heads, which scores and draws them."""

import dataclasses
import os
import shutil

import matplotlib.image as mpimg
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import minitf
from minitf.cli import main as minitf_main
from minitf.config import load_run_config
from minitf.errors import shown
from minitf.interpret.history import heads_over_training
from minitf.plots import training_figures
from minitf.plots.training_figures import format_heads_table
from minitf.run_dir import list_snapshots, weights_step
from tests.support.runs import QUIET, tiny_config
from tests.support.runs import snapshot_weights as weights


@pytest.fixture(scope="module")
def snapshot_run(tmp_path_factory, corpus):
    """A tiny run of 6 steps that kept its weights every 3 (it prints its evaluations: capsys reads them first)."""
    out = tmp_path_factory.mktemp("snapshots") / "run"
    return minitf.train(tiny_config(out, corpus, "train.snapshot_every=3", "train.max_steps=6"), **QUIET)


def test_snapshots_hold_the_weights_of_their_steps(snapshot_run):
    run = snapshot_run
    kept = list_snapshots(run)
    assert [s for s, _ in kept] == [3, 6]
    assert [p.name for _, p in kept] == ["step_000003.safetensors", "step_000006.safetensors"]
    assert weights_step(kept[0][1]) == 3 and weights_step(kept[1][1]) == 6
    final, last = weights(run / "model.safetensors"), weights(kept[1][1])
    assert final.keys() == last.keys() and all(torch.equal(final[k], last[k]) for k in final)
    first = weights(kept[0][1])
    assert not torch.equal(first["lm_head.weight"], final["lm_head.weight"])  # three more steps changed them
    model, _, _ = minitf.load_run(run)  # a snapshot loads into the run's model
    minitf.run_dir.load_weights(model, kept[0][1])
    assert torch.equal(model.lm_head.weight, first["lm_head.weight"])


def test_heads_scores_and_draws_every_snapshot(snapshot_run, tmp_path, capsys):
    run = snapshot_run
    capsys.readouterr()
    history = heads_over_training(run)
    assert history.steps == [3, 6] and history.length == 16  # half the block of 32
    assert history.induction.shape == history.previous_token.shape == (2, 2, 2)  # (snapshots, layers, heads)
    assert ((history.induction >= 0) & (history.induction <= 0.5 + 1e-6)).all()
    # random tokens among those the run's text uses (its token cache), the in-context score on its validation text
    assert history.drawn_from.endswith("tokens its text uses") and int(history.drawn_from.split()[1]) < 300
    assert history.in_context_on == "64 windows of its validation text"
    table = format_heads_table(history).splitlines()
    assert table[0].split() == ["induction", "score", "previous-token", "score"] and len(table) == 4
    assert table[1].split()[:4] == ["step", "val", "loss", "in-context"]
    # step, val loss, in-context, the 4 heads' induction scores, the 2 best previous-token scores
    assert table[3].split()[0] == "6" and len(table[3].split()) == 3 + 4 + 2
    best_previous = history.previous_token[-1].flatten().sort(descending=True).values[:2]  # (2,)
    assert [float(v) for v in table[3].split()[-2:]] == [round(float(v), 3) for v in best_previous]
    out = tmp_path / "heads.png"
    minitf_main(["heads", "--run", str(run), "--out", str(out)])
    printed = capsys.readouterr().out
    assert printed.endswith(f"wrote {out}\n") and printed.splitlines()[:2] == table[:2]
    img = mpimg.imread(out)  # (height, width, 4)
    assert img.shape[0] > 500 and img.shape[1] > 500 and img[..., :3].std() > 0.05


def test_heads_without_a_run_or_snapshots_is_one_line(snapshot_run, tmp_path, capsys):
    run = tmp_path / "run"  # a run trained without train.snapshot_every
    run.mkdir()
    shutil.copy(snapshot_run / "config.yaml", run / "config.yaml")
    capsys.readouterr()
    for argv, words in (
        (["heads", "--run", str(tmp_path / "nowhere")], "does not exist; pass --run DIR"),
        (["heads", "--run", str(run)], "has no snapshots; train it with train.snapshot_every=N"),
    ):
        with pytest.raises(SystemExit) as e:
            minitf_main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("error: ") and words in err and err.count("\n") == 1


def test_the_figure_shows_previous_token_scores_beside_induction(snapshot_run, monkeypatch, tmp_path):
    """docs/look-inside.md tells the story through a layer-0 previous-token head: the figure draws it."""
    drawn = []
    monkeypatch.setattr(training_figures, "save_figure", lambda fig, path, **kw: drawn.append(fig) or path)
    history, _ = training_figures.watch_heads(snapshot_run, tmp_path / "heads.png")
    ax_loss, ax_prev, ax_ind, ax_icl = drawn[0].axes
    assert ax_prev.get_ylabel() == "previous-token score" and ax_ind.get_ylabel() == "induction score"
    lines = {line.get_label(): line for line in ax_prev.get_lines()}
    assert sorted(lines) == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert list(lines["L0H1"].get_ydata()) == history.previous_token[:, 0, 1].tolist()
    assert lines["L0H1"].get_linestyle() == "-" and lines["L1H1"].get_linestyle() == ":"  # layer 0 solid


def broken_copy(snapshot_run, tmp_path, make):
    """A copy of the run whose snapshots/ make(snapshots) has changed; what minitf heads says of it."""
    run = tmp_path / "run"
    shutil.copytree(snapshot_run, run, ignore=shutil.ignore_patterns("*.png"))
    make(run / "snapshots")
    with pytest.raises(minitf.MinitfError) as e:
        heads_over_training(run)
    return str(e.value).replace(str(run), "RUN")


def resaved(path, to=None, **meta):
    """The snapshot at path saved again (at `to`), its metadata changed by meta."""
    with safe_open(str(path), "pt") as f:
        metadata = {**f.metadata(), **meta}
    save_file(weights(path), str(to or path), metadata=metadata)


def other_shape(snapshots):
    path = snapshots / "step_000003.safetensors"
    cfg = load_run_config(snapshots.parent / "config.yaml").model
    model = minitf.Transformer(
        dataclasses.replace(cfg, n_embd=2 * cfg.n_embd)
    )  # another model's weights, step 3's name
    wide = {k: v.contiguous() for k, v in model.state_dict().items() if k != "wte.weight"}  # tied: stored once
    with safe_open(str(path), "pt") as f:
        save_file(wide, str(path), metadata=f.metadata())


def link_outside(snapshots):
    outside = snapshots.parent.parent / "elsewhere.safetensors"
    shutil.copy(snapshots / "step_000003.safetensors", outside)
    (snapshots / "step_000003.safetensors").unlink()
    (snapshots / "step_000003.safetensors").symlink_to(outside)


BROKEN = {
    "a second name for step 3": (
        lambda d: shutil.copy(d / "step_000003.safetensors", d / "step_3.safetensors"),
        "RUN: snapshot snapshots/step_3.safetensors is not a name minitf writes (step 3's snapshot is "
        "step_000003.safetensors, which is there too: step 3 would count twice); remove it",
    ),
    "a 23-digit step": (
        lambda d: resaved(d / "step_000006.safetensors", d / f"step_{10**22}.safetensors", step=str(10**22)),
        f"RUN: snapshot snapshots/step_{10**22}.safetensors holds step {10**22:,}, past the run's "
        "train.max_steps=6; remove it",
    ),
    "a name that is not a step": (
        lambda d: shutil.copy(d / "step_000003.safetensors", d / "step_final.safetensors"),
        "RUN: snapshot snapshots/step_final.safetensors holds no step a run reaches (minitf writes "
        "step_000100.safetensors for step 100); remove it",
    ),
    "step 6 renamed step 5": (
        lambda d: (d / "step_000006.safetensors").rename(d / "step_000005.safetensors"),
        "RUN: snapshot snapshots/step_000005.safetensors holds step '6' in its metadata, not 5: it was renamed; "
        "remove it",
    ),
    "another tokenizer": (
        lambda d: resaved(d / "step_000003.safetensors", tokenizer="0" * 64),
        "RUN: snapshot snapshots/step_000003.safetensors was trained with another tokenizer than the run's "
        "tokenizer.json: it is another run's; remove it",
    ),
    "another shape": (
        other_shape,
        "RUN: snapshot snapshots/step_000003.safetensors holds blocks.0.attn.c_attn.bias of shape (192,), "
        "where the run's config makes (96,): it is another model's; remove it",
    ),
    "a link out of the run": (
        link_outside,
        "RUN: snapshot snapshots/step_000003.safetensors is a link to {OUT}, outside the run: training writes "
        "its snapshots itself; remove it",
    ),
    "a FIFO": (
        lambda d: ((d / "step_000003.safetensors").unlink(), os.mkfifo(d / "step_000003.safetensors")),
        "RUN: snapshot snapshots/step_000003.safetensors is not a regular file (training writes its snapshots "
        "as files); remove it",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_snapshot_the_run_did_not_write_so_is_named_with_what_is_wrong(snapshot_run, tmp_path, case):
    make, message = BROKEN[case]
    got = broken_copy(snapshot_run, tmp_path, make)
    outside = shown(str((tmp_path / "elsewhere.safetensors").resolve()))  # a long path cut short
    assert got == message.replace("{OUT}", outside), got


def test_heads_length_0_and_a_run_that_is_a_file_are_one_line(snapshot_run, tmp_path, capsys):
    a_file = tmp_path / "run.txt"
    a_file.write_text("not a run")
    capsys.readouterr()
    for argv, words in (
        (["heads", "--run", str(snapshot_run), "--length", "0"], "error: length (--length) is 0; pass an int in 6..16"),
        (["heads", "--run", str(a_file)], f"error: run directory {str(a_file)!r} is a file, not a directory; pass"),
    ):
        with pytest.raises(SystemExit) as e:
            minitf_main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(words) and err.count("\n") == 1, err
