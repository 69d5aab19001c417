"""lm-evaluation-harness with --apply_chat_template over a chat run, both ways: its
`local-chat-completions` backend against `minitf serve`'s /v1/chat/completions, and its `hf`
backend over the export (whose tokenizer_config.json carries the template). On a local generative
task both give the same answers, and each is minitf.chat's greedy answer. No network."""

import json

import pytest

import minitf
from minitf.conversations.answer import chat
from minitf.export.hf import to_hf
from tests.support.serving import serving

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed: pip install -e '.[eval]'")
pytest.importorskip("transformers", reason="the hf backend needs transformers: pip install -e '.[eval]'")

QUESTIONS = [("What is 2 plus 3?", "5"), ("Spell dog.", "d o g"), ("What is 7 plus 1?", "8")]
MAX_GEN = 12  # the tiny run's context is 128 tokens: the harness's default 256 would not fit


@pytest.fixture(scope="module")
def harness(chat_run, tmp_path_factory):
    """(run(backend, model_args) -> the task's samples in document order, the export's directory)."""
    root = tmp_path_factory.mktemp("lm_eval_chat")
    env = pytest.MonkeyPatch()  # datasets reads these when first imported
    for name, value in [("HF_DATASETS_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_CACHE", root / "cache")]:
        env.setenv(name, str(value))
    import lm_eval
    from lm_eval.tasks import TaskManager

    (root / "qa.json").write_text(json.dumps([{"question": q, "answer": a} for q, a in QUESTIONS]))
    (root / "qa.yaml").write_text(
        f"task: minitf_chat_qa\ndataset_path: json\ndataset_kwargs: {{data_files: {{test: {root / 'qa.json'}}}}}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        # until: the end of the turn only (the harness's default stop, a blank line, would cut answers)
        f"generation_kwargs: {{until: ['<|im_end|>'], max_gen_toks: {MAX_GEN}, do_sample: false, temperature: 0.0}}\n"
        "metric_list: [{metric: exact_match, aggregation: mean, higher_is_better: true}]\n"
    )
    model, tok, _ = minitf.load_run(chat_run)
    to_hf(model, tok, root / "hf")
    tasks = TaskManager(include_path=str(root))

    def run(backend, args):
        out = lm_eval.simple_evaluate(
            model=backend,
            model_args=args,
            tasks=["minitf_chat_qa"],
            task_manager=tasks,
            log_samples=True,
            device="cpu",
            apply_chat_template=True,
        )
        return sorted(out["samples"]["minitf_chat_qa"], key=lambda s: s["doc_id"])

    yield run, root / "hf"
    env.undo()


def test_chat_completions_and_hf_backends_agree(harness, chat_run):
    run, exported = harness
    with serving(chat_run) as server:
        served = run("local-chat-completions", f"model={server.api.name},base_url={server.url}/chat/completions")
    local = run("hf", f"pretrained={exported},dtype=float32")
    model, tok, _ = minitf.load_run(chat_run)
    want = [
        chat(model, tok, [{"role": "user", "content": q}], temperature=0.0, max_new_tokens=MAX_GEN)
        for q, _ in QUESTIONS
    ]
    answers = [[s["resps"][0][0] for s in samples] for samples in (served, local)]
    assert answers[0] == answers[1] == want
    assert all(a for a in want)  # real answers, not empty strings that agree by default
    # what each backend was given: the messages, and the export's template rendered by transformers
    for (q, _), s_served, s_local in zip(QUESTIONS, served, local):
        messages = [{"role": "user", "content": q}]
        assert json.loads(s_served["arguments"][0][0][0]) == messages  # the server templates them itself
        assert s_local["arguments"][0][0] == tok.chat_template.render(messages, add_generation_prompt=True)
