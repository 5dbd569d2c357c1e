"""Collectives written for NCCL run on gloo in a re-run (grader.rerun.rank.collectives.flat_for_gloo).

all_gather_into_tensor's output and reduce_scatter_tensor's input may be the shards stacked,
[world_size, *shard], as torch's documentation writes them and NCCL takes them; gloo refuses that
form. Here a real 2-rank gloo world, the dispatcher's collectives routed as a rank's are, takes both.
"""


import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, store_path: str, results: dict) -> None:
    from grader.rerun.rank import collectives
    collectives.route()
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        shard = torch.full((3, 2), float(rank + 1))
        gathered = torch.empty(2, 3, 2)
        dist.all_gather_into_tensor(gathered, shard)
        whole = torch.arange(12, dtype=torch.float32).reshape(2, 3, 2) * (rank + 1)
        mine = torch.empty(3, 2)
        dist.reduce_scatter_tensor(mine, whole)
        results[rank] = (gathered.clone(), mine.clone())
    finally:
        dist.destroy_process_group()


def test_stacked_gathers_and_reduce_scatters_run_on_gloo(tmp_path):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_rank, args=(str(tmp_path / "store"), results), nprocs=2, start_method="fork")
        got = dict(results)
    whole = torch.arange(12, dtype=torch.float32).reshape(2, 3, 2)
    for rank in range(2):
        gathered, mine = got[rank]
        assert torch.equal(gathered, torch.stack([torch.full((3, 2), 1.0), torch.full((3, 2), 2.0)]))
        assert torch.equal(mine, whole[rank] * 3)   # the sum of rank 0's (the values) and rank 1's (twice them)


def test_a_form_gloo_takes_is_left_as_it_is():
    from grader.rerun.rank.collectives import flat_for_gloo
    flat, shard = torch.empty(6, 2), torch.empty(3, 2)
    assert flat_for_gloo("_allgather_base_", (flat, shard, None))[0] is flat
    stacked = torch.empty(2, 3, 2)
    viewed = flat_for_gloo("_allgather_base_", (stacked, shard, None))
    assert viewed[0].shape == (12,) and viewed[1].shape == (6,) and viewed[0].data_ptr() == stacked.data_ptr()
    assert flat_for_gloo("_reduce_scatter_base_", (shard, stacked, None))[1].shape == (12,)
