"""minitf against TRL + peft: LoRA fine-tuning of a downloaded model's shape, peak memory and tokens/s.

    python -m bench.trl                                    # Qwen3-0.6B's and Llama-3.2-1B's shapes
    python -m bench.trl --shapes tiny --steps 2 --rounds 1 --out trl.json   # a smoke run
    python -m bench.trl --full --shapes qwen3-0.6b                          # full fine-tuning, no adapters
    python -m bench.trl --full --shapes llama-3.2-1b --sides minitf-bf16,trl   # only these sides

The model: a Hugging Face directory of the family's real shape (every layer, the real vocabulary),
random weights saved in bfloat16 as the hub holds them, with a tokenizer of that many tokens and the
family's own chat template (tests/data/chat_templates.json), built once into --work. Each side
fine-tunes it on the same conversation (one conversation repeated, so both see the same tokens in
every row, with no padding) for `steps` optimizer steps of `batch` rows in bfloat16, with LoRA rank
16, alpha 32 on every linear layer of the blocks, from a fresh process:

- minitf: `minitf train --config chat` (its command's own process set-up), run.init_from=the
  directory, train.lora_rank=16, its defaults otherwise (activation checkpointing is on by itself
  at this size), and the merged weights written at the end, as every minitf run writes them;
- TRL: `SFTTrainer` with `SFTConfig`'s defaults (bfloat16, gradient checkpointing) on the model
  loaded in bfloat16 and a peft `LoraConfig`, the adapters saved at the end (`save_model`, "trl"),
  or the model merged in place and saved (`merge_and_unload().save_pretrained`, "trl-merged"),
  which is what minitf's run directory holds.

With --full, both sides fine-tune every weight instead (minitf train.lora_rank=0; TRL with no
peft_config, saving the model), and "trl-merged" is left out (there is nothing to merge). minitf
runs three times there: with its float32 weights ("minitf"), with them held in bfloat16 as TRL's are
("minitf-bf16", train.param_dtype=bfloat16), and so with each weight updated as backward finishes
its gradient ("minitf-bf16-in-backward", train.optimizer_in_backward=true with train.grad_clip=0,
as that mode cannot clip; TRL and the other sides clip at 1.0).

Peak memory is the process's peak resident set (VmHWM, loading included), each side with the
allocator settings its command makes (`minitf train` keeps freed memory for a model it trained
itself, not for a download; TRL none). tokens/s
is the conversation's tokens times the rows of a step, over the median step after the first two
(the first builds the optimizer's state).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.memory import _vm

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # every linear layer
RANK, ALPHA = 16, 32.0
SIDES = ("minitf", "trl", "trl-merged")  # TRL saving its adapters (its default), or the merged model as minitf does
# minitf's float32 weights, or bfloat16 ones (train.param_dtype), also updated during backward (no clipping)
FULL_SIDES = ("minitf", "minitf-bf16", "minitf-bf16-in-backward", "trl")
LLAMA3 = dict(
    rope_type="llama3",
    factor=32.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
    rope_theta=500000.0,
)
# (transformers architecture, its config.json as published, the chat template's name)
SHAPES = {
    "qwen3-0.6b": (
        "Qwen3",
        dict(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=40960,
        ),
        "qwen3",
    ),
    "llama-3.2-1b": (
        "Llama",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            max_position_embeddings=131072,
            rope_scaling=LLAMA3,
        ),
        "llama3.2",
    ),
    "tiny": (
        "Qwen3",
        dict(
            vocab_size=2048,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            tie_word_embeddings=True,
            max_position_embeddings=512,
        ),
        "qwen3",
    ),
}
WORDS = "the quick brown fox jumps over lazy dogs while seven wise kings sing of rain and bread".split()


def tokenizer_of(size: int, specials: list[str]):
    """A byte-level BPE of exactly `size` tokens, the last ones `specials`: the 256 byte symbols,
    then every word of lowercase letters (with and without a leading space) up to the size, each one
    merge of a shorter word and a letter, as a downloaded model's vocabulary holds words."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges, queue, letters = [], list("abcdefghijklmnopqrstuvwxyz") + ["Ġ"], "abcdefghijklmnopqrstuvwxyz"
    want = size - len(specials)
    i = 0
    while len(vocab) < want:
        word, i = queue[i], i + 1
        for letter in letters:
            if len(vocab) >= want:
                break
            if word + letter not in vocab:
                vocab[word + letter] = len(vocab)
                merges.append((word, letter))
                queue.append(word + letter)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    assert tok.get_vocab_size() == size, tok.get_vocab_size()
    return tok


def prepare(shape: str, work: Path) -> Path:
    """The model directory of `shape` in work (built once) and a conversations file beside it."""
    import torch
    import transformers

    out = work / shape
    if (out / "chats.jsonl").exists():
        return out
    arch, config, template = SHAPES[shape]
    spec = json.loads((ROOT / "tests" / "data" / "chat_templates.json").read_text(encoding="utf-8"))[template]
    specials = [t for t in spec["added_tokens"] if t not in ("<|endoftext|>",)] + ["<|endoftext|>"]
    tok = tokenizer_of(config["vocab_size"], specials)
    eot = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{arch}Config")(**config, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot)
    model = getattr(transformers, f"{arch}ForCausalLM")(cfg).to(torch.bfloat16)
    model.save_pretrained(out)  # bfloat16 safetensors, as the hub holds these models
    tok.save(str(out / "tokenizer.json"))
    keys = {k: spec[k] for k in ("chat_template", "bos_token", "eos_token") if spec.get(k)}
    keys.update(tokenizer_class="PreTrainedTokenizerFast", pad_token="<|endoftext|>", model_max_length=4096)
    (out / "tokenizer_config.json").write_text(json.dumps(keys))
    said = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(24))
    talk = {
        "messages": [
            {"role": "system", "content": "You answer in plain words."},
            {"role": "user", "content": "Tell me of " + said},
            {"role": "assistant", "content": "Of " + said},
            {"role": "user", "content": "And then?"},
            {"role": "assistant", "content": "Then " + said},
        ]
    }
    (out / "chats.jsonl").write_text((json.dumps(talk) + "\n") * 64)
    return out


def conversation_tokens(model_dir: Path) -> int:
    """The tokens of the conversation as both sides write it: the template rendered by transformers."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    talk = json.loads((model_dir / "chats.jsonl").read_text().splitlines()[0])
    return len(tok.apply_chat_template(talk["messages"], tokenize=True, return_dict=False))


def _minitf(model_dir: Path, batch: int, steps: int, out: Path, rank: int, side: str) -> list[float]:
    from minitf.cli.train import main

    main(
        [
            "--config",
            "chat",
            f"run.out_dir={out}",
            f"run.init_from={model_dir}",
            f"data.source=file:{model_dir / 'chats.jsonl'}",
            f"train.lora_rank={rank}",
            *([f"train.lora_alpha={ALPHA}"] if rank else []),
            f"train.batch_size={batch}",
            "train.grad_accum=1",
            f"train.max_steps={steps}",
            "train.max_seconds=null",
            f"train.eval_every={steps + 1}",
            "train.eval_metric=null",
            "train.eval_batches=1",
            "train.log_every=1",
            "train.dtype=bfloat16",
            *(["train.param_dtype=bfloat16"] if side.startswith("minitf-bf16") else []),
            *(["train.optimizer_in_backward=true", "train.grad_clip=0"] if side.endswith("in-backward") else []),
            "data.val_fraction=0",
        ]
    )
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    elapsed = [r["elapsed_s"] for r in rows if "elapsed_s" in r]
    return [b - a for a, b in zip(elapsed, elapsed[1:])]


def _trl(model_dir: Path, batch: int, steps: int, out: Path, rank: int, merged: bool = False) -> list[float]:
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    ends = []

    class Timer(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    data = load_dataset("json", data_files=str(model_dir / "chats.jsonl"), split="train")
    args = SFTConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    lora = LoraConfig(r=rank, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM") if rank else None
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=data, processing_class=tok, peft_config=lora, callbacks=[Timer()]
    )
    trainer.train()
    if merged:  # a model any reader loads, as minitf's run directory holds: peft merges in place
        trainer.model.merge_and_unload().save_pretrained(str(out / "merged"))
    else:  # the adapters, or with no LoRA the whole model
        trainer.save_model(str(out / "saved"))
    return [b - a for a, b in zip(ends, ends[1:])]


def _worker(side: str, model_dir: Path, batch: int, steps: int, rank: int) -> dict:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    before = _vm("VmRSS")
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        run = Path(tmp) / "run"
        times = (
            _minitf(model_dir, batch, steps, run, rank, side)
            if side.startswith("minitf")
            else _trl(model_dir, batch, steps, run, rank, side == "trl-merged")
        )
        wall = time.perf_counter() - t
    return {
        "side": side,
        "peak_rss_gib": _vm("VmHWM") / 2**30,
        "before_gib": before / 2**30,
        "wall_s": wall,
        "step_s": times,
    }


def measure(side: str, model_dir: Path, batch: int, steps: int, rank: int) -> dict:
    """One measurement in a fresh process (its peak is its own)."""
    cmd = [
        sys.executable,
        "-m",
        "bench.trl",
        "--worker",
        side,
        "--model-dir",
        str(model_dir),
        "--batch",
        str(batch),
        "--steps",
        str(steps),
        "--rank",
        str(rank),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{side} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="qwen3-0.6b,llama-3.2-1b")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "minitf-bench-trl")
    p.add_argument("--out", type=Path)
    p.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    p.add_argument("--sides", help="comma-separated sides to run (default: all of the mode's)")
    p.add_argument("--rank", type=int, default=RANK, help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        print(json.dumps(_worker(a.worker, a.model_dir, a.batch, a.steps, a.rank)))
        return
    rank = 0 if a.full else RANK
    sides = FULL_SIDES if a.full else SIDES
    if a.sides:
        unknown = set(a.sides.split(",")) - set(sides)
        if unknown:
            p.error(f"--sides: no side {', '.join(sorted(unknown))}; choose from {', '.join(sides)}")
        sides = tuple(s for s in sides if s in a.sides.split(","))
    results = []
    for shape in a.shapes.split(","):
        model_dir = prepare(shape, a.work)
        tokens = conversation_tokens(model_dir) * a.batch
        for r in range(a.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                m = measure(side, model_dir, a.batch, a.steps, rank)
                m.update(shape=shape, round=r, tokens_per_step=tokens)
                m["tokens_per_s"] = tokens / statistics.median(m["step_s"][1:] or m["step_s"])
                print(
                    f"{shape} {side}: peak {m['peak_rss_gib']:.2f} GiB, {m['tokens_per_s']:.1f} tokens/s, "
                    f"{m['wall_s']:.0f} s in all",
                    flush=True,
                )
                results.append(m)
    if a.out:
        a.out.write_text(json.dumps({**_setting(a), "results": results}, indent=2) + "\n")


def _setting(a) -> dict:
    """The run's settings, the machine and the versions of what was compared."""
    from importlib.metadata import version

    import torch

    from minitf.system.machine import machine

    versions = {p: version(p) for p in ("torch", "transformers", "peft", "trl")}
    return {
        "lora_rank": 0 if a.full else RANK,
        "batch": a.batch,
        "steps": a.steps,
        "rounds": a.rounds,
        "sides": a.sides.split(",") if a.sides else "all",
        "machine": machine(torch.device("cpu")),
        **versions,
    }


if __name__ == "__main__":
    main()
