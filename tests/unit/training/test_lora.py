"""LoRA under a 16-bit autocast stores the frozen linear weights in that dtype: the step computes
exactly what it would with them in float32 (autocast reads them in 16 bits anyway), in half the
memory, and the merged weights the run's readers get are float32, or the dtype the run writes
its weights in (run.weights_dtype: a bfloat16 download's fine-tune writes bfloat16)."""

import copy

import pytest
import torch

import minitf
from minitf.config import ModelConfig, TrainConfig
from minitf.model import Transformer
from minitf.training import lora

pytest.importorskip("peft", reason="LoRA needs the lora extra: pip install -e '.[lora]'")


def test_frozen_weights_in_bfloat16_change_nothing_under_autocast():
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=96,
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        n_embd=32,
        block_size=16,
        positions="rope",
        norm="rmsnorm",
        ffn="swiglu",
        bias=False,
        qk_norm=True,
    )
    tc = TrainConfig(optimizer="adamw", lora_rank=4, lora_alpha=8.0)
    base = Transformer(cfg)
    wide = lora.adapt(copy.deepcopy(base), tc, log=str, dtype=torch.float32)
    narrow = lora.adapt(copy.deepcopy(base), tc, log=str, dtype=torch.bfloat16)
    with torch.no_grad():  # the same adapters in both, doing something (B starts at zero)
        for (name, a), (_, b) in zip(wide.named_parameters(), narrow.named_parameters()):
            if "lora_B" in name:
                a.normal_(0, 0.1)
            if "lora_" in name:
                b.copy_(a)
    stored = {p.dtype for n, p in narrow.named_parameters() if ".base_layer." in n}
    assert stored == {torch.bfloat16}
    x, y = torch.randint(96, (2, 16)), torch.randint(96, (2, 16))
    losses = []
    for model in (wide, narrow):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model(x)
            _, loss = model(x, y, logits=False)
        loss.backward()
        losses.append((logits, loss, [p.grad for n, p in model.named_parameters() if p.requires_grad]))
    (la, sa, ga), (lb, sb, gb) = losses
    assert torch.equal(la, lb) and torch.equal(sa, sb)
    assert all(torch.equal(a, b) for a, b in zip(ga, gb))
    merged = lora.merged_state_dict(narrow)
    assert {v.dtype for v in merged.values()} == {torch.float32}
    # in the base's bfloat16 (run.weights_dtype): each W + (alpha / r) B A summed in float32, rounded once
    half = lora.merged_state_dict(narrow, torch.bfloat16)
    assert {v.dtype for v in half.values()} == {torch.bfloat16} and half.keys() == merged.keys()
    assert all(torch.equal(half[k], merged[k].bfloat16()) for k in merged)
    assert half["blocks.0.attn.c_attn.weight"].data_ptr() != narrow.blocks[0].attn.c_attn.base_layer.weight.data_ptr()
    whole = lora.merged_model(narrow, torch.bfloat16)
    assert {p.dtype for p in whole.parameters()} == {torch.bfloat16}


def test_a_full_fine_tunes_weights_are_cast_without_peft_and_shared_where_they_already_are():
    """merged_model of a model no adapter touched: itself where its weights are in the dtype asked,
    a cast copy where not (a full fine-tune of a bfloat16 download writes bfloat16 files)."""
    model = Transformer(ModelConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=32, block_size=16))
    assert lora.merged_model(model, torch.float32) is model
    half = lora.merged_model(model, torch.bfloat16)
    assert half.lm_head.weight is half.wte.weight and half.wte.weight.dtype == torch.bfloat16
    assert torch.equal(half.blocks[0].mlp.c_fc.weight, model.blocks[0].mlp.c_fc.weight.bfloat16())


def test_merged_model_is_a_transformer_holding_w_plus_alpha_over_r_b_a():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=16, positions="learned")
    base = Transformer(cfg)
    tc = TrainConfig(optimizer="adamw", lora_rank=4, lora_alpha=8.0)
    adapted = lora.adapt(copy.deepcopy(base), tc, log=str, dtype=torch.float32)
    assert lora.merged_model(base) is base  # nothing to merge: the model itself
    with torch.no_grad():  # B starts at zero, which would merge to W itself: random adapters
        for name, p in adapted.named_parameters():
            if ".lora_" in name:
                p.normal_(0, 0.1)
    merged = lora.merged_model(adapted)
    assert type(merged) is Transformer and not lora.is_adapted(merged)
    layer = adapted.blocks[1].attn.c_attn
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight  # (4, 32), (96, 4)
    expected = base.blocks[1].attn.c_attn.weight + (8.0 / 4) * b @ a
    assert torch.allclose(merged.blocks[1].attn.c_attn.weight, expected, atol=1e-6)
    assert merged.lm_head.weight is merged.wte.weight  # tied again, as a Transformer of this config is
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        assert torch.allclose(merged.eval()(idx)[0], adapted.eval()(idx)[0], atol=1e-5)


@pytest.mark.parametrize("positions", ["rope", "sinusoidal"])
def test_merged_model_runs_with_position_tables(positions):
    """rope's and sinusoidal's tables are buffers no state dict holds: the merged model has them too."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=32, block_size=16, positions=positions)
    tc = TrainConfig(optimizer="adamw", lora_rank=4, lora_alpha=8.0)
    adapted = lora.adapt(Transformer(cfg), tc, log=str, dtype=torch.float32)
    merged = lora.merged_model(adapted)
    assert not any(b.is_meta for b in merged.buffers())
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        assert torch.allclose(merged.eval()(idx)[0], adapted.eval()(idx)[0], atol=1e-5)


def test_a_rank_above_a_layers_width_is_refused_before_any_adapter_is_made():
    pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install -e '.[lora]')")
    model = minitf.Transformer(minitf.ModelConfig(vocab_size=100, n_embd=64, n_head=4, n_layer=1, block_size=16))
    tc = minitf.load_config(None, ["train.lora_rank=1000000"]).train  # 6.8 GB and growing, before
    with pytest.raises(minitf.MinitfError, match="train.lora_rank=1000000 is above the narrowest adapted layer's 64"):
        lora.adapt(model, tc, log=lambda *a: None)
    assert not lora.is_adapted(model)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_chat_templates_new_rows_train_and_every_other_row_stays_bit_for_bit(tmp_path, tied):
    """Under LoRA the rows of the template's new tokens learn, in the embedding and the head (the
    same rows when tied), through AdamW with weight decay; every other row is the base's, bit for
    bit, and the saved file holds the trained rows, its head the embedding itself when tied."""
    from safetensors.torch import load_file

    from minitf.optim import make_optimizer
    from minitf.run_dir import load_weights
    from minitf.training.checkpoint import save_weights

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=66, n_layer=1, n_head=2, n_embd=32, block_size=16, tie_embeddings=tied)
    base = Transformer(cfg)
    if not tied:  # an untied head starts at zero: a trained one has rows of its own
        with torch.no_grad():
            base.lm_head.weight[:66].normal_(0, 0.02)
    new = [64, 65]  # ChatML's two markers, after a 64-token vocabulary
    tc = TrainConfig(optimizer="adamw", lora_rank=4, lora_alpha=8.0, lr=1e-2, weight_decay=0.1)
    lines = []
    model = lora.adapt(copy.deepcopy(base), tc, log=lines.append, tokens=new)
    assert "and the rows of tokens 64, 65" in lines[0], lines
    optimizer = make_optimizer(model, tc, torch.device("cpu"))
    for _ in range(3):  # conversations: 64 read (its embedding row learns), 65 predicted (its head row learns)
        x, y = torch.randint(0, 64, (4, 16)), torch.full((4, 16), 65)
        x[:, ::4] = torch.tensor(new).repeat(2)  # both new tokens read
        _, loss = model(x, y, logits=False)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    save_weights(model, tmp_path / "model.safetensors", step=3)
    plain = Transformer(cfg)
    load_weights(plain, tmp_path / "model.safetensors")  # as every reader of the run does
    for name in ("wte", "lm_head"):
        before, after = getattr(base, name).weight, getattr(plain, name).weight
        assert not torch.equal(after[64], before[64]) and not torch.equal(after[65], before[65]), name
        assert torch.equal(after[:64], before[:64]) and torch.equal(after[66:], before[66:]), name
    if tied:  # the file holds the matrix once; the model read from it has its head tied to it again
        assert list(load_file(tmp_path / "model.safetensors")).count("lm_head.weight") == 1
        assert "wte.weight" not in load_file(tmp_path / "model.safetensors")
        assert plain.lm_head.weight is plain.wte.weight
    frozen = model.wte.parametrizations.weight.original
    assert torch.equal(frozen, base.wte.weight) and not frozen.requires_grad  # the frozen matrix itself untouched


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_lora_on_the_lm_head_is_refused_in_one_line(tied):
    """Tied, the head's adapter could be saved in no file apart from the embedding; untied, the
    fused loss reads the head's matrix past the adapter, which would never train."""
    model = Transformer(ModelConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=32, block_size=16, tie_embeddings=tied))
    tc = TrainConfig(optimizer="adamw", lora_rank=4, lora_targets="c_attn,lm_head")
    with pytest.raises(minitf.MinitfError) as e:
        lora.adapt(model, tc, log=str)
    message = str(e.value)
    assert message.startswith("train.lora_targets='c_attn,lm_head' names lm_head, ") and "\n" not in message
    assert "remove lm_head" in message
    assert ("model.tie_embeddings=true" in message) == tied
    assert not lora.is_adapted(model)
