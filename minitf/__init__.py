"""minitf: a minimal, trainable transformer framework.

cfg = minitf.load_config(overrides=["model.n_layer=2"])   # the default recipe; or a recipe by name: "tiny"
minitf.train(cfg)
model, tok, cfg = minitf.load_run("runs/shakespeare")
print(minitf.generate(model, tok, "Romeo.\\n", max_new_tokens=100))
model, tok, cfg = minitf.load_run("runs/chat")             # after minitf train --config chat
print(minitf.chat(model, tok, [{"role": "user", "content": "What is 17 plus 25?"}], temperature=0))
steps = minitf.inspect(model, tok, "Romeo. O")     # Q, K, V, scores, weights of every head
minitf.interpret.head_scores(model, minitf.interpret.repeated_tokens(tok.vocab_size, 50))  # induction heads, ...
"""

# isort: off
from .cli import start as _start  # noqa: F401  first: Ctrl-C while the minitf command imports the rest is one line

# isort: on
from . import attention, interpret
from .config import Config, DataConfig, ModelConfig, RunConfig, SampleConfig, TrainConfig, load_config
from .conversations.answer import chat, chat_stream
from .errors import ConfigError, MinitfError
from .generate import generate, sample_next_token, stream, stream_tokens
from .inspection import inspect
from .kv_cache import KVCache
from .model import Transformer
from .run_dir import load_run
from .tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "Config",
    "ConfigError",
    "DataConfig",
    "KVCache",
    "MinitfError",
    "ModelConfig",
    "RunConfig",
    "SampleConfig",
    "TrainConfig",
    "Tokenizer",
    "Transformer",
    "attention",
    "chat",
    "chat_stream",
    "generate",
    "inspect",
    "interpret",
    "load_config",
    "load_run",
    "sample_next_token",
    "stream",
    "stream_tokens",
    "train",
]


def train(cfg, resume: bool = False, log=print, plot: bool = True, overrides=()):
    """Train per cfg (a Config, or with resume=True a run directory) and return the run directory
    (see minitf.trainer.train); plot=True redraws the run's loss.png after each evaluation."""
    from .plots.figures import plot_loss  # imported on use: sampling never pays for the training stack
    from .trainer import train as _train

    return _train(cfg, resume=resume, log=log, on_eval=plot_loss if plot else None, overrides=overrides)
