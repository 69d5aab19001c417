"""EleutherAI's lm-evaluation-harness over a trained run, both ways it reaches a model: its `hf`
backend over `minitf export`'s directory, and its `local-completions` backend, with its default
settings, against `minitf serve`. On a local multiple-choice task both give the same per-choice
log-likelihoods and the same accuracy; a generate_until task through the server gives
minitf.generate's greedy text. No network: the tasks and their data are written here."""

import json
import warnings

import pytest

import minitf
import minitf.export.hf
from minitf.run_dir import load_run
from tests.support.serving import serving

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed: pip install -e '.[eval]'")


pytest.importorskip("transformers", reason="the hf backend needs transformers: pip install -e '.[eval]'")


CHOICES = [" love night,", " xq zv bk!", " ROMEO ROMEO", " 0 1 2 3 4"]


SPEAKERS = ["ROMEO", "JULIET", "NURSE", "FRIAR", "MERCUTIO", "TYBALT"]


def write_tasks(root, contexts: list[str], greedy: list[str]):
    """A multiple-choice task (each context, CHOICES and its greedy continuation, which is right)
    and a generate_until task with the harness's default generation settings, each over a local
    JSON file."""
    docs = [{"context": c, "choices": [*CHOICES, g], "label": len(CHOICES)} for c, g in zip(contexts, greedy)]
    (root / "choice.json").write_text(json.dumps(docs))
    (root / "gen.json").write_text(json.dumps([{"context": f"\n{n}:\n", "answer": "O"} for n in SPEAKERS[:2]]))
    common = "dataset_path: json\ntest_split: test\ndoc_to_text: '{{context}}'\n"
    (root / "choice.yaml").write_text(
        f"task: minitf_choice\n{common}dataset_kwargs: {{data_files: {{test: {root / 'choice.json'}}}}}\n"
        "output_type: multiple_choice\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\n"
        "target_delimiter: ''\n"  # the choices are appended as written (the default puts a space between)
        "metric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]\n"
    )
    (root / "gen.yaml").write_text(
        f"task: minitf_gen\n{common}dataset_kwargs: {{data_files: {{test: {root / 'gen.json'}}}}}\n"
        "output_type: generate_until\ndoc_to_target: '{{answer}}'\n"
        "metric_list: [{metric: exact_match, aggregation: mean, higher_is_better: true}]\n"
    )


@pytest.fixture(scope="module")
def harness(tiny_run, corpus, tmp_path_factory):
    """The tasks' folder (with the exported directory in hf/) and run(backend, model_args, tasks)
    -> (results, each task's samples in document order), offline."""
    root = tmp_path_factory.mktemp("lm_eval")
    env = pytest.MonkeyPatch()  # datasets reads these when first imported
    for name, value in [("HF_DATASETS_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_CACHE", root / "cache")]:
        env.setenv(name, str(value))
    import lm_eval
    from lm_eval.tasks import TaskManager

    model, tok, cfg = load_run(tiny_run)
    text = sorted(corpus.iterdir())[0].read_text()[:400]
    assert len(tok.encode(text)) > 2 * cfg.model.block_size  # this one is left-truncated
    contexts = [f"\n{name}:\nO sweet" for name in SPEAKERS] + [text + "\nO sweet"]
    with warnings.catch_warnings():  # the long context keeps its last block_size, as both backends do
        warnings.simplefilter("ignore", UserWarning)
        greedy = [minitf.generate(model, tok, c, max_new_tokens=3, temperature=0) for c in contexts]
    write_tasks(root, contexts, greedy)
    minitf.export.hf.to_hf(model, tok, root / "hf")
    tasks = TaskManager(include_path=str(root))

    def run(backend, args, names):
        out = lm_eval.simple_evaluate(
            model=backend, model_args=args, tasks=names, task_manager=tasks, log_samples=True, device="cpu"
        )
        return out["results"], {name: sorted(out["samples"][name], key=lambda s: s["doc_id"]) for name in names}

    yield root, run
    env.undo()


@pytest.fixture(scope="module")
def served(harness, tiny_run):
    """Both tasks through local-completions against the server, with the harness's defaults."""
    root, run = harness
    with serving(tiny_run) as server:
        args = f"model={server.api.name},base_url={server.url}/completions"
        yield run("local-completions", args, ["minitf_choice", "minitf_gen"])


def loglikelihoods(samples) -> list[list[tuple[float, bool]]]:
    """Per document, per choice: (log-likelihood of the choice after the context, is it greedy)."""
    return [[(float(r[0][0]), r[0][1] in (True, "True")) for r in s["resps"]] for s in samples]


def test_hf_and_local_completions_agree(harness, served):
    root, run = harness
    results, samples = run("hf", f"pretrained={root / 'hf'},dtype=float32", ["minitf_choice"])
    served_results, served_samples = served
    ours, theirs = loglikelihoods(served_samples["minitf_choice"]), loglikelihoods(samples["minitf_choice"])
    assert len(ours) == len(theirs) == len(SPEAKERS) + 1 and all(len(d) == len(CHOICES) + 1 for d in ours)
    gap = max(abs(a[0] - b[0]) for da, db in zip(ours, theirs) for a, b in zip(da, db))
    assert gap < 1e-3, (gap, ours, theirs)
    assert [[g for _, g in d] for d in ours] == [[g for _, g in d] for d in theirs]  # the greedy check too
    assert any(d[-1][1] for d in ours)  # a greedy continuation is found greedy
    assert served_results["minitf_choice"]["acc,none"] == results["minitf_choice"]["acc,none"]
    assert len({round(ll, 3) for ll, _ in ours[0]}) == len(CHOICES) + 1  # a trained model: the choices differ


def test_generate_until_through_the_server_is_minitfs_greedy_text(served, tiny_run):
    """The harness's defaults for generate_until: greedy, up to 256 tokens, until a blank line or
    <|endoftext|>; the text is minitf.generate's for the same prompt."""
    model, tok, _ = load_run(tiny_run)
    _, samples = served
    for sample in samples["minitf_gen"]:
        prompt = sample["arguments"][0][0]  # (context, generation settings)
        want = minitf.generate(model, tok, prompt, max_new_tokens=256, temperature=0, stop=["\n\n", "<|endoftext|>"])
        assert sample["resps"] == [[want]] and want, (prompt, want)


@pytest.mark.slow
def test_the_docs_local_task_runs_as_written(tiny_run, tmp_path):
    """docs/elsewhere.md's --include_path example, run by bash as a user pastes it, in a folder holding
    the export it names (hf/shakespeare, here the tiny run's): the accuracy it prints is the share of
    lines whose right choice minitf itself gives the highest log-likelihood."""
    import os
    import re
    import subprocess
    import sys

    import torch

    from tests.support import ROOT

    page = (ROOT / "docs" / "elsewhere.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"^```bash\n(.*?)^```", page, re.M | re.S) if "--include_path" in b]
    model, tok, _ = load_run(tiny_run)
    minitf.export.hf.to_hf(model, tok, tmp_path / "hf" / "shakespeare")
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    env["HF_DATASETS_CACHE"] = str(tmp_path / "cache")
    r = subprocess.run(["bash", "-ec", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (acc,) = re.findall(r"^\|speakers\s*\|.*\|acc\s*\|.\s*\|\s*([\d.]+)\|", r.stdout, re.M)

    def loglikelihood(context: str, choice: str) -> float:  # the hf backend's split: the choice's own tokens
        ids, n = tok.encode(context + choice), len(tok.encode(context))
        with torch.no_grad():
            logits, _ = model(torch.tensor([ids]))  # (1, T, V)
        logp = torch.log_softmax(logits[0, :-1].float(), -1)  # (T-1, V): position t predicts token t+1
        return sum(logp[t - 1, ids[t]].item() for t in range(n, len(ids)))

    docs = [json.loads(line) for line in (tmp_path / "my_tasks" / "speakers.jsonl").read_text().splitlines()]
    right = [max(range(2), key=lambda i: loglikelihood(d["context"], d["choices"][i])) == d["label"] for d in docs]
    assert len(docs) == 3 and float(acc) == pytest.approx(sum(right) / len(docs), abs=1e-4)
