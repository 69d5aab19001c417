"""Sharded training (train.parallel=fsdp): FSDP2 over the model, and the checkpoint that goes with it.

DDP keeps a whole copy of the weights, gradients and AdamW state in every process. FSDP2
(`fully_shard`) keeps 1/world of each: a block's weights are all-gathered just before it runs and
freed after it, and its gradients are reduce-scattered back to the shards, so only one block is
whole at a time. One process (no torchrun, or torchrun with one) trains unsharded, exactly as ddp
does, but writes the same checkpoint, so a run can move between one process and many.

The checkpoint in the run directory:

    sharded-<step>/     the model and AdamW state in Distributed Checkpoint (DCP) format: each
                        process writes its own shards (__<rank>_0.distcp), rank 0 the .metadata
    state.pt            the commit point: step, RNG streams, counters, AdamW's settings, and the
                        name of the sharded folder that belongs to them
    model.safetensors   the full weights, gathered to rank 0 after the commit, for every reader

Every process writes into a fresh .sharded-<step>.<random>.tmp/ that rank 0 made (mkdtemp: no link
planted at a predictable name can redirect the shards); once all have written, rank 0 renames it,
commits state.pt naming it, writes model.safetensors, and deletes the older folders. A kill at any moment
leaves the last state.pt and the folder it names; resume rewrites model.safetensors if it is of
another step. DCP reshards on load, so a run resumes on any number of processes.

Only tensors go into DCP (AdamW's settings go into state.pt), and DCP's .metadata (a pickle) is
read by an unpickler that builds nothing but DCP's metadata classes: resuming unpickles no code.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ..errors import MinitfError, first_line
from ..model import Transformer
from ..system.files import current_umask, refuse_symlink
from . import checkpoint as ckpt

SHARDED = re.compile(r"sharded-\d{8}")


def shard(model: Transformer, device: torch.device, dtype: torch.dtype) -> None:
    """fully_shard each block, then the root, over all processes (in place).

    The root group takes what is left: embeddings, positions, the final norm and the head. A
    weight shared by two modules must live in one group, and the tied head's weight is the
    embedding's, so both stay in the root. On CUDA in bfloat16 the gathered weights are bfloat16
    and gradients are reduced in float32; the shards that AdamW updates stay float32.
    """
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    bf16 = device.type == "cuda" and dtype == torch.bfloat16
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (a grad norm over all shards, say) as an ordinary tensor; others as they are."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's shard of a DTensor parameter; an ordinary tensor as it is."""
    return t.to_local() if isinstance(t, DTensor) else t


def micro_batch(model: nn.Module, raw_model: nn.Module, sync: bool):
    """The context of one micro-batch's forward: gradients are communicated only when sync.

    sync is set on the last micro-batch of a step. DDP: no_sync() skips its all-reduce. FSDP: the
    flag, read in backward, skips the reduce-scatter, so each process sums its micro-batches'
    gradients at full size and the last one reduce-scatters the sum (communication once per step,
    as DDP).
    """
    if is_sharded(raw_model):
        raw_model.set_requires_gradient_sync(sync)
        return _quiet_view_warning()
    return contextlib.nullcontext() if sync else model.no_sync()


@contextlib.contextmanager
def _quiet_view_warning():
    # FSDP warns that the root returns a view (the logits, cut to vocab_size): an in-place op on it
    # would skip a hook. Nothing modifies the logits in place, so the warning only misleads users.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        yield


@contextlib.contextmanager
def _one_process_quietly():
    # without torchrun DCP warns, at every save and load, that it assumes a single process: it is one
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def rank0_value(x: float, device: torch.device) -> float:
    """Rank 0's x on every process: for a decision all must take together (a collective follows)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return x
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.broadcast(t, 0)
    return t.item()


def save_full_weights(model: nn.Module, path: Path, step: int, tokenizer_hash: str, main: bool) -> None:
    """Full weights as safetensors, written by rank 0; sharded, every process must call it.

    The shards are gathered to rank 0's CPU, then put into a Transformer on the meta device (no
    memory, no init) to be saved exactly as an unsharded model is (the tied head once).
    """
    if not is_sharded(model):
        if main:
            ckpt.save_weights(model, path, step, tokenizer_hash)
        return
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not main:
        return
    with torch.device("meta"):
        whole = Transformer(model.config)
    # a tensor gathered from uneven shards is a view into a padded buffer; safetensors wants its own
    whole.load_state_dict({k: v if _compact(v) else v.clone() for k, v in full.items()}, assign=True)
    if model.config.tie_embeddings:  # assign gave the head its own copy of the embedding
        whole.lm_head.weight = whole.wte.weight
    ckpt.save_weights(whole, path, step, tokenizer_hash)


def save_sharded(run_dir: Path, model: nn.Module, optimizer, state: dict, step: int, main: bool) -> None:
    """Commit a checkpoint at `step`; every process calls it (see the module docstring)."""
    name = f"sharded-{step:08d}"
    final = run_dir / name
    refuse_symlink(final)  # the rename below would fail on it, or the cleanup below follow it
    tmp = _fresh_dir(run_dir, name, main)
    optim = get_optimizer_state_dict(model, optimizer)
    try:
        with _one_process_quietly():
            dcp.save(
                {"model": get_model_state_dict(model), "optimizer": optim["state"]},
                checkpoint_id=tmp,
                no_dist=not dist.is_initialized(),
            )
    except (dcp.CheckpointException, OSError) as e:
        raise MinitfError(
            f"could not write {tmp}: {_dcp_first_line(e)}; the last committed checkpoint is intact"
        ) from None
    if main:
        shutil.rmtree(final, ignore_errors=True)  # complete but never committed: a kill came before state.pt
        os.replace(tmp, final)
        ckpt.write_state(run_dir, {**state, "sharded": name, "optimizer_groups": optim["param_groups"]}, step)
    save_full_weights(model, run_dir / ckpt.WEIGHTS, step, state["tokenizer"], main)
    if main:
        for old in run_dir.glob("*sharded-*"):
            if old.name != name and (SHARDED.fullmatch(old.name) or old.name.endswith(".tmp")):
                shutil.rmtree(old, ignore_errors=True)


def _fresh_dir(run_dir: Path, name: str, main: bool) -> Path:
    """A new, empty folder for one save, .<name>.<random>.tmp, made by rank 0 and named to every process.

    mkdtemp creates it (it cannot exist before), so a link planted at a predictable name never
    receives the shards; a folder left by a killed save is deleted by the next commit.
    """
    made = [None]
    if main:
        try:
            made[0] = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=run_dir)
            os.chmod(made[0], 0o777 & ~current_umask())  # mkdtemp's 0700, as any other folder of the run would be
        except OSError as e:
            raise MinitfError(
                f"could not write {run_dir / name}: {e.strerror or e}; the last committed checkpoint is intact"
            ) from None
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(made, src=0)  # also the barrier: no process writes before it exists
    return Path(made[0])


def load_sharded(run_dir: Path, model: nn.Module, optimizer, log, main: bool) -> dict:
    """Load the last committed checkpoint into model and optimizer (sharded or not, on any number
    of processes); returns state.pt's dict. Every process calls it."""
    state = ckpt.read_state(run_dir, needs="sharded")
    folder = run_dir / str(state["sharded"])
    if not SHARDED.fullmatch(str(state["sharded"])) or not (folder / ".metadata").is_file():
        raise MinitfError(
            f"{run_dir / ckpt.STATE} names {folder.name}, which is missing or incomplete; "
            f"the checkpoint is damaged, start a new run.out_dir"
        )
    optim = get_optimizer_state_dict(model, optimizer)  # AdamW's state made (zeros) for DCP to fill
    target = {"model": get_model_state_dict(model), "optimizer": optim["state"]}
    try:
        _MetadataReader(folder).read_metadata()  # first on its own: DCP would log a traceback, then retry
        with _one_process_quietly():
            dcp.load(target, storage_reader=_MetadataReader(folder), no_dist=not dist.is_initialized())
        set_model_state_dict(model, target["model"])
        set_optimizer_state_dict(
            model, optimizer, {"state": target["optimizer"], "param_groups": state["optimizer_groups"]}
        )
    except (dcp.CheckpointException, OSError, RuntimeError, KeyError, ValueError, pickle.UnpicklingError) as e:
        raise MinitfError(
            f"{folder} does not load ({_dcp_first_line(e)}); the checkpoint is damaged or not this "
            f"run's, start a new run.out_dir"
        ) from None
    _refuse_non_finite_shards(model, folder)
    found = ckpt.weights_step(run_dir / ckpt.WEIGHTS)
    if rank0_value(float(found != state["step"]), _device_of(model)):
        log(f"repairing {run_dir / ckpt.WEIGHTS}: it holds step {found}, the committed checkpoint step {state['step']}")
        save_full_weights(model, run_dir / ckpt.WEIGHTS, state["step"], state.get("tokenizer"), main)
    return state


def _refuse_non_finite_shards(model: nn.Module, folder: Path) -> None:
    """ckpt.refuse_non_finite over the loaded weights, on every process together.

    Each checks its own shards, and all raise if any found a NaN or infinity: one raising alone
    would leave the others waiting in the next collective.
    """
    try:
        ckpt.refuse_non_finite(((n, local(p)) for n, p in model.named_parameters()), folder, ckpt.DIVERGED_STATE)
        error = None
    except MinitfError as e:
        error = e
    if dist.is_initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([float(error is not None)], device=_device_of(model))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and error is None:
            error = MinitfError(f"{folder}: another process's shard holds NaN/inf values; {ckpt.DIVERGED_STATE}")
    if error is not None:
        raise error


def _compact(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _dcp_first_line(e: BaseException) -> str:
    """first_line of a DCP error, or of the first rank's exception inside a CheckpointException."""
    if isinstance(e, dcp.CheckpointException) and e.failures:  # {rank: (exception, traceback)}
        e = next(iter(e.failures.values()))[0]
    return first_line(e, 160)


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata records, torch shapes, dtypes and layouts, and paths; nothing else
    (not BytesStorageMetadata: minitf stores no pickled objects, and DCP would unpickle those)."""

    ALLOWED = {
        "torch.distributed.checkpoint.metadata": {
            "Metadata",
            "TensorStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        },
        "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
        "torch.serialization": {"_get_layout"},
        "torch": {"Size"},
        "collections": {"OrderedDict"},
        "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    }

    def find_class(self, module: str, name: str):
        if name in self.ALLOWED.get(module, ()) or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the metadata holds {module}.{name}, which is not a DCP record")


class _MetadataReader(dcp.FileSystemReader):
    """DCP's file reader, with .metadata read by _MetadataUnpickler (tensors are read weights_only)."""

    def read_metadata(self, *args, **kwargs):
        rank = kwargs.get("rank")
        with open(Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata"), "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
