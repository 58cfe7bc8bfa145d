"""Lightning data modules as users write them run unchanged, and nothing about their data is
changed silently: a weighted sampler keeps its weighting, a streaming IterableDataset is shared
out over the ranks with every sample trained once (one that splits itself by rank is kept as
written, not cut again), and the driver says once how each resumes."""

from __future__ import annotations

import pytest
from cli_runs import run_spec
from elastic_jobs import committed_ids

pytestmark = pytest.mark.slow


def lightning_job(name, tmp_path, data_class, samples, **trainer):
    records = tmp_path / f"records-{name}"
    records.mkdir()
    spec = {
        "name": name, "storage": str(tmp_path / "runs"), "seed": 0,
        "lightning": {
            "model": {"class_path": "elastic_jobs.IdsModule", "init_args": {"records": str(records)}},
            "data": {"class_path": data_class, "init_args": {"samples": samples, "batch_size": 4}},
            "trainer": {"max_epochs": 1, **trainer},
        },
        "scaling": {"num_workers": 2},
        "checkpoint": {"every_n_steps": 4},
    }
    return spec, records


@pytest.mark.timeout(300)
def test_a_weighted_sampler_keeps_its_weighting_and_the_progress_bar_and_model_summary_can_be_on(tmp_path):
    spec, records = lightning_job("weighted", tmp_path, "lightning_data_jobs.EvenIdsData", 64,
                                  enable_progress_bar=True, enable_model_summary=True)
    lines = []
    result = run_spec(spec, str(tmp_path), lines=lines)
    assert result.status == "finished"
    trained = committed_ids(str(records))[0]
    assert len(trained) == 64, "64 draws, shared out over the two ranks"
    assert all(i % 2 == 0 for i in trained), "the sampler's weighting (odd ids never drawn) was lost"
    said = [line for line in lines if "its own sampler (WeightedRandomSampler)" in line]
    assert len(said) == 1, lines


@pytest.mark.timeout(300)
def test_a_streaming_iterable_dataset_is_shared_out_over_the_ranks_with_each_sample_once_unless_split_by_rank(
        tmp_path):
    # Epoch 0 streams the same 53 samples on both ranks: 26 pairs, the last sample (an incomplete
    # pair) left out, so both ranks run the same number of steps. Epoch 1 streams them split by
    # rank already (torch.distributed.get_rank() in its __iter__): kept as written, all 53 trained
    # (27 and 26 samples: 7 batches of up to 4 on each rank; cut again, 13 on each).
    # Mixed precision on CPU too: bf16-mixed is what torch supports there.
    spec, records = lightning_job("stream", tmp_path, "lightning_data_jobs.StreamThenRankStreamData", 53,
                                  precision="bf16-mixed", max_epochs=2, reload_dataloaders_every_n_epochs=1)
    lines = []
    result = run_spec(spec, str(tmp_path), lines=lines)
    assert result.status == "finished", result.error
    epochs = committed_ids(str(records))
    assert sorted(epochs[0]) == list(range(52))
    assert sorted(epochs[1]) == list(range(53)), "a stream split by rank was cut a second time"
    assert len([line for line in lines if "reads an IterableDataset (Stream), the same stream" in line]) == 1, lines
    assert len([line for line in lines if "IterableDataset (RankStream) that is already split by rank" in line]) == 1
