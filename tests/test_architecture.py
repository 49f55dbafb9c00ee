"""The import rules check themselves: the import-linter contracts of pyproject.toml say what docs/architecture.md's
table says, every package is under a contract, and `lint-imports` refuses an upward import put in on purpose."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.spec.system import tomllib  # tomli before Python 3.11

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "stepscope"


def table_rules() -> dict[str, set[str]]:
    """docs/architecture.md's "What may import what": package -> what it may import (dotted names kept)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## What may import what", 1)[1].split("\n## ", 1)[0]
    rules: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("package", "") or set(cells[0]) <= set("-: "):
            continue
        allowed = re.sub(r"\([^)]*\)", "", cells[1])  # the notes in brackets say how, not what
        names = set() if "nothing" in allowed or "everything" in allowed else {
            n.strip() for n in allowed.split(",") if n.strip()}
        for package in cells[0].split(","):
            rules[package.strip()] = names
    return rules


def packages() -> set[str]:
    """stepscope's top-level packages and modules (what the table must cover)."""
    return {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
            if (p.suffix == ".py" and not p.name.startswith("__")) or (p / "__init__.py").exists()}


def contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_the_table_covers_every_package() -> None:
    assert set(table_rules()) == packages()


def test_the_contracts_say_what_the_table_says() -> None:
    rules = table_rules()
    everything = packages()
    for package, allowed in rules.items():
        if package == "cli":  # imported by nothing: every other package's contract forbids it (checked below)
            continue
        mine = [c for c in contracts() if c["source_modules"] == [f"stepscope.{package}"]]
        assert mine and all(c["type"] == "forbidden" for c in mine), package
        forbidden = {m.removeprefix("stepscope.") for c in mine for m in c["forbidden_modules"]}
        ignored = {i for c in mine for i in c.get("ignore_imports", [])}
        allowed_packages = {name.split(".")[0] for name in allowed}
        dotted = {name for name in allowed if "." in name}
        # a package allowed only in part (report: distributed.collectives.alpha_beta) is forbidden but for that part
        expected = everything - {package} - (allowed_packages - {name.split(".")[0] for name in dotted})
        assert forbidden == expected, package
        assert ignored == {f"stepscope.{package}.** -> stepscope.{name}" for name in dotted}, package
        assert "cli" in forbidden, package


@pytest.mark.skipif(shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None,
                    reason="import-linter is in the lint extra")
def test_an_upward_import_breaks_lint_imports(tmp_path: Path) -> None:
    """A copy of the tree with three imports that point up: each breaks its package's contract, and only those."""
    copy = tmp_path / "src" / "stepscope"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "data"))
    upward = {"spec/workload.py": "import stepscope.cli.main",  # cli is imported by nothing
              "measure/timer.py": "import stepscope.kernels.flash_torch",  # kernels only through the registry
              "report/html.py": "import stepscope.distributed.launch"}  # of distributed, only the α-β fit
    for path, line in upward.items():
        assert (copy / path).exists(), path
        with open(copy / path, "a") as module:
            module.write(f"\n{line}  # noqa\n")
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache",
                           "--config", str(ROOT / "pyproject.toml")], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path / "src"), "PATH": "/usr/bin:/bin"}, timeout=120)
    broken = sorted(re.findall(r"^(.+?) BROKEN\b", done.stdout, re.M))
    assert done.returncode == 1, done.stdout + done.stderr
    assert broken == ["measure imports only errors, host, spec, results, nn",
                      "report reads only the alpha-beta fit of distributed (numpy, no torch)",
                      "spec imports only errors"], done.stdout
    assert f"Contracts: {len(contracts()) - 3} kept, 3 broken." in done.stdout
