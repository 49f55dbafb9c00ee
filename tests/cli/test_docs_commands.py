"""Every `stepscope ...` command line in README.md and docs/*.md parses with today's options.

The lines come from code blocks (`$ stepscope ...`, or `stepscope ...` in a shell block; `torchrun ... -m
stepscope`, `srun stepscope`, continuation lines joined), from inline code in the prose and from the
`<!-- output: ... -->` markers of `scripts/regen_docs_outputs.py`. Each is parsed by the parser `stepscope` itself
builds (`stepscope.cli.main.build_parser`), without running anything. A line with a `...` placeholder is a
fragment: only its command, subcommand and option names are checked; an inline `stepscope report` (a command's
name in prose) only names a command. A rename in the CLI fails here, naming the file, the line and the command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from stepscope.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- output: (?P<spec>.*) -->$")
FENCE = re.compile(r"^(```+|~~~+)\s*(?P<lang>[\w-]*)")
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "text"}
# the program word, after what may launch it: `$ `, VAR=value, torchrun/srun/nsys/taskset ..., `python -m`
PROGRAM = re.compile(r"(?:^|[\s/])stepscope\s+(?=[a-z-])")
INLINE = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class DocCommand:
    """One command line of a doc: where it is, its text from the program word on, whether it is inline prose."""

    path: Path
    line: int
    text: str
    inline: bool = False

    def where(self) -> str:
        shown = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{shown}:{self.line}: {self.text}"


def _command_text(line: str) -> str | None:
    """`... stepscope ARGS` -> `stepscope ARGS`, cut at a comment or a shell operator; None without the program."""
    match = PROGRAM.search(line)
    if not match:
        return None
    text = line[match.start():].lstrip(" /")
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote: keep the text, the parse step reports it
        return text
    kept: list[str] = []
    for word in words:
        if word in {"|", "||", "&&", ";", "&", ">", ">>", "2>&1"} or word.startswith((">", "2>")):
            break
        kept.append(word)
    return shlex.join(kept)


def doc_commands(path: Path) -> list[DocCommand]:
    """Every stepscope command line of one Markdown file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[DocCommand] = []
    fence: str | None = None
    lang = ""
    paragraph: list[tuple[int, str]] = []

    def flush_paragraph() -> None:
        if not paragraph:
            return
        joined = " ".join(text for _, text in paragraph)
        starts = []
        offset = 0
        for number, text in paragraph:
            starts.append((offset, number))
            offset += len(text) + 1
        for span in INLINE.finditer(joined):
            code = span.group(1).strip()
            if not re.match(r"^(?:[A-Z_]+=\S+\s+)*(?:srun\s+)?stepscope\s+[a-z-]", code):
                continue
            text = _command_text(code)
            number = max(n for start, n in starts if start <= span.start())
            if text:
                found.append(DocCommand(path, number, text, inline=True))
        paragraph.clear()

    index = 0
    while index < len(lines):
        number, line = index + 1, lines[index]
        index += 1
        fence_match = FENCE.match(line.strip())
        if fence is None and fence_match:
            flush_paragraph()
            fence, lang = fence_match.group(1), fence_match.group("lang")
            continue
        if fence is not None:
            if line.strip() == fence:
                fence = None
                continue
            if lang not in SHELL_LANGS:
                continue
            stripped = line.strip()
            is_prompt = stripped.startswith("$ ")
            command_line = stripped[2:] if is_prompt else stripped
            if not is_prompt and not re.match(r"^(?:[A-Z_]+=\S+\s+)*(?:stepscope|torchrun|srun|nsys|taskset)\s",
                                              command_line):
                continue  # an output line of a block, not a command
            while command_line.endswith("\\") and index < len(lines):
                command_line = command_line[:-1] + " " + lines[index].strip()
                index += 1
            text = _command_text(command_line)
            if text:
                found.append(DocCommand(path, number, text))
            continue
        marker = MARKER.match(line.strip())
        if marker:
            flush_paragraph()
            for command in marker.group("spec").split(" | ")[0].split(" && "):
                text = _command_text(command)
                if text:
                    found.append(DocCommand(path, number, text))
            continue
        if line.strip():
            paragraph.append((number, line.strip()))
        else:
            flush_paragraph()
    flush_paragraph()
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _check_names(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """A fragment (`stepscope profile ... --nvtx`): its command, subcommands and option names exist."""
    words = list(argv)
    while words and (choices := _subparsers(parser)):
        name = words.pop(0)
        if name not in choices:
            return f"no command {name!r}"
        parser = choices[name]
    known = set(parser._option_string_actions)
    for word in words:
        if word.startswith("-") and word not in {"-", "..."} and word.split("=", 1)[0] not in known:
            return f"unrecognized option {word.split('=', 1)[0]}"
    return None


def check(parser: argparse.ArgumentParser, command: DocCommand) -> str | None:
    """None when the command parses with today's options, else argparse's message."""
    try:
        argv = shlex.split(command.text)[1:]
    except ValueError as error:
        return f"not a shell line: {error}"
    if "..." in argv or (command.inline and len(argv) <= 2 and not any(w.startswith("-") for w in argv)):
        return _check_names(parser, [w for w in argv if w != "..."] if "..." in argv else argv[:1])
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parser.parse_args(argv)
    except SystemExit as stop:
        if stop.code not in (0, None):
            return stderr.getvalue().strip().splitlines()[-1] if stderr.getvalue().strip() else f"exit {stop.code}"
    return None


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def test_every_command_line_in_the_docs_parses(parser: argparse.ArgumentParser) -> None:
    commands = [command for path in DOC_FILES for command in doc_commands(path)]
    # the extraction must find the docs' examples, not silently nothing
    assert len(commands) >= 150, len(commands)
    assert {c.path.name for c in commands} >= {"README.md", "step.md", "comm.md", "perfmodel.md", "traces.md"}
    failures = [f"{command.where()}\n    {problem}" for command in commands
                if (problem := check(parser, command)) is not None]
    assert not failures, f"{len(failures)} of {len(commands)} doc command lines do not parse:\n" + "\n".join(failures)


def test_a_stale_option_is_reported_with_file_line_and_command(tmp_path: Path, parser) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Some prose with `stepscope step --model tiny --no-such-option 3` inline.\n\n"
        "```\n$ stepscope predict --model gpt3-175b --gpus 8 \\\n    --tp-size 8\n"
        "stepscope: error: this output line is not a command\n```\n\n"
        "<!-- output: stepscope plan --model tiny --gpus 2 && stepscope show out --bogus | head 3 -->\n"
        "A fragment: `stepscope profile ... --nvtx`, a name: `stepscope report`, a bad one: `stepscope reprot x`.\n",
        encoding="utf-8")
    commands = doc_commands(page)
    assert [(c.line, c.text) for c in commands] == [
        (1, "stepscope step --model tiny --no-such-option 3"),
        (4, "stepscope predict --model gpt3-175b --gpus 8 --tp-size 8"),
        (9, "stepscope plan --model tiny --gpus 2"),
        (9, "stepscope show out --bogus"),
        (10, "stepscope profile ... --nvtx"),
        (10, "stepscope report"),
        (10, "stepscope reprot x"),
    ]
    problems = {c.text: check(parser, c) for c in commands}
    assert "--no-such-option" in problems["stepscope step --model tiny --no-such-option 3"]
    assert "--tp-size" in problems["stepscope predict --model gpt3-175b --gpus 8 --tp-size 8"]
    assert problems["stepscope plan --model tiny --gpus 2"] is None
    assert "--bogus" in problems["stepscope show out --bogus"]
    assert problems["stepscope profile ... --nvtx"] is None
    assert problems["stepscope report"] is None
    assert "reprot" in problems["stepscope reprot x"]
    assert commands[0].where() == f"{page}:1: stepscope step --model tiny --no-such-option 3"
