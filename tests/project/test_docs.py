"""The manual's snippets still parse and its links resolve: README.md and docs/*.md.

Fast (no Ray, no training). For every fenced block of those files:
- ```yaml: a whole job spec (a `name:` and exactly one of `lightning:`, `torch:`, `script:`)
  validates with the project's own loader, `resolve_spec`, from the repository root (so class
  paths into jobs/ import). Any other YAML block is a fragment (a section, or the reference of
  every field, which lists all three kinds at once): it must be a mapping that validates against
  spec.schema.json with nothing required. The schema, not the loader, because the loader's
  cross-field rules (exactly one kind, a script that exists on disk) refuse a fragment for what it
  leaves out, while the schema still refuses an unknown key or a wrong type anywhere in it.
- ```bash / ```sh / ```shell / ```console (only its `$ ` lines): every `orchestrator ...` command
  (also after `&&`, `;`, `--` as in `ray job submit ... -- orchestrator ...`, or as `python -m
  orchestrator`) parses with the command line's own parser (orchestrator.cli.build_parser), nothing
  run; each `--set` is a valid KEY=VALUE; a torchrun command names its script.
- ```python: compiles.
- Every block names its language (```text for synopses and output, which are not parsed), so no
  snippet escapes the checks by having none.
A block that is wrong on purpose is skipped when the line before its fence (blank lines aside) is
`<!-- not checked: the reason -->`.

Every relative link `[text](path#anchor)` outside code must name a file or folder that exists, and
an anchor into a markdown file one of its headings (GitHub's slugs).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass

import pytest
import yaml
from conftest import REPO

SKIP_MARKER = re.compile(r"^<!--\s*not checked:.*-->\s*$")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<lang>[^\s`]*)")
SHELL = {"bash", "sh", "shell", "console"}
KINDS = ("lightning", "torch", "script")
SHELL_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", "--"}


@dataclass
class Block:
    path: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    skipped: bool

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files() -> list[str]:
    docs = os.path.join(REPO, "docs")
    pages = sorted(f"docs/{name}" for name in os.listdir(docs) if name.endswith(".md")) if os.path.isdir(docs) else []
    return ["README.md", *pages]


def parse_blocks(text: str, path: str = "<text>") -> tuple[list[Block], list[str]]:
    """The fenced blocks of a markdown text, and its lines with the blocks blanked out."""
    lines = text.split("\n")
    blocks, prose = [], list(lines)
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m.group("fence"), len(m.group("indent"))
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        blocks.append(Block(path, i + 1, m.group("lang").lower(), "\n".join(body), bool(SKIP_MARKER.match(before))))
        for k in range(i, min(j + 1, len(lines))):
            prose[k] = ""
        i = j + 1
    return blocks, prose


def all_blocks() -> list[Block]:
    found = []
    for path in doc_files():
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            found += parse_blocks(f.read(), path)[0]
    return found


BLOCKS = all_blocks()


def _ids(blocks: list[Block]) -> list[str]:
    return [b.where for b in blocks]


def _checked(*langs: str) -> list[Block]:
    return [b for b in BLOCKS if b.lang in langs and not b.skipped]


# ---------------------------------------------------------------------------------------------
# YAML: whole specs through the loader, fragments against the schema


def _schema_without_required() -> dict:
    with open(os.path.join(REPO, "spec.schema.json"), encoding="utf-8") as f:
        schema = json.load(f)
    schema.pop("required", None)
    return schema


def is_whole_spec(raw: object) -> bool:
    return isinstance(raw, dict) and "name" in raw and sum(kind in raw for kind in KINDS) == 1


@pytest.mark.parametrize("block", _checked("yaml", "yml"), ids=_ids(_checked("yaml", "yml")))
def test_yaml_block_is_a_valid_spec_or_fragment(block, monkeypatch):
    raw = yaml.safe_load(block.text)
    assert isinstance(raw, dict), f"{block.where}: a spec snippet must be a mapping, not {type(raw).__name__}"
    if is_whole_spec(raw):
        from orchestrator.spec import SpecError, resolve_spec

        monkeypatch.chdir(REPO)  # class paths (jobs.*) and data paths as from the repository root
        try:
            resolve_spec(raw)
        except SpecError as exc:
            pytest.fail(f"{block.where}: the job spec does not validate: {exc}")
    else:
        import jsonschema

        schema = _schema_without_required()
        errors = sorted(jsonschema.validators.validator_for(schema)(schema).iter_errors(raw), key=str)
        assert not errors, f"{block.where}: the spec fragment does not match spec.schema.json: " + "; ".join(
            f"{'.'.join(map(str, e.absolute_path)) or '<top>'}: {e.message}" for e in errors)


# ---------------------------------------------------------------------------------------------
# Shell: every orchestrator command line through the CLI's own parser


def shell_lines(block: Block) -> list[tuple[int, str]]:
    """The block's command lines with their line numbers, continuation lines joined; a console
    block's `$ ` lines only."""
    joined, current, start = [], "", None
    for number, line in enumerate(block.text.split("\n"), block.line + 1):
        if block.lang == "console":
            if not line.startswith("$ ") and not current:
                continue
            line = line[2:] if line.startswith("$ ") else line
        start = number if start is None else start
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        joined.append((start, current + line))
        current, start = "", None
    if current:
        joined.append((start, current))
    return [(number, line) for number, line in joined if line.strip()]


def orchestrator_commands(line: str) -> list[list[str]]:
    """Each `orchestrator ...` command in a shell line, as its arguments (after the program name)."""
    if not re.search(r"(?<![\w.-])orchestrator(?![\w.\[-])", line):
        return []
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    commands = []
    for i, token in enumerate(tokens):
        if token != "orchestrator":
            continue
        j = i - 1
        if j >= 1 and tokens[j] == "-m" and re.fullmatch(r"python[\d.]*", tokens[j - 1]):
            j -= 2
        while j >= 0 and re.fullmatch(r"[A-Za-z_]\w*=.*", tokens[j]):  # VAR=value orchestrator ...
            j -= 1
        if j >= 0 and tokens[j] not in SHELL_OPERATORS:
            continue  # an argument (pip install orchestrator), not a command
        end = next((k for k in range(i + 1, len(tokens)) if tokens[k] in SHELL_OPERATORS - {"--"}), len(tokens))
        commands.append(tokens[i + 1:end])
    return commands


def shell_commands() -> list[tuple[str, list[str]]]:
    found = []
    for block in _checked(*SHELL):
        for number, line in shell_lines(block):
            found += [(f"{block.path}:{number}", args) for args in orchestrator_commands(line)]
    return found


COMMANDS = shell_commands()


@pytest.mark.parametrize(("where", "args"), COMMANDS, ids=[f"{w}:{' '.join(a[:2])}" for w, a in COMMANDS])
def test_orchestrator_command_parses(where, args):
    from orchestrator.cli import build_parser
    from orchestrator.errors import SpecError, UserError
    from orchestrator.spec import parse_set_option

    try:
        parsed = build_parser().parse_args(args)
    except UserError as exc:
        pytest.fail(f"{where}: `orchestrator {' '.join(args)}` does not parse: {exc}")
    except SystemExit:
        pytest.fail(f"{where}: `orchestrator {' '.join(args)}` exits while parsing (--help?)")
    for option in getattr(parsed, "overrides", []) or []:
        try:
            parse_set_option(option)
        except SpecError as exc:
            pytest.fail(f"{where}: {exc}")
    if parsed.command == "torchrun":
        assert parsed.script, f"{where}: `orchestrator {' '.join(args)}` names no script"


def test_the_docs_hold_the_commands_they_show():
    """The extraction finds the commands (so an empty parametrization cannot pass for a check)."""
    shown = {args[0] for _, args in COMMANDS if args}
    assert {"run", "torchrun", "doctor", "status", "checkpoints", "up", "down"} <= shown, shown


# ---------------------------------------------------------------------------------------------
# Python, languages


@pytest.mark.parametrize("block", _checked("python", "py"), ids=_ids(_checked("python", "py")))
def test_python_block_compiles(block):
    compile(block.text, block.where, "exec")


def test_every_block_names_its_language():
    bare = [b.where for b in BLOCKS if not b.lang]
    assert not bare, "fenced blocks without a language (```text for synopses and output): " + ", ".join(bare)


# ---------------------------------------------------------------------------------------------
# Links


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        _, prose = parse_blocks(f.read())
    seen: dict[str, int] = {}
    found = set()
    for line in prose:
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def relative_links(path: str) -> list[tuple[int, str]]:
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        _, prose = parse_blocks(f.read())
    links = []
    for number, line in enumerate(prose, 1):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                links.append((number, target))
    return links


@pytest.mark.parametrize("path", doc_files())
def test_relative_links_resolve(path):
    broken = []
    for line, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(REPO, os.path.dirname(path), file_part)) if file_part \
            else os.path.join(REPO, path)
        if not os.path.exists(resolved):
            broken.append(f"{path}:{line}: {target} (no {os.path.relpath(resolved, REPO)})")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(f"{path}:{line}: {target} (no heading '#{anchor}' in {os.path.relpath(resolved, REPO)})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme_and_the_index():
    for index in ("README.md", "docs/README.md"):
        linked = {os.path.normpath(os.path.join(REPO, os.path.dirname(index), t.partition("#")[0]))
                  for _, t in relative_links(index)}
        missing = [p for p in doc_files()[1:] if os.path.join(REPO, p) not in linked and p != index]
        assert not missing, f"{index} links no page for: {', '.join(missing)}"


# ---------------------------------------------------------------------------------------------
# The checker itself


def test_the_checker_reads_markers_commands_and_slugs():
    text = ("intro\n\n<!-- not checked: shows an error -->\n\n```bash\norchestrator run\n```\n\n"
            "```console\n$ orchestrator status --json\nrun  finished\n```\n")
    blocks, _ = parse_blocks(text)
    assert [(b.lang, b.skipped) for b in blocks] == [("bash", True), ("console", False)]
    assert shell_lines(blocks[1]) == [(10, "orchestrator status --json")]
    assert shell_lines(parse_blocks("```sh\na \\\n  b\nc\n```")[0][0]) == [(2, "a    b"), (4, "c")]
    line = "ray job submit --working-dir . -- orchestrator run a.yaml --set x.y=1  # note"
    assert orchestrator_commands(line) == [["run", "a.yaml", "--set", "x.y=1"]]
    assert orchestrator_commands("pip install -e . && python -m orchestrator up; orchestrator down") == [["up"], ["down"]]
    assert orchestrator_commands("pip install 'orchestrator[deepspeed]' orchestrator") == []
    assert github_slug("A warm local cluster: `orchestrator up` / `orchestrator down`") == \
        "a-warm-local-cluster-orchestrator-up--orchestrator-down"
    assert github_slug("Start-up — `python bench/startup.py`") == "start-up--python-benchstartuppy"
    assert is_whole_spec({"name": "x", "torch": {}}) and not is_whole_spec({"name": "x", "torch": {}, "script": {}})
