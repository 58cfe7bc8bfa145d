"""Spec validation: every mistake names the field, the bad value and the fix."""

from __future__ import annotations

import pytest
from conftest import REPO

from orchestrator.errors import SpecError
from orchestrator.spec import apply_overrides, load_spec_file, parse_set_option, resolve_spec, validate

LIGHTNING = {
    "name": "t",
    "lightning": {
        "model": {"class_path": "jobs.digits.DigitsClassifier", "init_args": {"hidden": 8}},
        "data": {"class_path": "jobs.digits.DigitsData"},
        "trainer": {"max_epochs": 1},
    },
}
TORCH = {"name": "t", "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_epochs": 1}}


def with_(base, dotted, value):
    return apply_overrides(base, {dotted: value})


def without(base, dotted):
    import copy

    raw = copy.deepcopy(base)
    *parents, last = dotted.split(".")
    node = raw
    for p in parents:
        node = node[p]
    del node[last]
    return raw


BAD_SPECS = [
    # (id, raw spec, fragments the message must contain)
    ("unknown top-level key", with_(TORCH, "scalling", {}), ["scalling", "did you mean 'scaling'"]),
    ("unknown nested key", with_(TORCH, "scaling.num_worker", 2), ["scaling.num_worker", "did you mean 'num_workers'"]),
    ("wrong type for workers", with_(TORCH, "scaling.num_workers", "two"), ["scaling.num_workers", "'two'", "whole number"]),
    ("negative workers", with_(TORCH, "scaling.num_workers", -1), ["scaling.num_workers", "-1", "at least 1"]),
    ("zero workers", with_(TORCH, "scaling.num_workers", 0), ["scaling.num_workers", "at least 1"]),
    ("both lightning and torch", {**LIGHTNING, "torch": TORCH["torch"]}, ["both", "exactly one"]),
    ("neither lightning nor torch", {"name": "t"}, ["neither", "exactly one"]),
    ("missing name", without(TORCH, "name"), ["'name' is required", "add it"]),
    ("bad name characters", with_(TORCH, "name", "my run/1"), ["'my run/1'", "letters, digits"]),
    ("missing class module", with_(LIGHTNING, "lightning.model.class_path", "jobs.nope.Model"),
     ["lightning.model.class_path", "module 'jobs.nope'", "no module named 'jobs.nope'"]),
    ("missing class attribute", with_(LIGHTNING, "lightning.model.class_path", "jobs.digits.DigitClassifier"),
     ["module 'jobs.digits' has no attribute 'DigitClassifier'", "did you mean 'DigitsClassifier'"]),
    ("class path without module", with_(LIGHTNING, "lightning.data.class_path", "DigitsData"),
     ["lightning.data.class_path", "not an import path"]),
    ("train loop is not importable", with_(TORCH, "torch.train_loop", "jobs.digits_torch:train_lop"),
     ["torch.train_loop", "no attribute 'train_lop'", "did you mean 'train_loop'"]),
    ("unknown trainer argument", with_(LIGHTNING, "lightning.trainer.max_epoch", 3),
     ["lightning.trainer.max_epoch", "not an argument of lightning.Trainer", "did you mean 'max_epochs'"]),
    ("trainer argument the orchestrator owns", with_(LIGHTNING, "lightning.trainer.devices", 4),
     ["lightning.trainer.devices", "scaling.num_workers", "remove 'devices'"]),
    ("unsupported strategy", with_(LIGHTNING, "lightning.trainer.strategy", "horovod"), ["'horovod'", "Valid choices: ddp"]),
    ("unknown deepspeed strategy", with_(LIGHTNING, "lightning.trainer.strategy", "deepspeed_stage_4"),
     ["lightning.trainer.strategy", "'deepspeed_stage_4'", "deepspeed_stage_3"]),
    ("unknown lightning strategy", with_(LIGHTNING, "lightning.trainer.strategy", "ddp_spawn"),
     ["'ddp_spawn'", "Valid choices: ddp, fsdp"]),
    ("unknown torch strategy", with_(TORCH, "torch.strategy", "deepspeed"),
     ["torch.strategy", "'deepspeed'", "Valid choices: ddp, fsdp"]),
    ("no training limit", without(LIGHTNING, "lightning.trainer.max_epochs"), ["max_epochs", "max_steps", "1000 epochs"]),
    ("torch loop without limits", without(TORCH, "torch.max_epochs"), ["torch.max_epochs", "never end"]),
    ("bad placement", with_(TORCH, "scaling.placement", "spraed"), ["scaling.placement", "'spraed'", "did you mean 'spread'", "spread, pack"]),
    ("bool for workers", with_(TORCH, "scaling.num_workers", True), ["scaling.num_workers", "True"]),
    ("section not a mapping", with_(TORCH, "checkpoint", [1, 2]), ["checkpoint", "expected a mapping"]),
    ("negative checkpoint seconds", with_(TORCH, "checkpoint.every_n_seconds", -5), ["checkpoint.every_n_seconds", "-5", "positive"]),
    ("zero keep_last", with_(TORCH, "checkpoint.keep_last", 0), ["checkpoint.keep_last", "at least 1"]),
    ("keep_best without monitor", with_(TORCH, "checkpoint.keep_best", {"k": 2}), ["checkpoint.keep_best.monitor", "required"]),
    ("keep_best bad mode", with_(TORCH, "checkpoint.keep_best", {"k": 2, "monitor": "val_loss", "mode": "lowest"}), ["checkpoint.keep_best.mode", "min, max"]),
    ("non-boolean use_gpu", with_(TORCH, "scaling.use_gpu", "yes please"), ["scaling.use_gpu", "true or false"]),
    ("negative resource", with_(TORCH, "scaling.resources_per_worker", {"CPU": -1}), ["resources_per_worker.CPU", "non-negative"]),
    ("elastic min above max", with_(TORCH, "scaling.num_workers", [3, 1]), ["scaling.num_workers", "min 3 above max 1", "[1, 3]"]),
    ("elastic min below one", with_(TORCH, "scaling.num_workers", [0, 2]), ["scaling.num_workers", "min 0", "[1, 2]"]),
    ("elastic range of three", with_(TORCH, "scaling.num_workers", [1, 2, 3]), ["scaling.num_workers", "[min, max]"]),
    ("global batch some size cannot split",
     with_(with_(TORCH, "scaling.num_workers", [1, 3]), "scaling.global_batch_size", 100),
     ["scaling.global_batch_size", "100", "over 3 worker", "Sizes in range that split it: 1, 2", "global_batch_size: 102"]),
    ("global batch a fixed size cannot split",
     with_(with_(TORCH, "scaling.num_workers", 4), "scaling.global_batch_size", 10),
     ["scaling.global_batch_size", "10", "over 4 worker", "global_batch_size: 8"]),
    ("global batch over a worker's ranks",
     with_(with_(with_(TORCH, "scaling.num_workers", [1, 2]), "scaling.nproc_per_node", 3), "scaling.global_batch_size", 64),
     ["scaling.global_batch_size", "64", "over 3, 6 rank(s)", "scaling.nproc_per_node 3"]),
    ("ranks per node below one", with_(TORCH, "scaling.nproc_per_node", 0), ["scaling.nproc_per_node", "at least 1"]),
    ("accumulation cannot resize",
     with_(with_(LIGHTNING, "scaling.num_workers", [1, 3]), "lightning.trainer.accumulate_grad_batches", 2),
     ["lightning.trainer.accumulate_grad_batches", "cannot resize", "[1, 3]", "scaling.global_batch_size"]),
    ("accumulation with a global batch",
     with_(with_(LIGHTNING, "scaling.global_batch_size", 64), "lightning.trainer.accumulate_grad_batches", 2),
     ["lightning.trainer.accumulate_grad_batches", "chooses the accumulation", "remove accumulate_grad_batches"]),
    ("resize interval too short", with_(TORCH, "scaling.resize_interval_s", 0), ["scaling.resize_interval_s", "at least 1"]),
    ("env value is a mapping", with_(TORCH, "env", {"NCCL_DEBUG": {"a": 1}}), ["env.NCCL_DEBUG", "strings"]),
    ("init_args not a mapping", with_(LIGHTNING, "lightning.model.init_args", [1]), ["lightning.model.init_args", "mapping"]),
    ("hang timeout too short", with_(TORCH, "failure.hang_timeout_s", 1), ["failure.hang_timeout_s", "1 (int)", "at least 5"]),
    ("hang timeout not a number", with_(TORCH, "failure.hang_timeout_s", "1m"), ["failure.hang_timeout_s", "'1m'", "seconds"]),
    ("straggler ratio not above 1", with_(TORCH, "failure.straggler_ratio", 0.8),
     ["failure.straggler_ratio", "0.8", "a ratio above 1", "straggler_ratio: 1.3"]),
    ("straggler window too short", with_(TORCH, "failure.straggler_after_s", 0),
     ["failure.straggler_after_s", "at least 1"]),
    ("capacity timeout too short", with_(TORCH, "failure.capacity_timeout_s", 0), ["failure.capacity_timeout_s", "at least 10"]),
    ("callbacks in trainer", with_(LIGHTNING, "lightning.trainer.callbacks", []), ["lightning.trainer.callbacks", "lightning.callbacks"]),
    ("callbacks not a list", with_(LIGHTNING, "lightning.callbacks", {"class_path": "x.Y"}), ["lightning.callbacks", "list of"]),
    ("callback missing", with_(LIGHTNING, "lightning.callbacks", [{"class_path": "lightning.pytorch.callbacks.EarlyStop"}]),
     ["lightning.callbacks[0].class_path", "did you mean 'EarlyStopping'"]),
    ("model checkpoint dirpath", with_(LIGHTNING, "lightning.callbacks", [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"dirpath": "/ckpt"}}]),
     ["lightning.callbacks[0].init_args.dirpath", "<storage>/<name>/checkpoints", "remove it"]),
    ("model checkpoint top 0", with_(LIGHTNING, "lightning.callbacks", [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_top_k": 0}}]),
     ["save_top_k", "0 would keep no checkpoint"]),
    ("model checkpoint subclass", with_(LIGHTNING, "lightning.callbacks", [{"class_path": "faulty.CustomCheckpoint"}]),
     ["'faulty.CustomCheckpoint'", "subclass of ModelCheckpoint", "checkpoint.keep_best"]),
    ("module on the old package name", with_(LIGHTNING, "lightning.model.class_path", "faulty.OldPackageModel"),
     ["lightning.model.class_path", "pytorch_lightning.LightningModule", "import lightning.pytorch as pl"]),
    ("model that is not a module", with_(LIGHTNING, "lightning.model.class_path", "jobs.digits.DigitsData"),
     ["lightning.model.class_path", "not a lightning.pytorch.LightningModule"]),
    ("callback that is not one", with_(LIGHTNING, "lightning.callbacks", [{"class_path": "jobs.digits.DigitsData"}]),
     ["lightning.callbacks[0].class_path", "not a lightning.pytorch.Callback"]),
    ("trainer logger", with_(LIGHTNING, "lightning.trainer.logger", True), ["lightning.trainer.logger", "lightning.logger"]),
    ("logger that is not one", with_(LIGHTNING, "lightning.logger", {"class_path": "jobs.digits.DigitsData"}),
     ["lightning.logger.class_path", "not a lightning.pytorch.loggers.Logger"]),
    ("logger whose package is missing", with_(LIGHTNING, "lightning.logger",
     {"class_path": "lightning.pytorch.loggers.WandbLogger"}), ["lightning.logger.class_path", "'wandb'",
                                                                "pip install wandb"]),
    ("logger on an object store", with_(with_(LIGHTNING, "storage", "s3://bucket/runs"), "lightning.logger",
     [{"class_path": "lightning.pytorch.loggers.CSVLogger"}]), ["lightning.logger", "init_args.save_dir", "object store"]),
    ("model checkpoint against keep_best", with_(with_(LIGHTNING, "checkpoint.keep_best", {"k": 3, "monitor": "val_acc"}),
     "lightning.callbacks", [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_top_k": 2, "monitor": "val_loss"}}]),
     ["checkpoint.keep_best", "conflicts with", "in one place only"]),
]


@pytest.mark.parametrize("raw,fragments", [(r, f) for _, r, f in BAD_SPECS], ids=[i for i, _, _ in BAD_SPECS])
def test_a_bad_spec_is_rejected_with_a_message_naming_the_field_and_the_fix(raw, fragments):
    with pytest.raises(SpecError) as info:
        validate(raw)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"
    assert "Fix" in message or "did you mean" in message or "Valid" in message
    assert "\n" not in message, "errors are one paragraph"


def test_a_valid_spec_becomes_typed_objects_with_documented_defaults():
    spec = validate(LIGHTNING)
    assert spec.kind == "lightning"
    assert spec.storage == "~/orchestrator-runs"
    assert spec.resume_from == "latest"
    assert spec.scaling.num_workers == 2 and spec.scaling.placement == "spread"
    assert spec.lightning.strategy == "ddp"
    assert spec.checkpoint.async_save is True
    assert spec.failure.hang_timeout_s == 60 and spec.failure.capacity_timeout_s == 600
    assert (spec.failure.straggler_ratio, spec.failure.straggler_after_s) == (1.3, 20.0)


def test_trainer_plugins_are_refused_naming_what_the_orchestrator_passes_instead():
    with pytest.raises(SpecError) as info:
        validate(with_(LIGHTNING, "lightning.trainer.plugins", []), read_only=True)
    message = str(info.value)
    assert "lightning.trainer.plugins" in message and "remove 'plugins'" in message
    # The ranks are the agent's children, without Ray: the environment comes from torchrun's variables.
    assert "TorchElasticEnvironment" in message and "torchrun variables" in message and "Ray" not in message


def test_an_elastic_range_and_a_global_batch_become_min_max_and_round_trip():
    spec = validate(with_(with_(TORCH, "scaling.num_workers", [1, 3]), "scaling.global_batch_size", 96))
    assert (spec.scaling.min_workers, spec.scaling.num_workers) == (1, 3) and spec.scaling.elastic
    assert spec.scaling.global_batch_size == 96 and spec.scaling.resize_interval_s == 30.0
    again = validate(spec.to_dict())
    assert again.scaling == spec.scaling
    fixed = validate(TORCH).scaling
    assert fixed.min_workers == fixed.num_workers == 2 and not fixed.elastic


def test_ranks_per_node_make_a_world_of_workers_times_ranks_each_holding_its_resources():
    spec = validate(with_(with_(TORCH, "scaling.num_workers", 2), "scaling.nproc_per_node", 4))
    assert spec.ranks_per_worker == 4
    # The worker (a node's agent) asks for its ranks' CPUs, and GPUs with use_gpu.
    assert spec.scaling.resources_per_worker == {"CPU": 4.0}
    gpus = validate(with_(with_(TORCH, "scaling.nproc_per_node", 2), "scaling.use_gpu", True))
    assert gpus.scaling.resources_per_worker == {"CPU": 2.0, "GPU": 2.0}
    assert validate(spec.to_dict()).scaling == spec.scaling
    assert validate(TORCH).ranks_per_worker == 1 and validate(TORCH).scaling.resources_per_worker == {"CPU": 1.0}


def test_set_overrides_any_field_and_parses_values_as_yaml(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: t\ntorch: {train_loop: 'jobs.digits_torch:train_loop', max_epochs: 1}\n")
    overrides = dict(parse_set_option(o) for o in ["scaling.num_workers=4", "torch.config.lr=0.5", "checkpoint.async=false"])
    spec = resolve_spec(path, overrides)
    assert spec.scaling.num_workers == 4
    assert spec.torch.config == {"lr": 0.5}
    assert spec.checkpoint.async_save is False


@pytest.mark.parametrize("option", ["scaling.num_workers", "=3", "a..b=1"])
def test_a_malformed_set_option_is_a_clear_error(option):
    with pytest.raises(SpecError, match="KEY=VALUE"):
        parse_set_option(option)


def test_a_missing_spec_file_is_named(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec_file(tmp_path / "nope.yaml")


def test_bad_yaml_reports_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: t\ntorch:\n  train_loop: [unclosed\n")
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    assert "not valid YAML at line" in str(info.value)


def test_a_spec_file_that_is_not_a_mapping_is_rejected(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- name: t\n")
    with pytest.raises(SpecError, match="must hold a mapping"):
        load_spec_file(path)


def test_a_module_that_fails_to_import_reports_its_own_error(tmp_path, monkeypatch):
    (tmp_path / "broken_job.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError) as info:
        validate(with_(TORCH, "torch.train_loop", "broken_job:train_loop"))
    assert "boom at import" in str(info.value) and "broken_job" in str(info.value)


def test_the_shipped_job_specs_are_valid():
    assert resolve_spec("jobs/quickstart.yaml").kind == "lightning"
    assert resolve_spec("jobs/digits_torch.yaml").kind == "torch"
    assert resolve_spec("jobs/digits_fsdp.yaml").torch.strategy == "fsdp"
    gpt = resolve_spec("jobs/gpt.yaml")
    assert [c.class_path for c in gpt.lightning.callbacks] == ["lightning.pytorch.callbacks.EarlyStopping"]
    assert gpt.checkpoint.keep_best.monitor == "val_loss"


def test_callbacks_are_kept_and_a_model_checkpoint_becomes_the_stores_retention():
    raw = with_(LIGHTNING, "lightning.callbacks", [
        {"class_path": "lightning.pytorch.callbacks.EarlyStopping", "init_args": {"monitor": "val_loss"}},
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_top_k": 2, "monitor": "val_acc", "mode": "max",
                                               "every_n_train_steps": 25, "save_last": True}},
    ])
    spec = validate(raw)
    assert [c.class_path for c in spec.lightning.callbacks] == ["lightning.pytorch.callbacks.EarlyStopping"]
    assert spec.lightning.callbacks[0].init_args == {"monitor": "val_loss"}
    best = spec.checkpoint.keep_best
    assert (best.k, best.monitor, best.mode) == (2, "val_acc", "max")
    assert spec.checkpoint.keep_last == 1 and spec.checkpoint.every_n_steps == 25
    assert validate(spec.to_dict()) == spec  # what the driver hands on validates to the same spec

    logged = validate(with_(with_(LIGHTNING, "lightning.trainer.logger", False), "lightning.logger",
                            {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"flush_logs_every_n_steps": 10}}))
    assert [ref.class_path for ref in logged.lightning.logger] == ["lightning.pytorch.loggers.CSVLogger"]
    assert "logger" not in logged.lightning.trainer and validate(logged.to_dict()) == logged

    keep_all = validate(with_(LIGHTNING, "lightning.callbacks", [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_top_k": -1}}]))
    assert keep_all.checkpoint.keep_last is None and keep_all.checkpoint.keep_best is None


CLI_CONFIG = "tests/helpers/configs/lightning_cli_fit.yaml"


def test_a_lightning_cli_config_becomes_the_lightning_section_as_it_is():
    spec = validate({"name": "from-cli", "lightning": {"config": CLI_CONFIG}})
    lightning = spec.lightning
    assert lightning.model.class_path == "jobs.digits.DigitsClassifier"
    assert lightning.model.init_args == {"hidden": 64, "lr": 0.002}
    assert lightning.data.init_args == {"batch_size": 32}
    # Only what differs from Lightning's defaults stays; what the orchestrator owns moved.
    assert lightning.trainer == {"precision": "32-true", "max_epochs": 3, "log_every_n_steps": 10,
                                 "gradient_clip_val": 1.0}
    assert spec.scaling.num_workers == 2 and spec.seed == 7
    assert [c.class_path for c in lightning.callbacks] == ["lightning.pytorch.callbacks.EarlyStopping"]
    assert (spec.checkpoint.keep_best.k, spec.checkpoint.keep_best.monitor) == (2, "val_loss")
    assert [(ref.class_path, ref.init_args) for ref in lightning.logger] == [
        ("lightning.pytorch.loggers.CSVLogger", {})], "a relative save_dir would land wherever a worker runs"
    assert validate(spec.to_dict()) == spec


def test_the_spec_wins_over_a_lightning_cli_config_and_its_mistakes_are_named(tmp_path):
    spec = validate({"name": "t", "seed": 1, "scaling": {"num_workers": 3},
                     "lightning": {"config": CLI_CONFIG, "trainer": {"max_epochs": 9},
                                   "model": {"init_args": {"hidden": 16}}}})
    assert spec.seed == 1 and spec.scaling.num_workers == 3
    assert spec.lightning.trainer["max_epochs"] == 9 and spec.lightning.model.init_args["hidden"] == 16

    bare = tmp_path / "bare.yaml"
    bare.write_text("model: {hidden: 8}\ndata: {class_path: jobs.digits.DigitsData}\ntrainer: {max_epochs: 1}\n")
    with pytest.raises(SpecError, match=r"init_args without a class_path.*lightning.model.class_path"):
        validate({"name": "t", "lightning": {"config": str(bare)}})
    named = validate({"name": "t", "lightning": {"config": str(bare),
                                                 "model": {"class_path": "jobs.digits.DigitsClassifier"}}})
    assert named.lightning.model.init_args == {"hidden": 8}

    auto_optimizer = tmp_path / "auto.yaml"
    auto_optimizer.write_text("model: {class_path: jobs.digits.DigitsClassifier}\n"
                              "data: {class_path: jobs.digits.DigitsData}\ntrainer: {max_epochs: 1}\n"
                              "optimizer: {class_path: torch.optim.Adam}\n")
    with pytest.raises(SpecError, match=r"'optimizer' section.*configure_optimizers"):
        validate({"name": "t", "lightning": {"config": str(auto_optimizer)}})
    with pytest.raises(SpecError, match=r"lightning.config.*LightningCLI config .*missing.yaml' does not exist.*Fix"):
        validate({"name": "t", "lightning": {"config": str(tmp_path / "missing.yaml")}})


def test_a_scripts_ranks_per_node_are_set_in_one_place():
    import os

    seed = os.path.join(REPO, "tests", "helpers", "torchrun_seed.py")
    raw = {"name": "s", "script": {"path": seed}, "scaling": {"num_workers": 1, "nproc_per_node": 2}}
    with pytest.raises(SpecError) as got:
        validate(raw)
    assert "scaling.nproc_per_node" in str(got.value) and "script: {nproc_per_node: 2}" in str(got.value)
