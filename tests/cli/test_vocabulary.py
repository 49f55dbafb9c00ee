"""One vocabulary across commands, checked against its source, docs/vocabulary.md: every option of every command
(the parser `stepscope.cli.main` builds) is listed there and takes the kind of value listed, old spellings are
listed as such, no concept has two spellings, and every column name in src/stepscope spells its unit as the
units table does (one unit per quantity: its other spellings are refused)."""

from __future__ import annotations

import argparse
import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

from stepscope.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
VOCABULARY = ROOT / "docs" / "vocabulary.md"


# ---- the source: docs/vocabulary.md -------------------------------------------------------------------------
def _table(section: str) -> list[list[str]]:
    """The rows (cells) of the first table under heading `## <section>`."""
    text = VOCABULARY.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows[1:] if not set(row[0]) <= set("-: ")]


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def documented_options() -> dict[str, tuple[str, set[str]]]:
    """option -> (what it takes, its former spellings)."""
    return {_names(row[0])[0]: (row[1], set(_names(row[4]))) for row in _table("Options")}


def apart() -> list[set[str]]:
    return [set(_names(row[0])) for row in _table("Alike, but apart")]


def units() -> tuple[set[str], dict[str, str]]:
    """(the units, refused spelling -> the unit to write instead)."""
    allowed: set[str] = set()
    refused: dict[str, str] = {}
    for row in _table("Units"):
        mine = [u for u in _names(row[1])]
        allowed.update(mine)
        refused.update({r: mine[0] for r in _names(row[2])})
    return allowed, refused


def kept_names() -> set[str]:
    return {name for row in _table("Names kept") for name in _names(row[0])}


# ---- what the commands have ----------------------------------------------------------------------------------
@functools.cache
def command_options() -> list[tuple[str, argparse.Action]]:
    """(command, action) of every option of every command and subcommand, aliases included."""
    found = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())
            elif action.option_strings and action.dest != "help":
                found.append((path or "stepscope", action))

    walk(build_parser(), "")
    return found


def long_name(action: argparse.Action) -> str:
    return next(s for s in action.option_strings if s.startswith("--"))


def takes(action: argparse.Action) -> str:
    return "flag" if action.nargs == 0 else "[VALUE]" if action.nargs == "?" else "VALUE"


def canonical() -> dict[str, set[str]]:
    """Today's spellings -> the commands that have them."""
    out: dict[str, set[str]] = defaultdict(set)
    for command, action in command_options():
        if not hasattr(action, "alias_of"):
            out[long_name(action)].add(command)
    return out


# ---- options ------------------------------------------------------------------------------------------------
def test_every_option_is_listed_and_takes_what_the_table_says():
    listed = documented_options()
    unlisted = sorted({f"{c} {long_name(a)}" for c, a in command_options()
                       if not hasattr(a, "alias_of") and long_name(a) not in listed})
    assert unlisted == [], "options missing from docs/vocabulary.md"
    wrong = sorted(f"{command} {long_name(a)} takes {takes(a)}, the table says {listed[long_name(a)][0]}"
                   for command, a in command_options()
                   if not hasattr(a, "alias_of") and takes(a) != listed[long_name(a)][0])
    assert wrong == [], "one option, one kind of value"
    stale = sorted(set(listed) - set(canonical()))
    assert stale == [], "rows of docs/vocabulary.md no command has"


def test_old_spellings_are_listed_and_do_what_todays_do():
    listed = documented_options()
    by_command: dict[str, dict[str, argparse.Action]] = defaultdict(dict)
    for command, action in command_options():
        for name in action.option_strings:
            by_command[command].setdefault(name, action)
    checked = 0
    for command, action in command_options():
        if not hasattr(action, "alias_of"):
            continue
        old, new = action.option_strings[0], action.alias_of
        assert old in listed[new][1], f"{command} {old}: not listed as the former spelling of {new}"
        today = by_command[command][new]
        assert action.dest == today.dest and action.help == argparse.SUPPRESS, (command, old)
        if action.const is None or today.const is not None:  # compare --trace: the flag of `--kind trace`
            assert (action.nargs, action.type, action.choices) == (today.nargs, today.type, today.choices)
        checked += 1
    assert checked >= 15
    # and they parse: the former spelling fills today's destination
    parser = build_parser()
    assert parser.parse_args(["comm", "--timeout", "7"]).timeout_s == "7"
    assert parser.parse_args(["attention", "--dtype", "bf16", "--pass", "fwd"]).precision == "bf16"
    assert parser.parse_args(["report", "r", "--output", "x.html"]).out == "x.html"
    assert parser.parse_args(["compare", "--trace"]).kind == "trace"


def _concept(option: str, unit_names: set[str]) -> tuple[str, str]:
    """(the name without its unit, without a plural s): two spellings of one concept share one."""
    words = option[2:].split("-")
    if len(words) > 1 and words[-1] in unit_names:
        words = words[:-1]
    stem = "-".join(words)
    return stem, stem.removesuffix("s")


def doubled_concepts(options: set[str]) -> list[tuple[str, ...]]:
    """Spellings that differ only by a unit or a plural, unless listed as apart."""
    allowed, refused = units()
    together: dict[str, set[str]] = defaultdict(set)
    for option in options:
        for key in _concept(option, allowed | set(refused)):
            together[key].add(option)
    return sorted({tuple(sorted(spellings)) for spellings in together.values()
                   if len(spellings) > 1 and not any(spellings <= group for group in apart())})


def test_no_concept_has_two_spellings():
    assert doubled_concepts(set(canonical())) == [], "two spellings of one concept (or list them as apart)"


def test_the_concept_check_can_fail():
    assert doubled_concepts(set(canonical()) | {"--timeout", "--size"}) == [("--size", "--sizes"),
                                                                             ("--timeout", "--timeout-s")]


def test_option_units_are_spelled_as_the_units_table():
    allowed, refused = units()
    kept = kept_names()
    bad = sorted(f"{option}: write -{refused[option.rsplit('-', 1)[1]]}" for option in canonical()
                 if option.rsplit("-", 1)[1] in refused and option[2:].replace("-", "_") not in kept)
    assert bad == []


# ---- columns ------------------------------------------------------------------------------------------------
@functools.cache
def column_names() -> dict[str, set[str]]:
    """Names in src/stepscope that look like a record or table column -> where: snake-case string constants (a
    single word of four letters or more too: `TFLOPps`), and the snake-case parts of f-strings (`f"{phase}_TFLOPps"`
    gives `_TFLOPps`). results/renames.py, which holds the names replaced, is not read."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted((ROOT / "src" / "stepscope").rglob("*.py")):
        if path.name == "renames.py":
            continue
        tree = ast.parse(path.read_text())
        in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and re.fullmatch(r"_?[A-Za-z][A-Za-z0-9]*(_[A-Za-z0-9]+)*_?", node.value)):
                continue
            if "_" in node.value or (len(node.value) >= 4 and id(node) not in in_fstrings):
                found[node.value].add(str(path.relative_to(ROOT)))
    return found


def unit_words(name: str, unit_names: set[str]) -> list[tuple[int, str]]:
    """(position, word) of the unit words of a column name (a word after `per` is a denominator: tokens_per_s)."""
    words = name.strip("_").split("_")
    return [(i, w) for i, w in enumerate(words) if w in unit_names and not (i and words[i - 1] == "per")]


def misspelled_units(names: dict[str, set[str]]) -> list[str]:
    """Columns with a refused unit spelling, each with the unit to write."""
    _, refused = units()
    kept = kept_names()
    return sorted(f"{name} ({', '.join(sorted(where))}): write {refused[word]} for {word}"
                  for name, where in names.items() if name not in kept for _, word in unit_words(name, set(refused)))


def test_columns_spell_their_units_as_the_units_table():
    assert misspelled_units(column_names()) == []


def test_the_column_checks_can_fail():
    """The spellings this vocabulary replaced are refused, each naming the fix (and GFLOPps beside TFLOPps is one
    quantity in two units: the refused one names the other)."""
    old = {"size_B": {"x"}, "step_GFLOPps": {"x"}, "gloo_algbw_Gbps": {"x"}, "tokens_per_s": {"x"}}
    assert [line.split(":", 1)[1] for line in misspelled_units(old)] == [
        " write GBps for Gbps", " write bytes for B", " write TFLOPps for GFLOPps"]
    assert misspelled_units({"link_Gbps": {"x"}}) == []  # kept: a link's line rate
