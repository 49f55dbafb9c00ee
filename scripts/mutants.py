"""`make mutants`: plant each bug of a curated list (tests/mutants/mutants.toml) in a copy of the tree, one at a
time, run the test folders named for it, and say which bugs the tests caught and which survived.

    python scripts/mutants.py                     # every mutant
    python scripts/mutants.py --only moe-bias-leaks-into-weights,ep-sends-dropped
    python scripts/mutants.py --list              # ids and descriptions, nothing run

A mutant is caught when its tests fail (`pytest -x -q`, first failure stops) or run past `--timeout`. A mutant
caught only by a test that also fails on the unmutated tree proves nothing: those tests are rerun unmutated at
the end, and such a mutant counts as survived. The copy holds `git ls-files` (tracked and untracked, not
ignored); its `src` comes first on the path of the tests and of every process they start (PYTHONPATH), so the
worktree's own `.venv` runs the mutated code without reinstalling anything. Exit status 1 when a survivor is not
explained in the list (a `survives` reason), 2 for a list that does not apply to the tree.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "tests" / "mutants" / "mutants.toml"
FIELDS = ("id", "file", "original", "replacement", "tests", "description")
_FAILED = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)


@dataclass(frozen=True)
class Mutant:
    """One planted bug: in `file`, `original` (found exactly once) becomes `replacement`; `tests` must catch it."""

    id: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    description: str
    reviewer: bool = False
    """One of the six bugs the issue 29 review planted that the tests then missed."""
    survives: str = ""
    """Why the tests cannot catch it (an equivalent mutant), when they cannot."""


def load(path: Path = LIST, root: Path = ROOT) -> list[Mutant]:
    """The mutants of `path`, each checked against the tree at `root` (ValueError: what does not apply)."""
    entries = tomllib.loads(path.read_text())["mutant"]
    mutants, problems, seen = [], [], set()
    for entry in entries:
        missing = [f for f in FIELDS if f not in entry]
        name = entry.get("id", "?")
        if missing:
            problems.append(f"{name}: missing {', '.join(missing)}")
            continue
        mutant = Mutant(**{**entry, "tests": tuple(entry["tests"])})
        source = root / mutant.file
        count = source.read_text().count(mutant.original) if source.exists() else -1
        if mutant.id in seen:
            problems.append(f"{name}: the id is used twice")
        if count != 1:
            problems.append(f"{name}: the original is found {max(count, 0)} times in {mutant.file}, not once")
        if mutant.original == mutant.replacement:
            problems.append(f"{name}: the replacement changes nothing")
        problems += [f"{name}: no test path {t}" for t in mutant.tests if not (root / t.split("::")[0]).exists()]
        seen.add(mutant.id)
        mutants.append(mutant)
    if problems:
        raise ValueError("; ".join(problems))
    return mutants


def copy_tree(root: Path, into: Path) -> None:
    """The files git knows of (tracked, and untracked but not ignored) copied to `into`."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = root / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(copy / "src"), str(copy)]), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_ADDOPTS", None)
    return env


def run_tests(copy: Path, tests: list[str], timeout_s: float) -> tuple[str, float, str]:
    """(outcome: passed | failed | timeout | error, seconds, the first failing test id or a note). The paths run
    in the order given, one pytest each (pytest would fold a file into a folder named with it and run the folder's
    order), a folder without the files already run; the first failure ends it."""
    start = time.perf_counter()
    for index, path in enumerate(tests):
        ignored = [f"--ignore={t}" for t in tests[:index] if t.startswith(path.rstrip("/") + "/")]
        argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-o",
                "addopts=", "-rfE", *ignored, path]
        left = timeout_s - (time.perf_counter() - start)
        try:
            done = subprocess.run(argv, cwd=copy, env=environment(copy), capture_output=True, text=True,
                                  timeout=max(left, 1.0))
        except subprocess.TimeoutExpired:
            return "timeout", time.perf_counter() - start, f"over {timeout_s:.0f} s"
        failed = _FAILED.findall(done.stdout)
        if done.returncode == 1 and failed:
            return "failed", time.perf_counter() - start, failed[0]
        if done.returncode != 0:
            tail = " ".join((done.stdout + done.stderr).strip().splitlines()[-2:])
            return "error", time.perf_counter() - start, tail[-300:]
    return "passed", time.perf_counter() - start, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated mutant ids")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutant's tests (default 900)")
    parser.add_argument("--file", type=Path, default=LIST, help="the mutant list (default tests/mutants/mutants.toml)")
    args = parser.parse_args(argv)
    try:
        mutants = load(args.file)
    except (OSError, ValueError, KeyError) as error:
        print(f"mutants: {error}", file=sys.stderr)
        return 2
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {m.id for m in mutants})
        if unknown:
            print(f"mutants: no mutant {', '.join(unknown)}", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.id in wanted]
    if args.list:
        for m in mutants:
            print(f"{m.id:44} {m.file}: {m.description}")
        return 0

    results: list[tuple[Mutant, str, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="stepscope-mutants-") as folder:
        copy = Path(folder)
        copy_tree(ROOT, copy)
        probe = subprocess.run([sys.executable, "-c", "import stepscope; print(stepscope.__file__)"], cwd=copy,
                               env=environment(copy), capture_output=True, text=True)
        if not probe.stdout.strip().startswith(str(copy)):
            print(f"mutants: the copy's stepscope is not the one imported ({probe.stdout.strip()})", file=sys.stderr)
            return 2
        print(f"{len(mutants)} mutants, each on a copy of the tree in {copy}")
        for number, mutant in enumerate(mutants, 1):
            source = copy / mutant.file
            original = source.read_text()
            source.write_text(original.replace(mutant.original, mutant.replacement, 1))
            try:
                outcome, seconds, note = run_tests(copy, list(mutant.tests), args.timeout)
            finally:
                source.write_text(original)
            results.append((mutant, outcome, seconds, note))
            verdict = "SURVIVED" if outcome == "passed" else "caught"
            print(f"[{number:2}/{len(mutants)}] {verdict:8} {mutant.id:44} {seconds:6.1f} s  {note}", flush=True)
        # a test that fails on the unmutated tree caught nothing
        blamed = sorted({note for _, outcome, _, note in results if outcome == "failed"})
        broken = set()
        for test in blamed:
            outcome, _, _ = run_tests(copy, [test], args.timeout)
            if outcome != "passed":
                broken.add(test)
    return summary(results, broken)


def summary(results: list[tuple[Mutant, str, float, str]], broken: set[str]) -> int:
    caught = [(m, o, n) for m, o, _, n in results if o != "passed" and not (o == "failed" and n in broken)]
    survived = [m for m, o, _, n in results if o == "passed" or (o == "failed" and n in broken)]
    total = len(results)
    print()
    for test in sorted(broken):
        print(f"fails on the unmutated tree too (its catches do not count): {test}")
    errors = [(m, n) for m, o, n in caught if o == "error"]
    for mutant, note in errors:
        print(f"caught by an error rather than a failing assertion: {mutant.id}: {note}")
    unexplained = [m for m in survived if not m.survives]
    for mutant in survived:
        print(f"survived: {mutant.id} ({mutant.file}): {mutant.survives or 'NOT EXPLAINED: add a test or a reason'}")
    reviewer = [(m, o) for m, o, _, _ in results if m.reviewer]
    if reviewer:
        missed = [m.id for m, o in reviewer if o == "passed"]
        print(f"the six reviewer mutants: {len(reviewer) - len(missed)} of {len(reviewer)} caught"
              + (f" (missed: {', '.join(missed)})" if missed else ""))
    share = 100 * len(caught) / total if total else 0.0
    print(f"{total} mutants: {len(caught)} caught, {len(survived)} survived ({len(survived) - len(unexplained)} "
          f"explained): {share:.1f}% caught")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
