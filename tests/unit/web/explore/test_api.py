"""minitf.web.explore.api (the Explorer, no server): it names the budget that ends a run and refuses
weights holding NaN."""

import pytest

from minitf.config import TrainConfig
from minitf.errors import MinitfError
from minitf.web.explore import api as explore_api

# Nothing broken that minitf reads is used silently: weights holding NaN or infinity are refused
# wherever a run is loaded (generate, evaluate, both exports, the explorer, resume, the sharded
# checkpoint), a run.init_from directory that does not describe one complete model is refused in
# one line naming what is wrong (never random layers), and a resume without the run's tokenizer
# says what is missing.


def test_the_explorer_refuses_to_serve_it(nan_run):
    from minitf.web.explore import Explorer

    with pytest.raises(MinitfError, match=r"model.safetensors: tensor blocks.0.attn.c_attn.weight holds NaN"):
        Explorer(nan_run)


# What training prints is right: the commands it suggests run as printed, the LR schedule it
# follows reaches its peak and floor on any machine speed, and its notes compare with the budget.


def test_the_explorer_names_the_budget_that_ends_the_run():
    assert explore_api.budget_words(TrainConfig()) == "210 s budget"
    assert explore_api.budget_words(TrainConfig(max_seconds=60)) == "60 s budget"
    assert explore_api.budget_words(TrainConfig(max_steps=200)) == "210 s or 200 steps budget"
    assert explore_api.budget_words(TrainConfig(max_seconds=None, max_steps=2000)) == "2000 steps"
