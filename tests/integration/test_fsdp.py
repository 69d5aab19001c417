"""train.parallel=fsdp on CPU (gloo): a sharded step equals one process's step on the whole batch;
the sharded checkpoint reshards to another number of processes, survives a kill -9 at its worst
moment and resumes bit-identically on as many processes; activation checkpointing changes no
gradient; the wrong combinations are one line."""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

import minitf
from minitf.config import TrainConfig
from minitf.errors import ConfigError, MinitfError
from minitf.optim import make_optimizer
from minitf.trainer import forward_backward
from minitf.training import checkpoint as ckpt
from minitf.training import fsdp
from minitf.training.metrics import METRICS, read_rows
from tests.support import ROOT
from tests.support.models import step_session
from tests.support.processes import command, join_gloo, leave_gloo
from tests.support.runs import tiny_config, tiny_train_args

CFG = minitf.ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)


# AdamW (fsdp shards refuse Muon); a clip below the gradient's norm (~1.9): it acts
TC = TrainConfig(grad_accum=2, grad_clip=0.5, optimizer="adamw")


QUIET = dict(log=lambda *a: None)


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (8, 16), generator=g), torch.randint(0, 64, (8, 16), generator=g)


def _model(shard: bool, checkpoint_blocks: bool = False):
    torch.manual_seed(0)
    model = minitf.Transformer(CFG)
    model.checkpoint_blocks = checkpoint_blocks
    if shard:
        fsdp.shard(model, torch.device("cpu"), torch.float32)
    return model


def _full(tensors: dict) -> dict:
    return {n: fsdp.full_tensor(t).detach().clone() for n, t in tensors.items()}


def _exp_avg(model, optimizer) -> dict:
    names = {id(p): n for n, p in model.named_parameters()}
    return _full({names[id(p)]: s["exp_avg"] for p, s in optimizer.state.items()})


def _fsdp_worker(rank, world, init_file, run_dir):
    """One step of minitf's own forward_backward (2 micro-batches of 2 of this rank's 4 sequences,
    clipped) and AdamW, sharded over 2 ranks, without and with activation checkpointing; then the
    sharded checkpoint of the second."""
    join_gloo(rank, world, init_file)
    x, y = _batch()
    mine = slice(rank * 4, (rank + 1) * 4)
    results = {}
    for ac in (False, True):
        model = _model(shard=True, checkpoint_blocks=ac)
        optimizer = make_optimizer(model, TC, torch.device("cpu"))
        micro = [(x[mine][:2], y[mine][:2]), (x[mine][2:], y[mine][2:])]
        _, norm = forward_backward(step_session(model, micro, optimizer, TC, distributed=True))
        grads = _full({n: p.grad for n, p in model.named_parameters()})
        optimizer.step()
        results[ac] = {"norm": norm, "grads": grads, "weights": _full(dict(model.named_parameters()))}
    fsdp.save_sharded(Path(run_dir), model, optimizer, {"tokenizer": "t"}, 1, rank == 0)
    exp_avg = _exp_avg(model, optimizer)  # gathered: every rank takes part
    if rank == 0:
        torch.save({"results": results, "exp_avg": exp_avg}, Path(run_dir) / "fsdp.pt")
    leave_gloo()


def _reload_worker(rank, world, init_file, run_dir):
    """The 2-rank checkpoint loaded on 3 ranks (uneven shards: 64 rows, 32 columns), written out whole."""
    join_gloo(rank, world, init_file)
    model = _model(shard=True)
    optimizer = make_optimizer(model, TC, torch.device("cpu"))
    fsdp.load_sharded(Path(run_dir), model, optimizer, print, rank == 0)
    exp_avg = _exp_avg(model, optimizer)
    fsdp.save_full_weights(model, Path(run_dir) / "reloaded.safetensors", 1, "t", rank == 0)
    if rank == 0:
        torch.save(exp_avg, Path(run_dir) / "reloaded-exp-avg.pt")
    leave_gloo()


def test_a_sharded_step_equals_one_process_on_the_whole_batch_and_reshards(tmp_path):
    mp.spawn(_fsdp_worker, args=(2, str(tmp_path / "init2"), str(tmp_path)), nprocs=2)
    saved = torch.load(tmp_path / "fsdp.pt", weights_only=True)
    # the reference: plain autograd on all 8 sequences at once (the loss as training computes it),
    # clipped, one AdamW step
    x, y = _batch()
    single = _model(shard=False)
    single(x, y, logits=False)[1].backward()
    norm = torch.nn.utils.clip_grad_norm_(single.parameters(), TC.grad_clip)
    grads = {n: p.grad.clone() for n, p in single.named_parameters()}
    make_optimizer(single, TC, torch.device("cpu")).step()
    for ac, got in saved["results"].items():
        assert norm > TC.grad_clip  # the clip acted: the norm must be the one over both shards
        torch.testing.assert_close(got["norm"], norm, atol=1e-6, rtol=1e-6)
        assert got["grads"].keys() == grads.keys()
        for name, p in single.named_parameters():
            # activation checkpointing changes no gradient (1e-6); a wrong division would be off 2x
            torch.testing.assert_close(got["grads"][name], grads[name], atol=1e-6, rtol=0, msg=f"{name} ac={ac}")
            torch.testing.assert_close(got["weights"][name], p.detach(), atol=1e-5, rtol=0, msg=f"{name} ac={ac}")

    assert sorted(p.name for p in tmp_path.iterdir() if "sharded" in p.name) == ["sharded-00000001"]
    mp.spawn(_reload_worker, args=(3, str(tmp_path / "init3"), str(tmp_path)), nprocs=3)
    a, b = load_file(tmp_path / "model.safetensors"), load_file(tmp_path / "reloaded.safetensors")
    assert a.keys() == b.keys() == load_file(_saved_plain(single, tmp_path)).keys()  # the tied head once
    assert all(torch.equal(a[k], b[k]) for k in a)
    reloaded = torch.load(tmp_path / "reloaded-exp-avg.pt", weights_only=True)
    assert reloaded.keys() == saved["exp_avg"].keys()
    assert all(torch.equal(reloaded[k], saved["exp_avg"][k]) for k in reloaded)


def _saved_plain(model, tmp_path) -> Path:
    minitf.training.checkpoint.save_weights(model, tmp_path / "plain.safetensors", 1)
    return tmp_path / "plain.safetensors"


def test_activation_checkpointing_gives_the_same_gradients(tmp_path, corpus, monkeypatch):
    cfg = minitf.ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
    x, y = _batch()
    grads = []
    for ac in (False, True):
        torch.manual_seed(0)
        model = minitf.Transformer(cfg)
        model.checkpoint_blocks = ac
        torch.manual_seed(1)  # the dropout masks: recomputation must draw the same ones
        model(x, y)[1].backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-6, rtol=0)

    # through the config key: recomputed blocks (counted), the same weights after training
    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    runs = [
        minitf.train(
            tiny_config(
                tmp_path / str(ac),
                corpus,
                "train.max_steps=3",
                "model.dropout=0.1",
                f"train.activation_checkpointing={ac}",
            ),
            **QUIET,
        )
        for ac in (False, True)
    ]
    assert len(calls) == 3 * 2  # 3 steps x 2 blocks, only in the run that asked
    a, b = (load_file(r / "model.safetensors") for r in runs)
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=0)


# rank 0 is killed (SIGKILL) at the worst moment of the step-8 checkpoint: every rank has written
# its shards and the folder is in place, but state.pt, the commit, is not yet written
KILLED_BEFORE_COMMIT = """
import os, runpy, signal, sys
import minitf.training.checkpoint

real = minitf.training.checkpoint.write_state

def die_before_commit(run_dir, state, step):
    if step == 8:
        os.kill(os.getpid(), signal.SIGKILL)
    real(run_dir, state, step)

minitf.training.checkpoint.write_state = die_before_commit
sys.argv = ["scripts/train.py", *sys.argv[1:]]
runpy.run_path("scripts/train.py", run_name="__main__")
"""


def _torchrun(procs, script, *args, env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", script, *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_torchrun_fsdp_killed_before_a_commit_resumes_exactly_then_on_one_process(tmp_path, corpus):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    args = lambda run: [
        *tiny_train_args(run, corpus),
        "model.dropout=0.1",
        "train.grad_accum=2",
        "train.max_steps=8",
        "train.eval_every=4",
        "train.ckpt_every=4",
        "train.eval_batches=2",
        "train.parallel=fsdp",
    ]
    r = _torchrun(2, "scripts/train.py", *args(tmp_path / "straight"), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "sharded over 2 procs (fsdp, AdamW)" in r.stdout and r.stdout.count("run directory:") == 1

    run = tmp_path / "killed"
    (tmp_path / "kill.py").write_text(KILLED_BEFORE_COMMIT)
    r = _torchrun(2, str(tmp_path / "kill.py"), *args(run), env=env)
    assert r.returncode != 0
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 4  # the last commit
    assert (run / "sharded-00000008").is_dir()  # complete, but not committed
    r = _torchrun(2, "scripts/train.py", "--resume", f"run.out_dir={run}", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming {run} at step 4" in r.stdout
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(run / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit-identical, dropout and all
    assert [m["step"] for m in read_rows(run / METRICS)] == [4, 8]
    assert sorted(p.name for p in run.iterdir() if "sharded" in p.name) == ["sharded-00000008"]
    assert (run / "best.safetensors").is_file()

    # 2 -> 1 process (this one: fsdp training leaves the allocator as it is): the sharded checkpoint
    # loads unsharded and training goes on
    r = command("train", "--resume", f"run.out_dir={run}", "train.max_steps=10")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "checkpoint from 2 processes resumed on 1" in r.stdout and f"resuming {run} at step 8" in r.stdout
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 10
    model, tok, cfg = minitf.load_run(run)  # plain single-process loading of the full weights
    assert cfg.train.parallel == "fsdp" and minitf.training.checkpoint.weights_step(run / "model.safetensors") == 10


def test_wrong_combinations_and_damaged_checkpoints_are_one_line(tmp_path, corpus):
    with pytest.raises(ConfigError, match=r"^train.parallel must be one of ddp\|fsdp, got 'zero3'$"):
        minitf.load_config(None, ["train.parallel=zero3"])
    with pytest.raises(ConfigError, match="^train.parallel=fsdp does not support train.dtype=float16; use bfloat16"):
        minitf.load_config(None, ["train.parallel=fsdp", "train.dtype=float16"])

    # one process: trained unsharded, checkpointed as fsdp does, so many processes can take it on
    lines = []
    run = minitf.train(
        tiny_config(tmp_path / "run", corpus, "train.parallel=fsdp", "train.max_steps=4"), log=lines.append
    )
    assert any(" | fsdp in one process, unsharded (AdamW) | " in line for line in lines)
    assert (run / "sharded-00000004" / ".metadata").is_file() and "model" not in torch.load(
        run / "state.pt", weights_only=True
    )
    with pytest.raises(
        ConfigError,
        match=r"--resume cannot change train.parallel \(the run was trained with "
        r"train.parallel='fsdp'\)",
    ):
        minitf.train(tiny_config(run, corpus, "train.max_steps=6"), resume=True, **QUIET)
    more = lambda: minitf.train(
        tiny_config(run, corpus, "train.parallel=fsdp", "train.max_steps=6", "train.activation_checkpointing=true"),
        resume=True,
        **QUIET,
    )
    more()  # a memory switch: a resume may turn it on
    assert torch.load(run / "state.pt", weights_only=True)["sharded"] == "sharded-00000006"

    class Evil:  # a .metadata that would run code if it were unpickled freely
        def __reduce__(self):
            return print, ("unpickled!",)

    meta = run / "sharded-00000006" / ".metadata"
    good = meta.read_bytes()
    meta.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(
        MinitfError,
        match=r"sharded-00000006 does not load \(the metadata holds builtins.print, "
        r"which is not a DCP record\); the checkpoint is damaged",
    ):
        more()
    meta.write_bytes(good)
    (run / "sharded-00000006").rename(run / "elsewhere")
    with pytest.raises(MinitfError, match="names sharded-00000006, which is missing or incomplete"):
        more()


# Nothing broken that minitf reads is used silently: weights holding NaN or infinity are refused
# wherever a run is loaded (generate, evaluate, both exports, the explorer, resume, the sharded
# checkpoint), a run.init_from directory that does not describe one complete model is refused in
# one line naming what is wrong (never random layers), and a resume without the run's tokenizer
# says what is missing.


def test_a_sharded_checkpoint_with_non_finite_weights_is_refused(tmp_path, corpus):
    from minitf.optim import make_optimizer
    from minitf.training import fsdp

    cfg = tiny_config(tmp_path / "run", corpus, "train.parallel=fsdp", "train.max_steps=4")
    run = minitf.train(cfg, **QUIET)
    cfg = minitf.load_config(run / ckpt.CONFIG)
    model = minitf.Transformer(cfg.model)
    optimizer = make_optimizer(model, cfg.train, torch.device("cpu"))
    state = fsdp.load_sharded(run, model, optimizer, print, True)
    with torch.no_grad():
        model.ln_f.weight[0] = float("nan")
    keep = {k: state[k] for k in ("scaler", "rng", "rank_rng", "elapsed", "best_val", "tokenizer", "data")}
    fsdp.save_sharded(run, model, optimizer, keep, 6, True)  # a checkpoint the trainer would never write
    with pytest.raises(
        MinitfError, match=r"sharded-00000006: tensor ln_f.weight holds NaN/inf values \(1 of 32\); .*cannot be resumed"
    ):
        minitf.train(run, resume=True, overrides=["train.max_steps=8"], **QUIET)


# One run per directory and per process: a refused run leaves no trace (no .lock, no directory),
# a second minitf.train() in the same process while one runs is refused (each run stays
# reproducible), and the sharded checkpoint's temporary folder has a fresh name no link can take.


def test_sharded_checkpoints_are_written_into_a_fresh_folder_never_through_a_link(tmp_path, corpus, monkeypatch):
    from minitf import trainer

    """train.parallel=fsdp in one process writes the same sharded checkpoint as under torchrun."""
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.parallel=fsdp", "train.max_steps=4"), **QUIET)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    (run / ".sharded-00000008.tmp").symlink_to(victim)  # the name every save of step 8 used to write into
    resume = lambda steps: minitf.train(run, resume=True, overrides=[f"train.max_steps={steps}"], **QUIET)  # noqa: E731
    resume(8)
    assert os.listdir(victim) == ["keep.txt"]  # no shard landed behind the link
    folder = run / "sharded-00000008"
    assert folder.is_dir() and not folder.is_symlink() and (folder / ".metadata").is_file()
    assert [p.name for p in run.iterdir() if p.name.startswith(".sharded")] == [".sharded-00000008.tmp"]
    assert oct(folder.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # as the run's other folders

    (run / "sharded-00000012").symlink_to(victim)  # a link where the folder of step 12 goes
    with pytest.raises(MinitfError, match=r"sharded-00000012 is a symbolic link \(to .*victim\); minitf does not"):
        resume(12)  # refused before any step
    assert os.listdir(victim) == ["keep.txt"]
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 8 and (folder / ".metadata").is_file()

    # planted while the run trains (after the check above), the link is refused at the save itself
    (run / "sharded-00000012").unlink()
    real_step = trainer.train_step

    def plant_then_step(run_, *a):
        if run_.step == 10 and not (run / "sharded-00000012").is_symlink():
            (run / "sharded-00000012").symlink_to(victim)
        return real_step(run_, *a)

    monkeypatch.setattr(trainer, "train_step", plant_then_step)
    with pytest.raises(MinitfError, match=r"sharded-00000012 is a symbolic link"):
        resume(12)
    assert os.listdir(victim) == ["keep.txt"]
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 8 and len(load_file(run / "model.safetensors"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
