"""train.snapshot_every: the weights every N steps, kept through a resume, refused for large
models; and minitf heads, which scores and draws them."""

import shutil

import matplotlib.image as mpimg
import pytest
import torch

import minitf
from minitf.cli import main as minitf_main
from minitf.interpret.history import heads_over_training
from minitf.plots.training_figures import format_heads_table
from minitf.run_dir import list_snapshots, weights_step
from tests.helpers import QUIET, tiny_config
from tests.helpers import snapshot_weights as weights


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
    assert table[0].split()[:4] == ["step", "val", "loss", "in-context"] and len(table) == 3
    assert table[2].split()[0] == "6" and len(table[2].split()) == 3 + 4  # step, val loss, in-context, 4 heads
    out = tmp_path / "heads.png"
    minitf_main(["heads", "--run", str(run), "--out", str(out)])
    printed = capsys.readouterr().out
    assert printed.endswith(f"wrote {out}\n") and printed.splitlines()[0] == table[0]
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
