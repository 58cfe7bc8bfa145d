"""Every promise of the docs has a test on the path the doc names: docs/testing.md's table.

Fast (no Ray, no training). A promise is what a user relies on about behaviour (a guarantee, an
"always" or a "never", an exit code, what a failure, a stop or a resume does), and it is named in
the docs:
- a row of README.md's guarantees table ("## What it guarantees") is one by its first column:
  the id `guarantee-<its words, in lower case, joined by hyphens>`;
- anywhere else in README.md or docs/*.md, an HTML comment in the paragraph that makes it,
  `<!-- promise: ID -->` (lower case, digits and hyphens; one id may mark the same promise in
  several places).
docs/testing.md's section "Promises and their tests" lists each one in a table row:
`` | `ID`: the promise in a few words | Ray / local / every path | `tests/...py::test_name`, ... | ``.
This file fails:
- on a promise without a row, and on a row without a promise;
- on a test that does not exist (its file, and a test function of that name in it, read with ast;
  a parametrized test's `[id]` is dropped) and on a row whose test is `TODO(who)` or `MISSING`;
- on a row whose path its tests do not run: a Ray row's every test must show a sign of running on
  Ray, an "every path" row needs one test that does and one that runs locally, a local row one
  that runs locally (a sign of local mode, `--local`, `mode="local"`, "local mode", or no sign of
  Ray). The signs of Ray, read conservatively from the test's own source (its decorators and body,
  and the fixtures, functions and constants of its own module that it names, transitively):
  `--ray` or `mode="ray"`, a `warm_cluster` / `_warm_record` fixture, an address handed to the run
  (`--address`, an `address=` argument), a loopback cluster (`three_nodes`,
  `shared_loopback_cluster`, `ray.cluster_utils`), a head of its own (`"start", "--head"`) or a
  warm one (`"orchestrator", "up"`), `"job", "submit"`, `ray.init(`, `@ray.remote`; the words "ray
  job submit" or RAY_ADDRESS alone, which messages and comments hold, are none. A fixture of
  conftest.py is not followed: the session's clean runs are on the warm cluster whatever the test
  that compares with them runs on.
So that a new promise cannot slip in unmarked:
- every section (a heading of level 1 to 3 to the next one) of README.md and docs/*.md that holds
  prose carries a promise marker or `<!-- no promise: the reason -->`;
- every paragraph, list item or table row that says "never", "always", "guarantee", "bit for
  bit" / "bit-equal" or an exit code ("exit `1`", "exits 2") carries one of the two markers
  itself (README's guarantees rows aside: they are promises already).
"""

from __future__ import annotations

import ast
import functools
import os
import re
from dataclasses import dataclass, field

import pytest
from conftest import REPO

PROMISE = re.compile(r"<!--\s*promise:\s*([a-z0-9-]+)\s*-->")
MARKER = re.compile(r"<!--\s*(?:promise:\s*[a-z0-9-]+|no promise:\s*\S.*?)\s*-->")  # a reason is required
PROMISE_WORDS = re.compile(r"\bnever\b|\balways\b|\bguarantee|\bbit for bit\b|\bbit-(?:equal|exact)\b"
                           r"|\bexits?\s+`?\d", re.IGNORECASE)
HEADING = re.compile(r"^ {0,3}(#{1,3})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
GUARANTEES = "What it guarantees"
TABLE_SECTION = "Promises and their tests"
PATHS = ("Ray", "local", "every path")

RAY_SIGNS = re.compile(
    r"--ray\b|\bmode\s*=\s*[\"']ray[\"']|\bwarm_cluster\b|\b_warm_record\b|--address\b"
    r"|[(,]\s*address=(?!None\b)[\w\"'f]|\bthree_nodes\b|\bshared_loopback_cluster\b"
    r"|\bcluster_utils\b|[\"']start[\"'],\s*[\"']--head[\"']|[\"']job[\"'],\s*[\"']submit[\"']"
    r"|[\"']orchestrator[\"'],\s*[\"']up[\"']|\brun_cli\(\s*[\"']up[\"']|@ray\.remote\b"
    r"|\bray\.init\(")
LOCAL_SIGNS = re.compile(r"--local\b|\bmode\s*=\s*[\"']local[\"']|local mode")


def doc_files() -> list[str]:
    docs = os.path.join(REPO, "docs")
    return ["README.md", *sorted(f"docs/{n}" for n in os.listdir(docs) if n.endswith(".md"))]


def _read(path: str) -> str:
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return f.read()


def prose_lines(text: str) -> list[str]:
    """The lines of a markdown text with its fenced blocks blanked (their markers kept out too)."""
    lines, fence = text.split("\n"), None
    out = []
    for line in lines:
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$", line):
                fence = None
            out.append("")
        else:
            out.append(line)
    return out


@dataclass
class Section:
    path: str
    line: int  # of its heading, 1-based
    title: str
    lines: list[tuple[int, str]] = field(default_factory=list)  # (number, text) of its prose

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line} ({self.title})"


def sections(text: str, path: str = "<text>") -> list[Section]:
    found: list[Section] = []
    for number, line in enumerate(prose_lines(text), 1):
        m = HEADING.match(line)
        if m:
            found.append(Section(path, number, m.group(2)))
        elif found:
            found[-1].lines.append((number, line))
    return found


def paragraphs(section: Section) -> list[tuple[int, str]]:
    """A section's paragraphs, list items (nested ones too) and table rows: (first line, text)."""
    found: list[tuple[int, list[str]]] = []
    current: list[str] | None = None
    for number, line in section.lines:
        starts_item = re.match(r"^\s*(?:[-*+]|\d+\.)\s", line) or line.lstrip().startswith("|")
        if not line.strip():
            current = None
        elif current is None or starts_item or (found and found[-1][1][-1].lstrip().startswith("|")):
            current = [line]
            found.append((number, current))
        else:
            current.append(line)
    return [(number, "\n".join(text)) for number, text in found]


def slug(words: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", words.lower()).strip("-")


def table_rows(section: Section) -> list[tuple[int, list[str]]]:
    """The body rows of the first table in a section, as (line, cells)."""
    rows = [(n, [c.strip() for c in line.strip().strip("|").split("|")])
            for n, line in section.lines if line.lstrip().startswith("|")]
    return [(n, cells) for n, cells in rows[1:] if not all(re.fullmatch(r":?-+:?", c) for c in cells)]


def guarantee_ids(readme: str) -> dict[str, str]:
    """README's guarantees rows as promise ids, each with where it is."""
    found = {}
    for section in sections(readme, "README.md"):
        if section.title == GUARANTEES:
            for number, cells in table_rows(section):
                found[f"guarantee-{slug(cells[0])}"] = f"README.md:{number}"
    return found


def marked_ids(text: str, path: str = "<text>") -> dict[str, str]:
    found = {}
    for section in sections(text, path):
        if section.title == TABLE_SECTION:
            continue  # the registry itself, which names every id
        for number, line in section.lines:
            for pid in PROMISE.findall(line):
                found.setdefault(pid, f"{path}:{number}")
    return found


def all_promises() -> dict[str, str]:
    found = guarantee_ids(_read("README.md"))
    for path in doc_files():
        for pid, where in marked_ids(_read(path), path).items():
            found.setdefault(pid, where)
    return found


@dataclass
class Row:
    line: int
    pid: str
    path: str
    tests: list[str]


def promise_table(text: str) -> list[Row]:
    rows = []
    for section in sections(text, "docs/testing.md"):
        if section.title != TABLE_SECTION:
            continue
        for number, cells in table_rows(section):
            m = re.match(r"^`([a-z0-9-]+)`", cells[0])
            tests = [t.strip().strip("`").strip() for t in re.split(r",|<br\s*/?>", cells[2])] if len(cells) > 2 else []
            rows.append(Row(number, m.group(1) if m else cells[0], cells[1] if len(cells) > 1 else "",
                            [t for t in tests if t]))
    return rows


ROWS = promise_table(_read("docs/testing.md"))


def _placeholder(test: str) -> bool:
    return test == "MISSING" or bool(re.fullmatch(r"TODO\([\w-]+\)", test))


# ---------------------------------------------------------------------------------------------
# Tests, as ast finds them


def _split(nodeid: str) -> tuple[str, list[str]]:
    file, _, rest = nodeid.partition("::")
    return file, [re.sub(r"\[.*\]$", "", part) for part in rest.split("::")] if rest else []


@functools.lru_cache(maxsize=None)
def _module(file: str) -> tuple[str, ast.Module]:
    source = _read(file)
    return source, ast.parse(source)


def find_test(file: str, names: list[str]) -> ast.FunctionDef | None:
    _, tree = _module(file)
    scope: list[ast.stmt] = tree.body
    for i, name in enumerate(names):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == name), None)
        if node is None:
            return None
        if i == len(names) - 1:
            is_test = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name.startswith("test")
            return node if is_test else None
        scope = node.body
    return None


def _segment(source: str, node: ast.AST) -> str:
    """A definition's source with its decorators."""
    start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
    return "\n".join(source.split("\n")[start - 1:node.end_lineno])


@functools.lru_cache(maxsize=None)
def evidence(nodeid: str) -> str:
    """What a test runs, as text: its own source and decorators, its module's pytestmark, and the
    module's fixtures, functions and constants it names, followed transitively."""
    file, names = _split(nodeid)
    source, tree = _module(file)
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    defs.update({t.id: n for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)})
    marks = [_segment(source, n) for n in tree.body if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)]
    todo, seen, parts = [find_test(file, names)], set(), marks
    while todo:
        node = todo.pop()
        name = _name(node)
        if node is None or name in seen:
            continue
        seen.add(name)
        text = _segment(source, node)
        parts.append(text)
        used = set(re.findall(r"\b([A-Za-z_]\w*)\b", text))  # its arguments (fixtures) among them
        todo += [defs[name] for name in used if name in defs and name not in seen]
    return "\n".join(parts)


def _name(node: ast.AST | None) -> str:
    if isinstance(node, ast.Assign):
        return next(t.id for t in node.targets if isinstance(t, ast.Name))
    return getattr(node, "name", "")


def runs_on_ray(nodeid: str) -> bool:
    return bool(RAY_SIGNS.search(evidence(nodeid)))


def runs_locally(nodeid: str) -> bool:
    text = evidence(nodeid)
    return bool(LOCAL_SIGNS.search(text)) or not RAY_SIGNS.search(text)


def path_problem(row: Row) -> str | None:
    tests = [t for t in row.tests if not _placeholder(t)]
    if not tests:
        return None  # a placeholder, failed by its own test
    if row.path == "Ray":
        off = [t for t in tests if not runs_on_ray(t)]
        return f"shows no sign of running on Ray: {', '.join(off)}" if off else None
    if row.path == "local":
        return None if any(runs_locally(t) for t in tests) else "no test runs in local mode"
    ray, local = any(runs_on_ray(t) for t in tests), any(runs_locally(t) for t in tests)
    if row.tests != tests:
        return None  # a test still to come covers a path: the placeholder fails it
    return None if ray and local else f"every path needs a test on Ray and one run locally (Ray: {ray}, local: {local})"


# ---------------------------------------------------------------------------------------------
# The checks


def test_every_promise_of_the_docs_has_a_row_in_the_table():
    listed = {row.pid for row in ROWS}
    missing = [f"{pid} ({where})" for pid, where in sorted(all_promises().items()) if pid not in listed]
    assert not missing, "promises without a row in docs/testing.md's table: " + ", ".join(missing)


def test_every_row_of_the_table_is_a_promise_of_the_docs_and_says_its_path():
    promises = all_promises()
    stray = [f"docs/testing.md:{row.line}: {row.pid}" for row in ROWS if row.pid not in promises]
    assert not stray, "rows that name no promise of the docs: " + ", ".join(stray)
    dupes = sorted({row.pid for row in ROWS if [r.pid for r in ROWS].count(row.pid) > 1})
    assert not dupes, f"promises with two rows: {dupes}"
    bad = [f"docs/testing.md:{row.line}: {row.pid}: {row.path!r}" for row in ROWS
           if row.path not in PATHS or not row.tests]
    assert not bad, f"rows whose path is not one of {PATHS}, or that name no test: " + ", ".join(bad)


def test_every_test_the_table_names_exists():
    gone = []
    for row in ROWS:
        for test in row.tests:
            if _placeholder(test):
                continue
            file, names = _split(test)
            if not file.startswith("tests/") or not os.path.isfile(os.path.join(REPO, file)) or not names:
                gone.append(f"{row.pid}: {test} (no file)")
            elif find_test(file, names) is None:
                gone.append(f"{row.pid}: {test} (no such test in {file})")
    assert not gone, "tests the table names that do not exist:\n" + "\n".join(gone)


def test_every_promise_has_its_test_written():
    open_rows = [f"{row.pid}: {', '.join(t for t in row.tests if _placeholder(t))}"
                 for row in ROWS if any(_placeholder(t) for t in row.tests)]
    assert not open_rows, "promises whose test is still to write:\n" + "\n".join(open_rows)


def test_every_row_is_tested_on_the_path_it_names():
    wrong = [f"{row.pid} ({row.path}): {problem}" for row in ROWS if (problem := path_problem(row))]
    assert not wrong, "rows not tested on their path:\n" + "\n".join(wrong)


def _unmarked(path: str, text: str) -> tuple[list[str], list[str]]:
    """The sections without any marker, and the paragraphs with a promise word and no marker."""
    bare_sections, bare_paragraphs = [], []
    for section in sections(text, path):
        prose = [line for _, line in section.lines if line.strip()]
        promised = section.title == GUARANTEES and table_rows(section)  # its rows are promises
        if prose and not promised and not any(MARKER.search(line) for line in prose):
            bare_sections.append(section.where)
        if section.title in (GUARANTEES, TABLE_SECTION):
            continue
        for number, paragraph in paragraphs(section):
            if PROMISE_WORDS.search(MARKER.sub("", paragraph)) and not MARKER.search(paragraph):
                bare_paragraphs.append(f"{path}:{number}: {paragraph.strip()[:90]}")
    return bare_sections, bare_paragraphs


@pytest.mark.parametrize("path", doc_files())
def test_every_section_and_promising_paragraph_says_whether_it_promises(path):
    bare_sections, bare_paragraphs = _unmarked(path, _read(path))
    assert not bare_sections, ("sections with neither `<!-- promise: ID -->` nor `<!-- no promise: reason -->`: "
                               + ", ".join(bare_sections))
    assert not bare_paragraphs, ("paragraphs that say never/always/guarantee/bit for bit/an exit code without "
                                 "a marker of their own:\n" + "\n".join(bare_paragraphs))


# ---------------------------------------------------------------------------------------------
# The checker itself


def test_the_checker_reads_markers_sections_tables_and_paths():
    doc = ("# Page\n\nIntro. <!-- no promise: an overview -->\n\n## Stop\n\nA stop is a checkpoint,\n"
           "always. <!-- promise: stop-checkpoint -->\n\n- it exits `143`\n- and then\n  resumes\n\n"
           "```text\n## not a heading <!-- promise: in-code -->\n```\n\n## Bare\n\nIt never fails.\n")
    assert marked_ids(doc) == {"stop-checkpoint": "<text>:8"}
    assert [s.title for s in sections(doc)] == ["Page", "Stop", "Bare"]
    assert [n for n, _ in paragraphs(sections(doc)[1])] == [7, 10, 11]
    bare_sections, bare_paragraphs = _unmarked("<text>", doc)
    assert bare_sections == ["<text>:18 (Bare)"]
    assert [p.split(":")[1] for p in bare_paragraphs] == ["10", "20"]
    assert _unmarked("<text>", "## S\n\nIt never fails. <!-- no promise: -->\n") == (
        ["<text>:1 (S)"], ["<text>:3: It never fails. <!-- no promise: -->"])
    readme = f"## {GUARANTEES}\n\n| | guarantee | where |\n|---|---|---|\n| Exact resume | ... | x |\n"
    assert guarantee_ids(readme) == {"guarantee-exact-resume": "README.md:5"}
    table = (f"## {TABLE_SECTION}\n\n| promise | path | test |\n|---|---|---|\n"
             "| `stop-checkpoint`: a stop | Ray | `tests/e2e/test_x.py::test_y[torch]`, TODO(someone) |\n")
    [row] = promise_table(table)
    assert (row.pid, row.path, row.tests) == ("stop-checkpoint", "Ray", ["tests/e2e/test_x.py::test_y[torch]",
                                                                         "TODO(someone)"])
    assert _split(row.tests[0]) == ("tests/e2e/test_x.py", ["test_y"]) and _placeholder(row.tests[1])


def test_the_path_check_tells_a_ray_test_from_a_local_one():
    ray = "tests/e2e/test_ray_jobs.py::test_a_job_stopped_with_ray_job_stop_resumes_when_submitted_again"
    local = "tests/e2e/test_local_mode.py::test_a_bug_in_a_ctx_loop_in_local_mode_fails_once_naming_its_line"
    assert runs_on_ray(ray) and not runs_on_ray(local) and runs_locally(local)
    assert path_problem(Row(0, "x", "Ray", [local])) is not None
    assert path_problem(Row(0, "x", "every path", [ray])) is not None
    assert path_problem(Row(0, "x", "every path", [ray, local])) is None
    assert find_test("tests/e2e/test_ray_jobs.py", ["test_no_such_test"]) is None
