"""Regenerate the command outputs shown in README.md and docs/*.md, so that what the docs print is what the
commands print today.

A block this script rewrites is marked in the Markdown source:

    <!-- output: stepscope predict --model gpt3-175b --gpus 1024 --out out -->
    ```
    $ stepscope predict --model gpt3-175b --gpus 1024 --out out
    ... (whatever the command printed)
    ```
    <!-- /output -->

The marker holds the command line(s) and, after ` | `, filters for an excerpt:

- `CMD1 && CMD2`: run both, in order; every command is shown as a `$` line, the output of the last one only;
- `| show "TEXT"`: keep the table (or block) whose title line contains TEXT, up to the blank line after it (and
  its `(continued)` parts);
- `| line "TEXT"`: keep the first line containing TEXT;
- `| head N`: keep the first N lines;
- `| exit N`: the command is expected to exit with N (an example of a refusal), not 0;
- `| raw`: the kept lines go into the page as they are, without a code block or `$` line (a `--format md`
  table, with the command named in the text beside it).

Pieces that are not adjacent in the output are separated by a `...` line. The commands of one Markdown file run
in one fresh working directory, in the order of the file, so a later block reads the records of an earlier one
(`stepscope show out` after `stepscope step ... --out out`). In that directory `docs` is the repository's docs/,
`tests/data` the repository's (its GPU traces) and `../shared` the repository's `../shared` (the shared GPU
traces), as from the repository root.

Two kinds of blocks are left alone: `<!-- gpu-output: DEVICE, DATE -->` ... `<!-- /gpu-output -->` (measured on
a GPU, which this machine may not have) and `<!-- measured: DEVICE, DATE -->` ... `<!-- /measured -->` (a CPU
measurement whose figures the text discusses, or one too long to rerun here: minutes of multi-process runs).

    python scripts/regen_docs_outputs.py                 # every marked block of README.md and docs/*.md
    python scripts/regen_docs_outputs.py docs/step.md    # one file
    python scripts/regen_docs_outputs.py --list          # what would run, and the blocks left alone
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600
MARKER = re.compile(r"^<!-- output: (?P<spec>.*?) -->\n(?P<body>.*?)^<!-- /output -->\n", re.S | re.M)
LEFT_ALONE = re.compile(r"^<!-- (?P<kind>gpu-output|measured): (?P<what>.*?) -->$", re.M)
FILTER = re.compile(r'^(?P<name>show|line|head|exit)\s+(?:"(?P<text>[^"]*)"|(?P<number>\d+))$|^(?P<raw>raw)$')


@dataclass
class Block:
    """One marked block: its commands, the excerpt filters and the exit code it expects."""

    spec: str
    commands: list[str]
    filters: list[tuple[str, str]] = field(default_factory=list)
    exit_code: int = 0
    raw: bool = False


def parse_spec(spec: str) -> Block:
    """`CMD && CMD | show "TEXT" | head 5` -> a Block; a malformed filter is an error naming it."""
    command_part, *filter_parts = spec.split(" | ")
    block = Block(spec, [c.strip() for c in command_part.split(" && ")])
    for part in filter_parts:
        match = FILTER.match(part.strip())
        if not match:
            raise ValueError(f"unknown filter {part.strip()!r} in marker {spec!r}")
        if match.group("raw"):
            block.raw = True
            continue
        value = match.group("text") if match.group("text") is not None else match.group("number")
        if match.group("name") == "exit":
            block.exit_code = int(value)
        else:
            block.filters.append((match.group("name"), value))
    return block


def excerpt(lines: list[str], filters: list[tuple[str, str]]) -> list[str]:
    """The lines the filters keep, in output order, `...` between pieces that are not adjacent."""
    if not filters:
        return lines
    spans: list[tuple[int, int]] = []
    for name, value in filters:
        if name == "head":
            spans.append((0, min(int(value), len(lines))))
            continue
        start = next((i for i, line in enumerate(lines) if value in line), None)
        if start is None:
            raise ValueError(f"no line of the output contains {value!r}")
        spans.append((start, _block_end(lines, start) if name == "show" else start + 1))
    kept: list[str] = []
    end_of_last = 0
    for start, end in sorted(spans):
        if start > end_of_last or (not kept and start > 0):
            kept.append("...")
        kept.extend(lines[max(start, end_of_last):end])
        end_of_last = max(end_of_last, end)
    if end_of_last < len(lines) and any(line.strip() for line in lines[end_of_last:]):
        kept.append("...")
    return kept


def _block_end(lines: list[str], start: int) -> int:
    """The end of the table titled at `start`: the first blank line after its rule (─), else after `start`; a
    table too wide for 100 columns prints in parts titled `(continued)`, which belong to it."""
    rule = next((i for i in range(start, len(lines)) if "─" in lines[i]), None)
    after = rule if rule is not None else start
    end = next((i for i in range(after, len(lines)) if not lines[i].strip()), len(lines))
    following = next((i for i in range(end, len(lines)) if lines[i].strip()), None)
    if following is not None and lines[following].strip() == "(continued)":
        return _block_end(lines, following)
    return end


def stepscope_argv(command: str) -> tuple[list[str], dict[str, str]]:
    """The argv that runs `command` with this checkout's Python (`stepscope ...` -> `python -m stepscope ...`),
    and the variables of its leading `NAME=VALUE` words (`TRITON_INTERPRET=1 stepscope attention ...`)."""
    argv = shlex.split(command)
    env: dict[str, str] = {}
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
        name, value = argv.pop(0).split("=", 1)
        env[name] = value
    if argv and argv[0] == "stepscope":
        return [sys.executable, "-m", "stepscope", *argv[1:]], env
    raise ValueError(f"only stepscope commands run here, not {command!r}")


def run_block(block: Block, workdir: Path) -> str:
    """Run the block's commands in `workdir`; the text of its code block (`$` lines and the last output)."""
    shown: list[str] = []
    for i, command in enumerate(block.commands):
        last = i == len(block.commands) - 1
        argv, env = stepscope_argv(command)
        done = subprocess.run(argv, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=TIMEOUT_S, env={**os.environ, "PYTHONHASHSEED": "0", **env})
        expected = block.exit_code if last else 0
        if done.returncode != expected:
            raise RuntimeError(f"`{command}` exited {done.returncode} (expected {expected}):\n{done.stdout[-2000:]}")
        if not block.raw:
            shown.append(f"$ {command}")
        if last:
            lines = [line.rstrip() for line in done.stdout.rstrip("\n").splitlines()]
            while lines and not lines[0].strip():
                lines.pop(0)
            kept = excerpt(lines, block.filters)
            shown.extend(_squeeze_blank_runs([line for line in kept if line != "..."] if block.raw else kept))
    while shown and not shown[-1]:
        shown.pop()
    return "\n".join(shown) + "\n"


def _squeeze_blank_runs(lines: list[str]) -> list[str]:
    """At most one blank line in a row (the tables end with one, the next title starts with one)."""
    squeezed: list[str] = []
    for line in lines:
        if line or (squeezed and squeezed[-1]):
            squeezed.append(line)
    return squeezed


def make_workdir(root: Path) -> Path:
    """A fresh directory where `docs` and `../shared` resolve as they do from the repository root."""
    workdir = root / "run"
    workdir.mkdir()
    (workdir / "docs").symlink_to(REPO / "docs")
    (workdir / "tests").mkdir()
    (workdir / "tests" / "data").symlink_to(REPO / "tests" / "data")  # the shipped GPU traces
    shared = (REPO / ".." / "shared").resolve()
    if shared.exists():
        (root / "shared").symlink_to(shared)
    return workdir


def regenerate(path: Path, listing: bool) -> tuple[int, int, list[str]]:
    """Rewrite the marked blocks of one file; (blocks rewritten, blocks left alone, failures)."""
    text = path.read_text(encoding="utf-8")
    left_alone = LEFT_ALONE.findall(text)
    blocks = [(match, parse_spec(match.group("spec"))) for match in MARKER.finditer(text)]
    name = path.relative_to(REPO)
    if listing:
        for _, block in blocks:
            print(f"{name}: run   {block.spec}")
        for kind, what in left_alone:
            print(f"{name}: leave {kind}: {what}")
        return len(blocks), len(left_alone), []
    failures: list[str] = []
    pieces: list[str] = []
    position = 0
    with tempfile.TemporaryDirectory(prefix="stepscope-docs-") as tmp:
        workdir = make_workdir(Path(tmp))
        for match, block in blocks:
            started = time.perf_counter()
            try:
                body = run_block(block, workdir)
                fenced = body if block.raw else f"```\n{body}```\n"
                replacement = f"<!-- output: {block.spec} -->\n{fenced}<!-- /output -->\n"
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as error:
                failures.append(f"{name}: {block.spec}: {error}")
                replacement = match.group(0)
            print(f"{name}: {time.perf_counter() - started:6.1f} s  {block.spec}", flush=True)
            pieces.append(text[position:match.start()])
            pieces.append(replacement)
            position = match.end()
    pieces.append(text[position:])
    new_text = "".join(pieces)
    if new_text != text:
        path.write_text(new_text, encoding="utf-8")
    return len(blocks), len(left_alone), failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default README.md and docs/*.md)")
    parser.add_argument("--list", action="store_true", help="list the blocks instead of running them")
    args = parser.parse_args()
    files = [path.resolve() for path in args.files] or [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    started = time.perf_counter()
    rewritten = kept = 0
    failures: list[str] = []
    for path in files:
        done, alone, failed = regenerate(path, args.list)
        rewritten, kept, failures = rewritten + done, kept + alone, failures + failed
    verb = "to run" if args.list else "regenerated"
    print(f"{rewritten - len(failures)} block(s) {verb}, {kept} left alone (gpu-output, measured), "
          f"{len(failures)} failed, {time.perf_counter() - started:.0f} s")
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
