"""The mutant list of `make mutants` applies to this tree: every original snippet is found exactly once in its
file, every replacement changes it, every named test path exists; at least 40 mutants over the packages issue 29
names, the six reviewer mutants among them, each to be caught by the tests of its own package. (Running them is
`make mutants`, too slow for `make test`.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_runner():
    spec = importlib.util.spec_from_file_location("mutants_runner", ROOT / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_mutant_applies_to_the_tree():
    mutants = load_runner().load()  # raises ValueError naming every mutant that does not apply
    assert len(mutants) >= 40
    packages = {"perfmodel", "traces", "nn", "distributed/expert_parallel", "distributed/tracing",
                "distributed/data_parallel", "results"}
    folders = {m.file.removeprefix("src/stepscope/").rsplit("/", 1)[0] for m in mutants}
    assert all(any(f == p or f.startswith(p + "/") for f in folders) for p in packages), folders


def test_the_reviewer_mutants_are_caught_by_their_own_package():
    reviewer = [m for m in load_runner().load() if m.reviewer]
    assert len(reviewer) == 6
    for mutant in reviewer:
        package = mutant.file.removeprefix("src/stepscope/").rsplit("/", 1)[0]
        package = package.split("/")[0] if package.startswith(("perfmodel", "traces", "nn")) else package
        assert all(t.startswith(f"tests/{package}") for t in mutant.tests), mutant.id


def test_a_snippet_that_is_not_in_its_file_is_refused(tmp_path):
    runner = load_runner()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\nx = 1\n")
    (tmp_path / "tests").mkdir()
    listed = tmp_path / "m.toml"
    listed.write_text('[[mutant]]\nid = "a"\nfile = "src/a.py"\noriginal = "x = 1"\nreplacement = "x = 2"\n'
                      'tests = ["tests"]\ndescription = "d"\n'
                      '[[mutant]]\nid = "b"\nfile = "src/a.py"\noriginal = "y = 1"\nreplacement = "y = 2"\n'
                      'tests = ["tests/none"]\ndescription = "d"\n')
    try:
        runner.load(listed, tmp_path)
    except ValueError as error:
        message = str(error)
    else:
        raise AssertionError("a list that does not apply was accepted")
    assert "a: the original is found 2 times" in message and "b: the original is found 0 times" in message
    assert "b: no test path tests/none" in message
