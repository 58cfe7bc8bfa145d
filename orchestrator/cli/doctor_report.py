"""What `orchestrator doctor` prints: one line a check (PASS, WARN or FAIL) under the nodes' tables,
and the verdict that sets the exit code."""

from __future__ import annotations

from dataclasses import dataclass

# doctor --nodes names a node or device below this fraction of its peers' median.
SLOW_BELOW = 0.7


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    # A finding that does not stop a run by itself (a node slower than its peers): WARN, and a
    # failure only under --strict.
    warning: bool = False

    def line(self) -> str:
        status = "FAIL" if not self.ok else "WARN" if self.warning else "PASS"
        return f"{status}  {self.name}: {self.detail}"


@dataclass
class Report:
    tables: list[str]
    checks: list[Check]
    strict: bool = False

    @property
    def ok(self) -> bool:
        return all(c.ok and not (self.strict and c.warning) for c in self.checks)

    def text(self) -> str:
        failed = [c for c in self.checks if not c.ok]
        warned = [c for c in self.checks if c.ok and c.warning]
        if failed:
            verdict = f"doctor: {len(failed)} of {len(self.checks)} checks failed"
        else:
            verdict = f"doctor: all {len(self.checks)} checks passed"
        if warned:
            verdict += (f", {len(warned)} with a warning" +
                        (" (failed by --strict)" if self.strict else " (--strict fails on a warning)"))
        return "\n\n".join(self.tables) + "\n\n" + "\n".join([*(c.line() for c in self.checks), verdict])
