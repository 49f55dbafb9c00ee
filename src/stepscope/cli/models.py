"""`stepscope models`: the model presets with their sizes."""

from __future__ import annotations

import argparse

from stepscope.results.views import FORMATS

NAME = "models"
HELP = "list model presets"
DESCRIPTION = "List model presets."


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", default="table", choices=FORMATS)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.spec import get_preset, list_presets

    rows = []
    for name in list_presets():
        spec = get_preset(name)
        rows.append({"preset": name, "params": spec.param_count(), "d_model": spec.d_model,
                     "n_layers": spec.n_layers, "n_heads": spec.n_heads, "n_kv_heads": spec.n_kv_heads,
                     "d_ff": spec.d_ff, "vocab_size": spec.vocab_size, "context": spec.context_length,
                     "arch": f"{spec.norm}/{spec.mlp}/{spec.positions}" + ("/tied" if spec.tie_embeddings else "")})
    Printer(args.format).emit(rows)
    return 0
