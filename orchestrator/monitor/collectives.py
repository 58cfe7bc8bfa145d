"""Which rank's last collective differs from its peers', from the flight-recorder summaries the
agents take on a hang verdict (agent/flight_records.py): the rank that never entered the
collective its peers wait in (it hangs elsewhere: its stack says where), or the one that entered
a different collective than theirs (a mismatched call: a branch only some ranks take).

Per process group, each rank's newest collective: its sequence number, its operation and sizes.
The ranks at the sequence number most of them share (the higher on a tie) are the group; a rank short of it, or past
it, or at it with another operation or other sizes, is named. A rank that answered nothing (a
stopped or dead process) is named apart: its stack is the finding.
"""

from __future__ import annotations

import collections
from typing import Any


def odd_ranks(summaries: dict[int, dict[str, Any]], asked: list[int]) -> tuple[list[int], str | None]:
    """The odd ranks and a one-paragraph finding; ([], None) when every rank agrees."""
    findings, odd = [], set()
    groups = sorted({g for s in summaries.values() for g in s}, key=lambda g: (g != "default_pg", g))
    for group in groups:
        last = {rank: s[group] for rank, s in summaries.items() if group in s}
        if len(last) < 2:
            continue
        # The number most ranks share; on a tie (two ranks) the higher, where a rank waits for its peer.
        common_seq = max(collections.Counter(c["seq"] for c in last.values()).items(), key=lambda kv: (kv[1], kv[0]))[0]
        at_common = [c for c in last.values() if c["seq"] == common_seq]
        usual = collections.Counter((c["op"], str(c["sizes"])) for c in at_common).most_common(1)[0][0]
        peers = f"#{common_seq} {usual[0]}"
        for rank, c in sorted(last.items()):
            if c["seq"] < common_seq:
                findings.append(f"rank {rank} never entered collective {peers} on {group}, which its peers wait in "
                                f"(its last was #{c['seq']} {c['op']})")
            elif c["seq"] > common_seq:
                findings.append(f"rank {rank} went on to collective #{c['seq']} {c['op']} on {group} while its peers "
                                f"are at {peers}")
            elif (c["op"], str(c["sizes"])) != usual:
                findings.append(f"rank {rank} called {c['op']} (sizes {c['sizes']}) as collective #{c['seq']} on "
                                f"{group}, where its peers called {usual[0]} (sizes {usual[1]}): a mismatched call")
            else:
                continue
            odd.add(rank)
        if findings:
            break  # the first group that disagrees (the training one first) tells the story
    silent = sorted(set(asked) - set(summaries))
    if silent:
        findings.append(f"rank(s) {', '.join(map(str, silent))} gave no flight record (stopped or gone: see their "
                        "stacks)")
    if not findings:
        return [], None
    return sorted(odd), "flight recorder: " + "; ".join(findings) + "."
