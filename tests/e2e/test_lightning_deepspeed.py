"""`lightning.trainer.strategy: deepspeed` on CPU (DeepSpeed's CPU accelerator, over gloo): an
unchanged LightningModule trained with ZeRO, each rank's DeepSpeed files committed through the
store, an interrupted run that resumes bit for bit, and the resumes DeepSpeed cannot do refused
before any worker starts. The spec's translation into DeepSpeedStrategy's arguments is checked
without a cluster.

The same code runs over NCCL with scaling.use_gpu (there Lightning's own CUDA checks apply).
"""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
import yaml
from cli_runs import run_spec
from conftest import REPO, assert_resumed_to_clean_weights, run_cli, scratch_in
from specs import lightning_spec

from orchestrator.checkpoint import CheckpointStore, Manifest
from orchestrator.checkpoint.manifest import FileEntry
from orchestrator.checkpoint.serialization import dumps_state, loads_state, plain_state
from orchestrator.driver.resume import ResumeChoice, check_compatible
from orchestrator.errors import CheckpointError, SpecError
from orchestrator.spec import JobSpec, resolve_spec, validate

pytest.importorskip("deepspeed")

# Random each run; set ORCHESTRATOR_TEST_KILL_STEP to replay one. Two epochs of 10 of Lightning's
# steps (21 batches each, accumulated 2 by 2); in the second, Lightning's steps end where
# DeepSpeed is half-way through one, and a checkpoint taken there (steps 12, 15, 18 without the
# boundary check) would lose a batch's gradients: the kill falls after one of them.
KILL_STEP = int(os.environ.get("ORCHESTRATOR_TEST_KILL_STEP", random.Random().randint(13, 19)))


# DeepSpeed's names for ZeRO-3's files, 2 ranks (measured), with the store's prefix.
FILES_ZERO_3 = [f"deepspeed-{kind}_pp_rank_{rank}_mp_rank_00_{what}_states.pt" for rank in (0, 1)
                for kind, what in (("zero", "model"), ("bf16_zero", "optim"))]


def deepspeed_spec(name, storage_dir, strategy="deepspeed_stage_3", precision="bf16-mixed", **model):
    spec = lightning_spec(name, storage_dir, **model)
    spec["lightning"]["trainer"].update(strategy=strategy, precision=precision, max_epochs=2)
    return spec


def accumulating_spec(name, storage_dir, temp_dir=None, **model):
    """ZeRO-3 with the Trainer arguments Lightning writes into DeepSpeed's config; 21 batches an
    epoch, so Lightning's and DeepSpeed's accumulation boundaries part in the second epoch. With
    `temp_dir`, the workers' TMPDIR (conftest.run_temp_dir)."""
    spec = deepspeed_spec(name, storage_dir, **model)
    if temp_dir:
        spec["env"] = {"TMPDIR": temp_dir}
    spec["lightning"]["trainer"].update(accumulate_grad_batches=2, gradient_clip_val=0.5)
    spec["checkpoint"]["every_n_steps"] = 3
    return spec


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_lightning_module_trains_with_deepspeed_zero_3_and_resumes_bit_for_bit(tmp_path, run_temp_dir):
    clean = run_spec(accumulating_spec("clean", tmp_path, temp_dir=run_temp_dir), str(tmp_path))
    assert clean.status == "finished", clean.error
    # Lightning's steps: 2 x 10. DeepSpeed, which accumulates itself, carries an epoch's last
    # batch into the next epoch's first step; checkpoints are taken only where its steps end.
    assert clean.global_step == 20
    committed = CheckpointStore.for_run(clean.run_dir).committed()
    assert committed
    for info in committed:  # ZeRO-3: every rank's part of the model and of the optimizer, as DeepSpeed names them
        assert info.manifest.sharded and info.manifest.strategy == "deepspeed" and info.manifest.world_size == 2
        assert sorted(info.manifest.files) == sorted(FILES_ZERO_3), info.name

    # Killed once (rank 1, SIGKILL) and restarted by Ray Train: the same weights, bit for bit.
    # The model's hyperparameters hold a path and an enum (tests/helpers/faulty.py).
    fault = {"kill_at": KILL_STEP, "marker": str(tmp_path / "kill-marker"), "kill_rank": 1}
    killed = run_spec(accumulating_spec("killed", tmp_path, temp_dir=run_temp_dir,
                                        model_class="faulty.KilledOnceClassifier", **fault), str(tmp_path))
    assert_resumed_to_clean_weights(killed, clean, fault["marker"], KILL_STEP)
    assert not scratch_in(run_temp_dir), "a worker's scratch (DeepSpeed's placeholders) was left behind"

    # What DeepSpeed cannot resume is refused on the driver (exit 2, no worker started); a resume
    # with another strategy is refused by the same check (test below).
    spec_file = tmp_path / "clean.yaml"
    spec_file.write_text(json.dumps(accumulating_spec("clean", tmp_path)))
    tests_on_path = {"PYTHONPATH": os.path.join(REPO, "tests", "helpers")}
    resized = run_cli("run", str(spec_file), "--set", "lightning.trainer.max_epochs=3",
                      "--set", "scaling.num_workers=1", env=tests_on_path)
    assert resized.returncode == 2, resized.stderr
    assert "scaling.num_workers: 2" in resized.stderr and "Traceback" not in resized.stderr


# --- the spec's translation, on the driver -------------------------------------------------------

def _validated(tmp_path, strategy, *, precision="bf16-mixed", num_workers=2, use_gpu=False, global_batch_size=None,
               **trainer):
    spec = deepspeed_spec("t", tmp_path, strategy=strategy, precision=precision)
    spec["lightning"]["trainer"].update(trainer)
    spec["scaling"].update(num_workers=num_workers, use_gpu=use_gpu, global_batch_size=global_batch_size)
    if use_gpu:
        spec["scaling"]["resources_per_worker"] = {"CPU": 1, "GPU": 1}
    return validate(spec)


def test_lightnings_deepspeed_names_and_a_class_path_become_deepspeed_strategy_arguments(tmp_path):
    assert _validated(tmp_path, "deepspeed").lightning.deepspeed == {}  # Lightning's default: ZeRO stage 2
    assert _validated(tmp_path, "deepspeed_stage_1").lightning.deepspeed == {"stage": 1}
    assert _validated(tmp_path, "deepspeed_stage_3_offload", use_gpu=True).lightning.deepspeed == {
        "stage": 3, "offload_optimizer": True, "offload_parameters": True}

    # A LightningCLI config's trainer.strategy, and a DeepSpeed config read from its JSON file on
    # the driver (the workers get the dict: the file need not exist on them).
    config_file = tmp_path / "ds_config.json"
    config_file.write_text(json.dumps({"zero_optimization": {"stage": 3, "overlap_comm": False}}))
    spec = _validated(tmp_path, {"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy",
                                 "init_args": {"config": str(config_file), "timeout": 1800}})
    assert spec.lightning.strategy == "deepspeed" and spec.sharded
    assert spec.lightning.deepspeed == {"config": {"zero_optimization": {"stage": 3, "overlap_comm": False}},
                                        "timeout": 1800}
    # A precision block that agrees with the Trainer's precision is kept, as Lightning keeps it.
    agreeing = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    assert _validated(tmp_path, {"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy",
                                 "init_args": {"config": agreeing}}).lightning.deepspeed == {"config": agreeing}

    cli_config = tmp_path / "config.yaml"
    cli_config.write_text(yaml.safe_dump({
        "model": {"class_path": "jobs.digits.DigitsClassifier"},
        "data": {"class_path": "jobs.digits.DigitsData"},
        "trainer": {"max_epochs": 1, "precision": "bf16-mixed", "strategy": {
            "class_path": "lightning.pytorch.strategies.DeepSpeedStrategy", "init_args": {"stage": 3}}}}))
    from_cli = validate({"name": "c", "storage": str(tmp_path), "lightning": {"config": str(cli_config)}})
    assert from_cli.lightning.deepspeed == {"stage": 3}

    # A JobSpec with overrides goes back through validation unchanged.
    again = resolve_spec(spec, {"lightning.trainer.max_epochs": 4})
    assert isinstance(again, JobSpec) and again.lightning.deepspeed == spec.lightning.deepspeed


@pytest.mark.parametrize("strategy, settings, expected", [
    ("deepspeed_stage_4", {}, r"'deepspeed_stage_4' is not one of Lightning's DeepSpeed strategies.*deepspeed_stage_3"),
    ({"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy", "init_args": {"stages": 3}}, {},
     r"init_args\.stages'.*not an argument of DeepSpeedStrategy"),
    ({"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy", "init_args": {"process_group_backend": "nccl"}},
     {}, r"orchestrator sets this itself \(NCCL with scaling.use_gpu"),
    ({"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy",
      "init_args": {"config": {"gradient_accumulation_steps": 4}}}, {},
     r"config\.gradient_accumulation_steps'.*set lightning\.trainer\.accumulate_grad_batches"),
    ({"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy",
      "init_args": {"config": {"checkpoint": {"use_node_local_storage": True}}}}, {},
     r"config\.checkpoint'.*around the orchestrator's store"),
    ({"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy", "init_args": {"config": "missing.json"}}, {},
     r"'missing\.json' cannot be read"),
    ({"class_path": "pytorch_lightning.strategies.DeepSpeedStrategy"}, {},
     r"not Lightning's DeepSpeedStrategy.*lightning\.pytorch\.strategies\.DeepSpeedStrategy"),
    ("deepspeed_stage_3_offload_nvme", {"use_gpu": True}, r"NVMe offload is not supported"),
    ("deepspeed_stage_2_offload", {}, r"scaling\.use_gpu is false.*Fix: drop the offload"),
    ("deepspeed", {"precision": "16-mixed"}, r"'16-mixed' under DeepSpeed needs a GPU.*bf16-mixed"),
    ("deepspeed", {"num_workers": [1, 2]}, r"'scaling\.num_workers'.*cannot repartition ZeRO.*strategy: fsdp"),
    ("deepspeed", {"global_batch_size": 64}, r"'scaling\.global_batch_size'.*set lightning\.trainer\.accumulate_grad"),
    ({"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy",
      "init_args": {"stage": 3, "config": {"zero_optimization": {"stage": 2}}}}, {},
     r"init_args': stage would be ignored.*move them into the config"),
    ({"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy",
      "init_args": {"config": {"bf16": {"enabled": "auto"}}}}, {}, r"config\.bf16\.enabled': got 'auto'"),
    ({"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy",
      "init_args": {"config": {"bf16": {"enabled": True}}}}, {"precision": "32-true"},
     r"config\.bf16': enabled: true disagrees with lightning\.trainer\.precision: 32-true.*precision: bf16-mixed"),
    ({"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy",
      "init_args": {"config": {"zero_optimization": {"stage": 3, "elastic_checkpoint": True}}}}, {},
     r"elastic_checkpoint'.*stages 1 and 2 only"),
    ({"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy", "init_args": {"timeout": "30m"}}, {},
     r"init_args\.timeout': got '30m'.*a number of seconds"),
    ("deepspeed", {"precision": "64-true"}, r"'64-true' is not one DeepSpeed trains in.*bf16-true"),
    ("deepspeed", {"gradient_clip_algorithm": "value"}, r"gradient_clip_algorithm'.*by their norm only"),
])
def test_deepspeed_settings_that_cannot_work_are_refused_naming_the_field_to_set(tmp_path, strategy, settings,
                                                                                  expected):
    with pytest.raises(SpecError, match=expected):
        _validated(tmp_path, strategy, **settings)


def test_a_deepspeed_checkpoint_resumes_only_with_deepspeed_at_its_world_size(tmp_path):
    # DeepSpeed's names for ZeRO-2 with bf16 (measured), with the store's prefix.
    zero_2_bf16 = ["deepspeed-mp_rank_00_model_states.pt", "deepspeed-bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                   "deepspeed-bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"]

    def choice(strategy, world_size, files=()):
        manifest = Manifest(step=5, epoch=0, batch_in_epoch=5, world_size=world_size, kind="lightning",
                            files={name: FileEntry(size=1, sha256="0" * 64) for name in files},
                            sharded=strategy != "ddp", strategy=strategy)
        return ResumeChoice("file:///ckpt", 5, "test", manifest)

    deepspeed = _validated(tmp_path, "deepspeed")
    check_compatible(deepspeed, choice("deepspeed", 2, zero_2_bf16))
    check_compatible(_validated(tmp_path, "deepspeed_stage_3"), choice("deepspeed", 2, FILES_ZERO_3))
    # DeepSpeed finds only the files of its own layout (ZeRO-3's per-rank model files, bf16's prefix).
    with pytest.raises(CheckpointError, match=r"ZeRO-3: yes in the checkpoint, no in this spec"):
        check_compatible(deepspeed, choice("deepspeed", 2, FILES_ZERO_3))
    with pytest.raises(CheckpointError, match=r"bf16: yes in the checkpoint, no in this spec.*Fix: resume with"):
        check_compatible(_validated(tmp_path, "deepspeed", precision="32-true"), choice("deepspeed", 2, zero_2_bf16))
    with pytest.raises(CheckpointError, match=r"written by 3 DeepSpeed ranks.*scaling\.num_workers: 3"):
        check_compatible(deepspeed, choice("deepspeed", 3, zero_2_bf16))
    with pytest.raises(CheckpointError, match=r"written with lightning\.trainer\.strategy: fsdp but this spec uses "
                                              r"deepspeed"):
        check_compatible(deepspeed, choice("fsdp", 2))
    with pytest.raises(CheckpointError, match=r"written with lightning\.trainer\.strategy: ddp but this spec uses "
                                              r"deepspeed"):
        check_compatible(deepspeed, choice("ddp", 2))
    with pytest.raises(CheckpointError, match=r"strategy: deepspeed but this spec uses fsdp"):
        check_compatible(_validated(tmp_path, "fsdp"), choice("deepspeed", 2))


def test_deepspeeds_own_objects_in_its_states_load_back_without_unpickling():
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    from orchestrator.rank.lightning.deepspeed import plain_deepspeed_objects, with_deepspeed_objects

    # As DeepSpeed's ZeRO optimizer state_dict() holds them (measured for stages 1-3, fp32 and bf16).
    scaler = DynamicLossScaler(init_scale=2 ** 16, scale_window=1000, min_scale=1, delayed_shift=2,
                               consecutive_hysteresis=False, raise_error_at_min_scale=True, dtype=torch.float16)
    scaler.cur_iter = 17
    state = {"loss_scaler": scaler, "zero_stage": ZeroStageEnum.gradients,
             "param_slice_mappings": [{"layer.weight": fragment_address(numel=8192, start=64)}],
             "single_partition_of_fp32_groups": [torch.arange(4.0)]}
    loaded = with_deepspeed_objects(loads_state(dumps_state(plain_state(plain_deepspeed_objects(state))),
                                                source="test"))  # weights_only=True
    assert isinstance(loaded["loss_scaler"], DynamicLossScaler) and vars(loaded["loss_scaler"]) == vars(scaler)
    assert loaded["param_slice_mappings"] == [{"layer.weight": fragment_address(numel=8192, start=64)}]
    assert loaded["zero_stage"] == 2 and torch.equal(loaded["single_partition_of_fp32_groups"][0], torch.arange(4.0))


def test_deepspeed_reads_the_resumed_files_from_memory_as_often_as_it_asks_and_the_rest_from_the_store():
    from orchestrator.rank.lightning.deepspeed import StoreFiles

    reads = []
    files = StoreFiles(read=lambda name: reads.append(name) or {"from": "store", "name": name})
    files.serve("deepspeed-mp_rank_00_model_states.pt", {"module": {"w": torch.ones(1)}})
    # DeepSpeed reads the model-states file twice (a check, then the load): both from memory.
    for _ in range(2):
        assert files.load("/x/checkpoint/mp_rank_00_model_states.pt")["module"]["w"].item() == 1.0
    assert files.load("/x/checkpoint/zero_pp_rank_1_mp_rank_00_optim_states.pt")["from"] == "store"
    assert reads == ["deepspeed-zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    files.release()  # after the resume, nothing is held
    assert files.load("/x/checkpoint/mp_rank_00_model_states.pt")["from"] == "store"
