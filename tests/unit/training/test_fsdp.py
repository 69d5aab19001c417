"""minitf.training.fsdp: a DTensor (a grad norm over all shards, say) read as an ordinary tensor
holds the whole value; an ordinary tensor passes as it is. In one process: a world of one."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from minitf.training import fsdp


@pytest.fixture
def mesh_of_one(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_full_tensor_gathers_a_dtensor_and_passes_a_tensor(mesh_of_one):
    sharded = distribute_tensor(torch.arange(6.0).reshape(3, 2), mesh_of_one, [Shard(0)])
    whole = fsdp.full_tensor(sharded)
    assert isinstance(sharded, DTensor) and type(whole) is torch.Tensor
    assert whole.tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    norm = torch.tensor(2.5)
    assert fsdp.full_tensor(norm) is norm
