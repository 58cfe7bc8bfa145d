"""WorkerConfig as text: Ray Train shows each run's train_loop_config (the agents' WorkerConfig) as
text in its state API and the dashboard, so the text names the spec's `env:` variables and holds
none of their values (secrets: WANDB_API_KEY, HF_TOKEN)."""

from __future__ import annotations

from orchestrator.spec import validate
from orchestrator.worker_config import LinkAddress, WorkerConfig

SECRET = "s3cr3t-in-the-config"


def test_a_worker_config_as_text_names_the_env_variables_and_holds_no_value():
    spec = validate({"name": "run", "env": {"WANDB_API_KEY": SECRET, "NCCL_DEBUG": "WARN"},
                     "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 5}})
    config = WorkerConfig(spec=spec, run_uri="/tmp/runs/run", resume_uri=None, monitor=LinkAddress("/tmp/x", b"k"),
                          log_dir=None, fence=None, storage_nonce=None)

    for text in (str(config), repr(config), str(config.to_config())):
        assert SECRET not in text and "WARN" not in text, text
        assert "WANDB_API_KEY" in text and "NCCL_DEBUG" in text and "'run'" in text, text
    assert WorkerConfig.from_config(config.to_config()).spec.env["WANDB_API_KEY"] == SECRET  # still carried
