"""`scripts/gpu_confirm.sh` runs only on a lent GPU, rarely: its stepscope command lines must keep parsing as the
CLI changes (an option renamed here would otherwise first fail on the GPU, in its scarce minutes)."""

import re
import shlex
import subprocess
from pathlib import Path

from stepscope.cli.main import build_parser

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu_confirm.sh"


def stepscope_lines() -> list[list[str]]:
    """The arguments after `$S` of every part, continuation lines joined, $RESULTS made a plain path."""
    text = SCRIPT.read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [re.match(r"part \d+ [\w-]+ \$S (.*)$", line) for line in text.splitlines()]
    return [shlex.split(m.group(1).replace("$RESULTS", "/tmp/results")) for m in lines if m]


def test_the_gpu_script_is_valid_bash_and_its_commands_parse():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    commands = stepscope_lines()
    assert {argv[0] for argv in commands} >= {"step", "attention", "profile", "memory"}
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv)
        assert args.device == "cuda", argv
