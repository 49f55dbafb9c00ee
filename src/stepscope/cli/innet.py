"""`stepscope innet switch|bench|timeout-profile|simulate|train`: in-network aggregation as real software.

Parsing and printing only; each command validates everything, then calls one library function in
`stepscope.innet`. Nothing imports torch until a command that needs it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stepscope.cli.options import add_output_options, choice, non_negative_int, parse_list, positive_float, positive_int
from stepscope.cli.options.model import add_model_options
from stepscope.errors import UsageError
from stepscope.innet.options import add_job_options, convert, fraction, job_config, optional_k, size_bytes

BENCH_COLUMNS = ["size_bytes", "mode", "innet_latency_ms_median", "innet_algbw_Gbps", "gloo_latency_ms_median",
                 "gloo_algbw_Gbps", "innet_vs_gloo_speedup", "ok", "to", "kr", "re", "dup", "old", "bad",
                 "worker_retransmissions", "checked_elements", "wrong_elements", "unchecked_elements"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("innet", help="in-network aggregation: switch, bench, timeout profile, "
                                   "simulator, DDP training", description="In-network aggregation (SwitchML / "
                                   "straggler-aware DPA style) as real software over UDP.")
    commands = parser.add_subparsers(dest="innet_command", metavar="SUBCOMMAND", parser_class=type(parser))
    _register_switch(commands)
    _register_bench(commands)
    _register_timeout_profile(commands)
    _register_simulate(commands)
    _register_train(commands)
    parser.set_defaults(func=lambda args: _missing_subcommand(parser))


def _missing_subcommand(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def check_switch(args: argparse.Namespace) -> None:
    """A named switch must answer before any work starts (a wrong address is bad input). Under
    torchrun/Slurm every rank runs the command: they must share one switch instead of starting their own."""
    from stepscope.distributed.launch.launcher import external_launch_env

    if not args.switch and external_launch_env() is not None:
        raise UsageError("under torchrun or Slurm, start `stepscope innet switch` once and pass --switch HOST:PORT")
    if args.switch:
        from stepscope.innet.switch_process import probe

        probe(args.switch)


def _world(args: argparse.Namespace) -> int:
    """--world, or the world size torchrun/Slurm started (records must name the real one)."""
    from stepscope.distributed.launch.launcher import external_launch_env

    world = convert(args.world, positive_int, "--world")
    external = external_launch_env()
    return external["world_size"] if external else world


# ---- switch ------------------------------------------------------------------------------------------------
def _register_switch(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("switch", help="run the software aggregation switch (until Ctrl-C)",
                                 description="A standalone switch process serving several jobs over UDP.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for other machines)")
    parser.add_argument("--port", default="9000", help="UDP port (0: the OS picks; printed on start)")
    parser.add_argument("--max-jobs", default="64", help="jobs served at once")
    parser.add_argument("--max-job-mib", default="256", help="memory one job may take (MiB)")
    parser.add_argument("--idle-s", default="300", help="forget a job silent this long")
    parser.add_argument("--evict-after-s", default="5", help="with the table full, a new job may evict a job "
                        "that never completed a block and was silent this long")
    parser.add_argument("--duration-s", default=None, help="stop after this many seconds (default: Ctrl-C)")
    parser.add_argument("--stats-interval-s", default=None, help="print totals this often")
    parser.add_argument("--no-records", action="store_true", help="do not append records (a helper switch)")
    parser.add_argument("--stop-on-stdin-eof", action="store_true",
                        help="stop when stdin closes (a helper switch ends with the process that started it)")
    add_output_options(parser, resume=False)
    parser.set_defaults(func=run_switch)


def run_switch(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.innet import protocol
    from stepscope.innet.switch import SwitchConfig
    from stepscope.innet.switch_process import run_switch as serve
    from stepscope.results.environment import base_environment
    from stepscope.results.store import RecordStore, make_record

    port = convert(args.port, int, "--port")
    if not 0 <= port < 65_536:
        raise UsageError(f"--port must be 0..65535, got {port}")
    config = SwitchConfig(host=args.host, port=port, max_jobs=convert(args.max_jobs, positive_int, "--max-jobs"),
                          max_job_bytes=convert(args.max_job_mib, positive_int, "--max-job-mib") << 20,
                          idle_s=convert(args.idle_s, positive_float, "--idle-s"),
                          evict_after_s=convert(args.evict_after_s, positive_float, "--evict-after-s"))
    duration = convert(args.duration_s, positive_float, "--duration-s") if args.duration_s else None
    interval = convert(args.stats_interval_s, positive_float, "--stats-interval-s") if args.stats_interval_s else None
    store = None if args.no_records else RecordStore(args.out, "innet-switch").check_writable()
    try:
        run = serve(config, duration_s=duration, stats_interval_s=interval, stop_on_stdin_eof=args.stop_on_stdin_eof)
    except OSError as error:
        raise UsageError(f"cannot listen on {args.host}:{port}: {error.strerror or error}") from None
    printer = Printer(args.format)
    rows = [{"job": str(job_id), **counters} for job_id, counters in run.jobs.items()]  # an id, not a number
    printer.emit(rows, title=f"innet switch: {len(rows)} job(s) served in {run.seconds:.1f} s",
                 columns=["job", *protocol.COUNTERS])
    totals = {f"switch_{name}": value for name, value in run.counters.items()}
    printer.note("switch totals: " + ", ".join(f"{k.removeprefix('switch_')} {v}" for k, v in totals.items()))
    if store is not None:
        env = base_environment()
        for row in rows:
            store.append(make_record("innet-switch", {"host": args.host, "port": port, "job": row["job"]},
                                     {name: row[name] for name in protocol.COUNTERS}, env=env))
        store.append(make_record("innet-switch", {"host": args.host, "port": port, "job": None},
                                 {**totals, "served_s": run.seconds}, env=env))
    return 130 if run.interrupted else 0


# ---- bench ----------------------------------------------------------------------------------------------------
def _register_bench(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("bench", help="innet all-reduce vs gloo: latency and algbw vs size",
                                 description="In-network all-reduce through a switch process, per-op and batch, "
                                 "side by side with gloo all-reduce at the same world size.")
    parser.add_argument("--world", default="2", help="ranks (default 2)")
    parser.add_argument("--sizes", default="4K,64K,1M", help="all-reduce sizes in bytes (K, M suffixes)")
    parser.add_argument("--mode", default="per-op,batch", help="per-op, batch or both")
    parser.add_argument("--batch", default="8", help="ops issued together in batch mode")
    parser.add_argument("--warmup", default="2", help="untimed iterations per cell")
    parser.add_argument("--iters", default="10", help="timed iterations per cell")
    parser.add_argument("--dtype", default="f32", help="f32 (quantized) or i32 (exact sum)")
    parser.add_argument("--op", default="avg", help="avg or sum")
    parser.add_argument("-k", "--k", dest="k", default=None, help="fastest-K (default: world, no tolerance)")
    parser.add_argument("--preemptive", action="store_true", help="complete blocks at K without the timeout")
    parser.add_argument("--no-gloo", action="store_true", help="skip the gloo baseline")
    parser.add_argument("--check", action="store_true", help="verify every result; count wrong elements")
    parser.add_argument("--seed", default="0", help="seed of inputs and straggler decisions")
    add_job_options(parser)
    add_output_options(parser, resume=False)
    parser.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.innet.bench import BenchConfig
    from stepscope.innet.bench import run_bench as bench
    from stepscope.results.store import RecordStore

    world = _world(args)
    config = BenchConfig(world=world, sizes_bytes=tuple(parse_list(args.sizes, size_bytes, "--sizes")),
                         modes=tuple(parse_list(args.mode, choice("per-op", "batch"), "--mode")),
                         batch=convert(args.batch, positive_int, "--batch"),
                         warmup=convert(args.warmup, non_negative_int, "--warmup"),
                         iters=convert(args.iters, positive_int, "--iters"),
                         dtype=args.dtype, op=args.op, k=optional_k(args.k), preemptive=args.preemptive,
                         gloo=not args.no_gloo, check=args.check, seed=convert(args.seed, int, "--seed"),
                         job=job_config(args, world))
    config.validate()
    check_switch(args)
    store = RecordStore(args.out, "innet-bench").check_writable()
    printer = Printer(args.format)
    rows = bench(config, str(args.out), spawn_switch=args.switch is None)
    if rows is None:  # not rank 0 under torchrun/Slurm: rank 0 reports
        return 0
    k = config.k or world
    title = (f"innet bench: world {world}, k {config.job.k} values/packet ({config.job.pipes}-pipe), "
             f"slots {config.job.slots}, {config.dtype} {config.op}, "
             f"{'no-straggle' if k >= world else f'straggle-{k}'}, STO {config.job.resolved_sto_ticks} ticks")
    printer.emit(rows, title=title, columns=[c for c in BENCH_COLUMNS if any(c in r for r in rows)])
    printer.note(f"records: {store.path}")
    wrong = sum(row.get("wrong_elements", 0) for row in rows)
    if wrong:  # like `stepscope comm`: a benchmark whose results are wrong does not succeed
        print(f"stepscope: {wrong} element(s) of in-network results were wrong (see wrong_elements)", file=sys.stderr)
        return 1
    return 0


# ---- timeout-profile -----------------------------------------------------------------------------------------
def _register_timeout_profile(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("timeout-profile", help="ok/to counts per straggler timeout, DPA's table",
                                 description="Sweep the straggler timeout over three workloads on the emulator "
                                 "and print ok / to block counts per cell, plus throughput per (STO, RTO).")
    parser.add_argument("--world", default="3", help="ranks (default 3)")
    parser.add_argument("-k", "--k", dest="k", default=None, help="fastest-K (default world - 1)")
    parser.add_argument("--sto-ms", default="0.05,0.1,0.25,0.5,1,2.5,5,12.5", help="straggler timeouts (ms)")
    parser.add_argument("--rto-ms", default="2,20", help="worker retransmission timeouts (ms)")
    parser.add_argument("--size", default="16K", help="bytes per op")
    parser.add_argument("--ops", default="100", help="ops of the waited and batch workloads")
    parser.add_argument("--workload", default="one,waited,batch", help="workloads of the ok/to table")
    parser.add_argument("--seed", default="0", help="seed of the inputs")
    add_job_options(parser, timers=False)
    add_output_options(parser, resume=False)
    parser.set_defaults(func=run_timeout_profile)


def run_timeout_profile(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.innet.timeout_profile import WORKLOADS, ProfileConfig, profile_table, run_profile, throughput_table
    from stepscope.results.store import RecordStore

    world = _world(args)
    config = ProfileConfig(world=world, k=optional_k(args.k),
                           sto_ms=tuple(parse_list(args.sto_ms, float, "--sto-ms")),
                           rto_ms=tuple(parse_list(args.rto_ms, positive_float, "--rto-ms")),
                           size_bytes=convert(args.size, size_bytes, "--size"),
                           ops=convert(args.ops, positive_int, "--ops"),
                           workloads=tuple(parse_list(args.workload, choice(*WORKLOADS), "--workload")),
                           seed=convert(args.seed, int, "--seed"), job=job_config(args, world, timers=False))
    config.validate()
    check_switch(args)
    store = RecordStore(args.out, "innet-timeout-profile").check_writable()
    printer = Printer(args.format)
    rows = run_profile(config, str(args.out), spawn_switch=args.switch is None)
    if rows is None:  # not rank 0 under torchrun/Slurm: rank 0 reports
        return 0
    if args.format != "table":
        printer.emit(rows)
    else:
        straggler = config.job.faults.straggler
        printer.note(f"world {world}, straggle-{config.min_count}, {config.size_bytes} B per op, "
                     f"k {config.job.k} values/packet, slots {config.job.slots}"
                     + (f"; injected straggler: {straggler.describe()} (steps: ops of a cell)" if straggler else ""))
        printer.emit(profile_table(rows, config.ops), title=f"ok / to blocks (RTO {config.rto_ms[0]:g} ms)")
        printer.emit(throughput_table(rows), title=f"{config.ops} ops waited: Gb/s")
    printer.note(f"records: {store.path}")
    return 0


# ---- simulate --------------------------------------------------------------------------------------------------
SIM_SWEEPS = {  # option -> (SimConfig field, converter)
    "workers": ("workers", positive_int), "link_gbps": ("link_gbps", positive_float), "pipes": ("pipes", positive_int),
    "slots": ("slots", positive_int), "sto_ms": ("sto_ms", float), "rto_ms": ("rto_ms", positive_float),
    "workload": ("workload", str), "loss": ("loss", fraction), "op_bytes": ("op_bytes", size_bytes),
    "k": ("k", lambda text: None if text == "world" else positive_int(text)),
}
SIM_COLUMNS = ["workers", "link_gbps", "pipes", "slots", "workload", "sto_ms", "sto_ticks", "rto_ms", "k", "loss",
               "op_bytes", "ok", "to", "kr", "re", "dup", "old", "op_ms_mean", "algbw_Gbps",
               "ideal_innet_algbw_Gbps", "ideal_ring_algbw_Gbps", "sim_packets", "sim_packets_per_s"]


def _register_simulate(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("simulate", help="discrete-event model of the protocol at line rate",
                                 description="Simulate the protocol at line rate (no sockets): counters, "
                                 "throughput, ideal in-network and ring bounds. Comma lists sweep.")
    parser.add_argument("--workers", default="6", help="workers n, 2-1024")
    parser.add_argument("--link-gbps", default="100", help="link rate B, 10-400 Gb/s")
    parser.add_argument("--pipes", default="4", help="switch pipelines 1-4 (k = 64 x pipes)")
    parser.add_argument("--slots", default="512", help="slot pool size s")
    parser.add_argument("--window", default=None, help="outstanding packets per worker (default slots)")
    parser.add_argument("--op-bytes", default="100M", help="bytes per all-reduce (K, M, G suffixes)")
    parser.add_argument("--workload", default="one", help="one | waited | batch (ops each waited or issued together)")
    parser.add_argument("--ops", default="100", help="ops of the waited and batch workloads")
    parser.add_argument("--sto-ms", default="1", help="straggler timeout (ms, rounded up to ticks)")
    parser.add_argument("-k", "--k", dest="k", default="world", help="fastest-K (default world)")
    parser.add_argument("--preemptive", action="store_true", help="complete at K without the timer")
    parser.add_argument("--rto-ms", default="0.25", help="worker retransmission timeout (ms)")
    parser.add_argument("--rtt-us", default="10", help="base round-trip time (us)")
    parser.add_argument("--jitter-us", default="1", help="mean exponential one-way jitter (us)")
    parser.add_argument("--loss", default="0", help="loss probability per packet and direction")
    parser.add_argument("--stall-prob", default="1e-5", help="chance a host stalls before a packet")
    parser.add_argument("--stall-us", default="2000", help="mean (exponential) host stall (us)")
    parser.add_argument("--straggler", default=None, metavar="SPEC",
                        help="e.g. 'ranks=5;delay=2s;prob=1;steps=3-5' (delay before each op, or ops 3-5 "
                        "(0-based); add dist=exp for exponential)")
    parser.add_argument("--int32", action="store_true", help="int32 ops (no exponent prologue round)")
    parser.add_argument("--seed", default="0", help="random seed")
    add_output_options(parser, resume=False)
    parser.set_defaults(func=run_simulate)


def sim_configs(args: argparse.Namespace) -> list[Any]:
    import itertools

    from stepscope.innet.faults import StragglerSpec
    from stepscope.innet.simulator import SimConfig

    straggler: dict[str, Any] = {}
    if args.straggler:
        text, dist = args.straggler, "fixed"
        items = [i for i in text.split(";") if not i.strip().startswith("dist=")]
        for item in text.split(";"):
            if item.strip().startswith("dist="):
                dist = item.split("=", 1)[1].strip()
        spec = StragglerSpec.parse(";".join(items))
        straggler = dict(straggler_ranks=spec.ranks, straggler_ms=spec.delay_s * 1e3,
                         straggler_prob=spec.probability, straggler_dist=dist, straggler_steps=spec.steps)
    fixed = dict(window=convert(args.window, positive_int, "--window") if args.window else None,
                 ops=convert(args.ops, positive_int, "--ops"), preemptive=args.preemptive,
                 rtt_us=convert(args.rtt_us, float, "--rtt-us"),
                 jitter_us=convert(args.jitter_us, float, "--jitter-us"),
                 stall_prob=convert(args.stall_prob, float, "--stall-prob"),
                 stall_us=convert(args.stall_us, float, "--stall-us"), quantized=not args.int32,
                 seed=convert(args.seed, int, "--seed"), **straggler)
    sweeps = [(field, parse_list(getattr(args, option), converter, f"--{option.replace('_', '-')}"))
              for option, (field, converter) in SIM_SWEEPS.items()]
    configs = []
    for values in itertools.product(*(v for _, v in sweeps)):
        config = SimConfig(**fixed, **{field: value for (field, _), value in zip(sweeps, values)})
        config.validate()
        configs.append(config)
    return configs


def run_simulate(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.innet.simulator import simulate
    from stepscope.innet.timeout_profile import profile_table, throughput_table
    from stepscope.results.environment import base_environment
    from stepscope.results.store import RecordStore, make_record

    configs = sim_configs(args)
    store = RecordStore(args.out, "innet-simulate").check_writable()
    printer = Printer(args.format)
    env = base_environment()
    rows = []
    for config in configs:
        result = simulate(config)
        row = {**{c: getattr(config, c) for c in ("workers", "link_gbps", "pipes", "slots", "workload", "sto_ms",
                                                    "rto_ms", "loss", "op_bytes")}, "k": config.min_count, **result}
        rows.append(row)
        store.append(make_record("innet-simulate", config.to_dict(), result, env=env))
    columns = [c for c in SIM_COLUMNS if c in rows[0]]
    first_metric = columns.index("ok")  # settings before, results from here on
    varying = [c for c in columns[:first_metric] if len({str(r[c]) for r in rows}) > 1]
    shown = varying + columns[first_metric:] if len(rows) > 1 else columns
    printer.emit(rows, title=f"innet simulate: {len(rows)} point(s)", columns=shown)
    stos = {r["sto_ms"] for r in rows}
    if args.format == "table" and len(stos) > 1:
        ops = configs[0].ops
        printer.emit(profile_table(rows, ops), title="ok / to blocks (DPA's layout)")
        workload = "waited" if any(r["workload"] == "waited" for r in rows) else rows[0]["workload"]
        printer.emit(throughput_table(rows, workload=workload), title=f"{workload}: Gb/s")
    speed = sum(r["sim_packets"] for r in rows) / max(sum(r["wall_s"] for r in rows), 1e-9)
    printer.note(f"simulated {sum(r['sim_packets'] for r in rows):,} packets at {speed:,.0f} packets/s; "
                 f"records: {store.path}")
    return 0


# ---- train ----------------------------------------------------------------------------------------------------
TRAIN_COLUMNS = ["backend", "tolerance", "straggler", "step_ms_median", "fast_ranks_step_ms_median",
                 "straggler_step_ms_median", "timed_out_blocks", "min_contributors", "loss"]


def _register_train(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("train", help="DDP training with gradient buckets averaged by the switch",
                                 description="Train with DDP: gloo baseline, then the innet hook for K = world "
                                 "and K < world, each without and with an injected straggler. On CPU the model "
                                 "is shortened (1 layer unless --n-layers is given).")
    add_model_options(parser, default="gpt2")
    parser.add_argument("--world", default="4", help="ranks (default 4)")
    parser.add_argument("--batch", default="1", help="sequences per rank and step")
    parser.add_argument("--seq", default="32", help="tokens per sequence")
    parser.add_argument("--steps", default="2", help="timed steps per scenario")
    parser.add_argument("--warmup", default="1", help="untimed steps per scenario")
    parser.add_argument("-k", "--k", dest="k", default=None, help="fastest-K values (default world,world-1)")
    parser.add_argument("--ddp", default="torch", help="torch (DistributedDataParallel) or bucketed (DDPBucketed)")
    parser.add_argument("--bucket-mb", default="25", help="gradient bucket cap (MiB)")
    parser.add_argument("--no-gloo", action="store_true", help="skip the gloo baseline")
    parser.add_argument("--lr", default="1e-3", help="SGD learning rate")
    parser.add_argument("--seed", default="0", help="seed of weights and data")
    add_job_options(parser)
    parser.set_defaults(values_per_packet="16368", straggler="ranks=-1;delay=2s")
    add_output_options(parser, resume=False)
    parser.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from stepscope.cli.options.model import model_specs
    from stepscope.cli.output import Printer
    from stepscope.innet.faults import StragglerSpec
    from stepscope.innet.train import DDP_KINDS, TrainConfig
    from stepscope.innet.train import run_train as train
    from stepscope.results.store import RecordStore, make_record

    specs = model_specs(args)
    if len(specs) != 1:
        raise UsageError("innet train takes one model (no sweeps)")
    spec = specs[0] if args.override_n_layers is not None else specs[0].replace(n_layers=1)
    world = _world(args)
    ks = tuple(parse_list(args.k, positive_int, "-k")) if args.k else tuple(sorted({world, max(1, world - 1)},
                                                                                   reverse=True))
    straggler_text = args.straggler.replace("ranks=-1", f"ranks={world - 1}")
    job = job_config(argparse.Namespace(**{**vars(args), "straggler": None}), world)
    config = TrainConfig(model=spec, world=world, batch=convert(args.batch, positive_int, "--batch"),
                         seq=convert(args.seq, positive_int, "--seq"),
                         steps=convert(args.steps, positive_int, "--steps"),
                         warmup=convert(args.warmup, positive_int, "--warmup"), ks=ks,
                         straggler=StragglerSpec.parse(straggler_text), gloo=not args.no_gloo,
                         ddp=choice(*DDP_KINDS)(args.ddp),
                         bucket_mb=convert(args.bucket_mb, positive_float, "--bucket-mb"),
                         lr=convert(args.lr, positive_float, "--lr"), seed=convert(args.seed, int, "--seed"), job=job)
    config.validate()
    check_switch(args)
    store = RecordStore(args.out, "innet-train").check_writable()
    printer = Printer(args.format)
    outcome = train(config, spawn_switch=args.switch is None, store_dir=str(args.out))
    if outcome is None:  # not rank 0 under torchrun/Slurm: rank 0 reports
        return 0
    printer.note(f"{spec.describe()} | world {world}, batch {config.batch} x seq {config.seq}, {config.ddp} DDP, "
                 f"buckets {outcome['buckets']} values")
    for lines in outcome["log"]:
        for line in lines:
            printer.note(line)
    rows = outcome["rows"]
    printer.emit(rows, title=f"innet train: per-step time, {config.steps} steps per scenario "
                 f"(k {config.job.k} values/packet, STO {config.job.resolved_sto_ticks} ticks)",
                 columns=[c for c in TRAIN_COLUMNS if any(c in r for r in rows)])
    printer.note("replicas identical after training: " + ", ".join(
        f"{backend} {'yes' if same else 'NO'}" for backend, same in outcome["replicas_identical"].items()))
    from stepscope.measure.environment import torch_environment

    env = torch_environment("cpu", world)
    for row in rows:
        store.append(make_record("innet-train", {**outcome["config"], "backend": row["backend"], "k": row["k"],
                                                 "straggler": row["straggler"]},
                                 {k: v for k, v in row.items() if k not in ("backend", "k", "straggler")}, env=env))
    printer.note(f"records: {store.path}")
    return 0
