"""The launcher and liveness (launcher.py) of each kind of job: the one place that asks the kind."""

from __future__ import annotations

from orchestrator.agent.launcher import Launcher, Liveness, RankSetting
from orchestrator.agent.rank_start import ScriptLauncher
from orchestrator.agent.script_liveness import ScriptLiveness
from orchestrator.agent.session_ranks import session_kind
from orchestrator.agent.spares import Spares


def for_job(setting: RankSetting, first_spares: Spares | None = None) -> tuple[Launcher, Liveness]:
    """The launcher and liveness of the job's kind of rank. `first_spares`: a local run's first
    ranks, started ahead by its command (driver/local.py)."""
    if setting.config.spec.kind == "script":
        return ScriptLauncher(setting), ScriptLiveness(setting)
    return session_kind(setting, first_spares)
