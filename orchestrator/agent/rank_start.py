"""A torchrun script's ranks: what each is started with (its command, directory and environment,
from rank_env.py's recipe) and how the run's stop reaches it (SIGTERM, as torchrun sends it)."""

from __future__ import annotations

import os
import posixpath
import signal

from orchestrator.agent import rank_env
from orchestrator.agent.children import LocalRanks, Placement
from orchestrator.agent.launcher import Launcher, RankSetting
from orchestrator.run_dir import RunDir
from orchestrator.spec import JobSpec
from orchestrator.worker_config import ScriptContext


class ScriptLauncher(Launcher):
    def __init__(self, setting: RankSetting):
        config = setting.config
        self.setting = setting
        self.start_with = RankStart(config.spec, config.script_context or ScriptContext(os.getcwd()),
                                    RunDir.at(config.run_uri))

    def start(self, placement: Placement, in_place: bool, latest_uri: str | None) -> LocalRanks:
        # A script's own output goes to the driver's console too (a ctx job's stays in its logs).
        setting = self.setting
        return LocalRanks(self.start_with.command(), self.start_with.cwd(),
                          self.start_with.env(placement, setting.config.niceness), placement, setting.scratch,
                          setting.log_dir, echo=setting.echo)

    def pass_on_stop(self, ranks: LocalRanks) -> bool:
        # As torchrun does with the signal it gets: every rank is sent SIGTERM (a script that
        # handles it saves and exits); the driver ends the workers when its grace runs out.
        ranks.forward(signal.SIGTERM)
        return True


class RankStart:
    """A script's command, directory and environment."""

    def __init__(self, spec: JobSpec, script_context: ScriptContext, run_dir: RunDir):
        self.spec, self.script, self.context, self.run_dir = spec, spec.script, script_context, run_dir

    def command(self) -> list[str]:
        """The script and its arguments, with {run_dir}, {name} and {storage} filled in."""
        values = {"{run_dir}": self.run_dir_text(), "{name}": self.spec.name, "{storage}": self.storage_text()}
        args = []
        for arg in self.script.args:
            for key, value in values.items():
                arg = arg.replace(key, value)
            args.append(arg)
        target = ["-m", self.script.module] if self.script.module else [self.script_path()]
        return [*target, *args]

    def run_dir_text(self) -> str:
        location = self.run_dir.location
        return location.path if location.is_local else location.uri

    def storage_text(self) -> str:
        """The run directory's parent, as the driver resolved it: a local storage absolute and
        ~-expanded (`~/orchestrator-runs` as written would be a folder named `~` in the script's
        directory), an object store's URI as the spec gives it."""
        location = self.run_dir.location
        return posixpath.dirname(location.path) if location.is_local else self.spec.storage

    def cwd(self) -> str:
        """The driver's directory where this node has it (a shared checkout), else this worker's."""
        wanted = self.context.cwd
        return wanted if wanted and os.path.isdir(wanted) else os.getcwd()

    def script_path(self) -> str:
        path = os.path.expanduser(self.script.path)
        if os.path.isabs(path):
            return path
        for base in (self.cwd(), os.getcwd()):
            if os.path.isfile(os.path.join(base, path)):
                return os.path.join(base, path)
        return path

    def env(self, placement: Placement, niceness: int) -> dict[str, str]:
        """The agent's environment through rank_env.py's recipe, with the user's shell's variables."""
        return rank_env.rank_env(rank_env.SCRIPT, os.environ, self.spec.env, placement.local_world_size,
                                 shell=self.context.env, niceness=niceness,
                                 extra={"ORCHESTRATOR_RUN_DIR": self.run_dir_text()})
