"""`stepscope op-rates`: a model's own matrix ops timed on this GPU beside the rates the performance model assumes.
The work and the records: `stepscope.measure.op_rates.benchmark` (`run_op_rates`)."""

from __future__ import annotations

import argparse
from functools import partial

from stepscope.cli.options import (
    add_config_option,
    add_device_option,
    add_output_options,
    non_negative_float,
    one_value,
    parse_list,
    positive_float,
    positive_int,
)
from stepscope.measure.op_rates.config import OpRatesConfig

NAME = "op-rates"
HELP = "time a model's own GEMMs and attention on this GPU beside the performance model's rates"
DESCRIPTION = ("Time the GEMMs of one transformer layer and of the output layer (three passes, bf16 and fp8), "
               "one GPU's expert GEMMs and causal attention per SDPA backend, in the shapes of validated runs, "
               "after a preheat that brings the GPU to its power-limited clock; each measured rate stands beside "
               "the rate --system's efficiency curve assumes. `stepscope calibrate --rates` fits a system to the "
               "records.")
COLUMNS = ["family", "model", "op", "direction", "m", "k", "n", "groups", "variant", "GFLOP", "measured_TFLOPps",
           "model_TFLOPps", "measured_of_peak", "model_of_peak"]


def add_options(parser: argparse.ArgumentParser) -> None:
    ops = parser.add_argument_group("ops (comma lists; none: no op of that family)")
    option = partial(add_config_option, ops, OpRatesConfig)
    option("--dense", "model:tp:tokens layouts: the GEMMs of one layer and of the output layer")
    option("--cubes", "n of n x n x n products")
    option("--moe", "model:ep:tokens layouts: one GPU's expert GEMMs")
    option("--sdpa", "model:tp:seq layouts: causal attention of one layer's local heads per SDPA backend")
    timing = parser.add_argument_group("timing")
    option = partial(add_config_option, timing, OpRatesConfig)
    option("--system", "system preset or TOML whose modelled rates stand beside the measured ones")
    option("--rounds", "rounds over every op (each op's median over rounds)")
    option("--min-batch-s", "the shortest timed batch of back-to-back calls of one op")
    option("--preheat-s", "seconds of large products first (the power-limited clock)")
    add_device_option(timing, OpRatesConfig)
    add_output_options(parser, resume=False)


def _layouts(text: str, option: str) -> tuple[str, ...]:
    return () if text == "none" else tuple(parse_list(text, str, option))


def op_rates_config(args: argparse.Namespace) -> OpRatesConfig:
    return OpRatesConfig(dense=_layouts(args.dense, "--dense"),
                         cubes=() if args.cubes == "none" else tuple(parse_list(args.cubes, positive_int, "--cubes")),
                         moe=_layouts(args.moe, "--moe"), sdpa=_layouts(args.sdpa, "--sdpa"), system=args.system,
                         rounds=one_value(args.rounds, positive_int, "--rounds"),
                         min_batch_s=one_value(args.min_batch_s, positive_float, "--min-batch-s"),
                         preheat_s=one_value(args.preheat_s, non_negative_float, "--preheat-s"), device=args.device)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.measure.op_rates.benchmark import run_op_rates

    config = op_rates_config(args)
    result = run_op_rates(config, args.out)
    printer = Printer(args.format)
    printer.emit(result.rows, title=f"{result.device_name}: preheat {result.preheat_TFLOPps:.3g} TFLOP/s; model: "
                                    f"{config.system}", columns=COLUMNS)
    for row in result.unsupported:
        printer.note(f"{row['model']} {row['op']} {row['direction']} {row['variant']}: not run ({row['note']})")
    for s in result.summary:
        printer.note(f"{s['model']} {s['precision']}: GEMMs at {s['measured_TFLOPps']:.3g} TFLOP/s measured vs "
                     f"{s['model_TFLOPps']:.3g} modelled: they take {s['measured_time_over_model']:.3f}x the "
                     f"model's time")
    printer.note(f"records: {result.path}")
    return 0
