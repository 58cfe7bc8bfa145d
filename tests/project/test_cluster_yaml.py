"""cluster.yaml is what users start with `ray up`: Ray's own schema must accept it, and the cloud
variant its comments describe."""

from __future__ import annotations

import copy
import os
import re

import yaml
from conftest import REPO
from ray.autoscaler._private.util import prepare_config, validate_config


def ray_up_accepts(config: dict) -> None:
    """Ray's schema check on the file as written, and on what `ray up` makes of it (defaults filled in)."""
    validate_config(copy.deepcopy(config))
    validate_config(prepare_config(copy.deepcopy(config)))


def load() -> dict:
    with open(os.path.join(REPO, "cluster.yaml")) as f:
        return yaml.safe_load(f)


def test_cluster_yaml_passes_rays_schema_with_the_project_on_every_node_and_the_dashboard_on_loopback():
    config = load()
    ray_up_accepts(config)  # raises on a property Ray's schema does not know
    assert config["file_mounts"]["~/orchestrator"] == "."
    assert any("pip install -e ~/orchestrator" in c for c in config["setup_commands"])
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "RAY_AUTH_MODE=token" in head
    assert "RAY_AUTH_MODE=token" in " ".join(config["worker_start_ray_commands"])
    assert "~/.ray/auth_token" in config["file_mounts"]


def test_the_cloud_variant_in_its_comments_passes_rays_schema():
    with open(os.path.join(REPO, "cluster.yaml")) as f:
        text = f.read()
    block = re.search(r"^#   provider: \{type: aws.*?^#   max_workers: 8", text, re.S | re.M).group(0)
    cloud = yaml.safe_load("\n".join(line[4:] for line in block.splitlines()))
    config = {**load(), **cloud}
    ray_up_accepts(config)
    assert config["available_node_types"]["gpu_worker"]["max_workers"] == 8
