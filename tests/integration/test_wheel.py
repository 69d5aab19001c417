"""A real package: the wheel holds every module, page and recipe; installed into a fresh virtual
environment with no clone around it, `minitf train --config tiny` and `minitf generate` work.

The venv sees the packages of the Python that runs the tests (torch, tokenizers, ...: nothing is
downloaded, pip runs with --no-index), whether that is the system's or a virtual environment of the
user's, and this checks that it imports its own copy of minitf, not the clone's."""

import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"{cmd[:3]}... failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the files a build reads (so build/ never lands in the clone)."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("minitf", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(dist)], env=env
    )
    (whl,) = dist.glob("minitf-*.whl")
    return whl


def test_the_wheel_holds_every_package_page_and_recipe(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    source = ROOT / "minitf"
    files = {
        p.relative_to(ROOT).as_posix()
        for p in source.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    missing = files - names
    assert not missing, f"the wheel lacks {sorted(missing)}: list the sub-package in pyproject.toml's packages"
    recipes = {f"minitf/configs/{p.name}" for p in (ROOT / "configs").glob("*.yaml")}
    assert recipes and recipes <= names
    entry_points = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py3')[0]}.dist-info/entry_points.txt").decode()
    assert "minitf = minitf.cli:main" in entry_points


def _see_our_packages(python: Path) -> None:
    """torch & co. for the new venv: the site-packages of the Python running the tests, after the
    venv's own. venv's system_site_packages would give the base interpreter's instead, which in a
    user's virtual environment has no torch. Paths named in a .pth file are searched, but .pth files
    inside them are not run, so the clone's editable minitf stays out of sight."""
    ours = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(ours, "test-deps.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))


@pytest.mark.slow
def test_minitf_train_and_generate_from_a_wheel_in_a_fresh_venv(wheel, tmp_path, corpus):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python, minitf_cmd = env_dir / "bin" / "python", env_dir / "bin" / "minitf"
    _see_our_packages(python)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    # --ignore-installed: the system's own minitf (an editable install) is left as it is, never removed
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--ignore-installed"]
    _run([*pip, str(wheel)], env=env)
    work = tmp_path / "work"  # no clone here: nothing but the text to train on
    work.mkdir()
    shutil.copy(corpus / "play0.txt", work / "play.txt")
    where = _run([str(python), "-c", "import minitf; print(minitf.__file__)"], cwd=work, env=env).stdout.strip()
    assert Path(where).resolve().is_relative_to(env_dir.resolve()), f"imported {where}, not the venv's copy"
    r = _run(
        [
            str(minitf_cmd),
            "train",
            "--config",
            "tiny",
            "data.source=file:play.txt",
            "data.vocab_size=300",
            "model.n_embd=32",
            "model.block_size=32",
            "train.max_steps=4",
            "train.eval_every=2",
            "train.eval_batches=1",
            "train.ckpt_every=2",
            "run.out_dir=out",
        ],
        cwd=work,
        env=env,
    )
    assert (work / "out" / "model.safetensors").is_file() and (work / "out" / "loss.png").is_file()
    r = _run(
        [str(minitf_cmd), "generate", "--run", "out", "--prompt", "ROMEO:", "--max-new-tokens", "8", "--seed", "0"],
        cwd=work,
        env=env,
    )
    assert r.stdout.startswith("ROMEO:") and len(r.stdout.strip()) > len("ROMEO:")
    r = subprocess.run(
        [str(minitf_cmd), "train", "--config", "tinny"], capture_output=True, text=True, cwd=work, env=env
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "tiny, tinystories" in r.stderr
