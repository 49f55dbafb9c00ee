"""The nccl-tests text format: write `comm` records as nccl-tests prints them, and read nccl-tests logs
(real ones, or ours) back into `comm` records (`stepscope comm --import FILE`).

Writing: one block per backend, op, world size, dtype, mode (and redop); one line per size with the
out-of-place and in-place columns (`N/A` where a placement was not measured or is unsupported);
the footer counts out-of-bounds results and averages busbw like nccl-tests. One difference is stated
in the block's first comment line: stepscope's time is the max over ranks (nccl-tests averages over
ranks unless run with `-a 3`). An all_to_allv block (rccl-tests' `alltoallv_perf`) has a second
stepscope line with its skew and seed, read back on import.

Reading is driven by the column header line, so it accepts the current layout (size count type redop
root | time algbw busbw #wrong | ...), the 2019-2021 one (no root column, `error` instead of `#wrong`),
older ones without redop, and NCCL 1's (bytes N type op ... res). Lines that are not results (MPI
warnings, NCCL INFO, interleaved output) are skipped. The op comes from `# Collective test starting:
all_reduce_perf`, the world size from the `#  Rank N` lines; logs without them need hints.
Imported points are nccl-tests' batch mode (iters calls issued, one stream sync); their time is the
mean over ranks (`time_us_mean`).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.distributed.collectives.ops import NCCL_TYPE_NAMES, REDUCING_OPS, ROOTED_OPS, comm_dtype
from stepscope.errors import UsageError
from stepscope.results.store import make_record

PERF_NAMES = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf", "reduce_scatter": "reduce_scatter_perf",
              "broadcast": "broadcast_perf", "reduce": "reduce_perf", "all_to_all": "alltoall_perf",
              "all_to_allv": "alltoallv_perf", "barrier": "barrier_perf"}  # alltoallv_perf: rccl-tests' name
OPS_BY_PERF = {perf: op for op, perf in PERF_NAMES.items()}
_STEPSCOPE_LINE = re.compile(r"^# stepscope comm: backend (\S+), mode (\S+), time = (\w+) over ranks")
_SKEW_LINE = re.compile(r"^# stepscope all_to_allv: skew (\S+), seed (-?\d+)")


# ---- writing -------------------------------------------------------------------------------------
def format_time_us(time_us: float) -> str:
    """nccl-tests' time column: 0, 1 or 2 decimals depending on magnitude."""
    if time_us >= 10000:
        return f"{time_us:7.0f}"
    if time_us >= 100:
        return f"{time_us:7.1f}"
    return f"{time_us:7.2f}"


def write_nccl_tests(records: Iterable[dict[str, Any]]) -> str:
    """Measured `comm` point records as nccl-tests text (fits and other kinds are ignored)."""
    blocks: OrderedDict[tuple, list[dict[str, Any]]] = OrderedDict()
    for record in records:
        config = record.get("config", {})
        if record.get("kind") != "comm" or config.get("record") != "point":
            continue
        key = (config["backend"], config["op"], config["world_size"], config["dtype"], config["mode"],
               config.get("redop"), config.get("root", -1), config.get("iters"), config.get("warmup"),
               config.get("skew"), config.get("seed"))
        blocks.setdefault(key, []).append(record)
    # like nccl-tests, nothing is printed for what did not run (a dtype or op the backend lacks)
    return "".join(_block(rows) for rows in blocks.values() if any(_measured(r) for r in rows))


def _measured(record: dict[str, Any]) -> bool:
    return record.get("status") in ("ok", "mismatch")


def _block(records: list[dict[str, Any]]) -> str:
    first = records[0]
    config, env = first["config"], first.get("env", {})
    op = config["op"]
    perf = PERF_NAMES.get(op, f"{op}_perf")
    sizes = [r["config"]["size_bytes"] for r in records]
    measured_max = any("time_us_max" in r.get("metrics", {}) for r in records)
    lines = [f"# stepscope comm: backend {config['backend']}, mode {config['mode']}, time = "
             f"{'max' if measured_max else 'mean'} over ranks (nccl-tests default: mean)",
             f"# Collective test starting: {perf}",
             f"# nThread 1 nGpus 1 minBytes {min(sizes)} maxBytes {max(sizes)} step: 0(list) warmup iters: "
             f"{config.get('warmup', 0)} iters: {config.get('iters', 0)} agg iters: 1 validation: 1 graph: 0",
             "#", "# Using devices"]
    if config.get("skew") is not None:  # all_to_allv: the split, right after the header (read back on import)
        lines.insert(1, f"# stepscope all_to_allv: skew {config['skew']:g}, seed {config.get('seed', 0)} (Zipf "
                        "popularity over ranks; size = bytes each rank sends, count = mean elements per peer)")
    ranks = env.get("ranks") or [{}] * int(config["world_size"])
    for rank, place in enumerate(ranks):
        lines.append(f"#  Rank {rank:2d} Group  0 Pid {place.get('pid', 0):6d} on {place.get('host', '-'):>10s} "
                     f"device {str(place.get('device', '-')):>2s} [-] {env.get('device_name', '')}".rstrip())
    lines += ["#",
              f"# {'':10s}  {'':12s}  {'':8s}  {'':6s}  {'':6s}           out-of-place                       in-place",
              f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  "
              f"{'time':>7s}  {'algbw':>6s}  {'busbw':>6s} {'#wrong':>6s}  "
              f"{'time':>7s}  {'algbw':>6s}  {'busbw':>6s} {'#wrong':>6s}",
              f"# {'(B)':>10s}  {'(elements)':>12s}  {'':8s}  {'':6s}  {'':6s}  {'(us)':>7s}  {'(GB/s)':>6s}  "
              f"{'(GB/s)':>6s}  {'':5s}  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':5s}"]
    by_size: OrderedDict[int, dict[bool, dict[str, Any]]] = OrderedDict()
    for record in records:
        place = bool(record["config"].get("in_place"))
        by_size.setdefault(record["config"]["size_bytes"], {})[place] = record
    failed, busbws = 0, []
    for size, placed in by_size.items():
        if not any(_measured(r) for r in placed.values()):
            continue
        any_record = next(iter(placed.values()))
        dtype = any_record["config"]["dtype"]
        type_name = comm_dtype(dtype).nccl_name if _known_dtype(dtype) else dtype
        redop = any_record["config"].get("redop", "sum") if op in REDUCING_OPS else "none"
        root = any_record["config"].get("root", 0) if op in ROOTED_OPS else -1
        line = f"{size:12d}  {any_record['config'].get('count', 0):12d}  {type_name:>8s}  {redop:>6s}  {root:6d}"
        for in_place in (False, True):
            record = placed.get(in_place)
            metrics = (record or {}).get("metrics", {})
            time_us = metrics.get("time_us_max", metrics.get("time_us_mean"))
            if record is None or not _measured(record) or time_us is None:
                line += f"  {'N/A':>7s}  {'N/A':>6s}  {'N/A':>6s}  {'N/A':>5s}"
                continue
            algbw, busbw = metrics.get("algbw_GBps") or 0.0, metrics.get("busbw_GBps") or 0.0
            wrong = metrics.get("wrong")
            failed += 1 if wrong else 0
            busbws.append(busbw)
            wrong_text = "N/A" if wrong is None else f"{wrong:g}"
            line += f"  {format_time_us(time_us)}  {algbw:6.2f}  {busbw:6.2f}  {wrong_text:>5s}"
        lines.append(line)
    average = sum(busbws) / len(busbws) if busbws else 0.0
    lines += [f"# Out of bounds values : {failed} {'FAILED' if failed else 'OK'}",
              f"# Avg bus bandwidth    : {average:g} ", "#", f"# Collective test concluded: {perf}", "#", ""]
    return "\n".join(lines) + "\n"


def _known_dtype(name: str) -> bool:
    try:
        comm_dtype(name)
        return True
    except KeyError:
        return False


# ---- reading -------------------------------------------------------------------------------------
@dataclass
class ParsedRow:
    """One result line: leading columns plus (time_us, algbw, busbw, wrong, error) per placement."""

    size_bytes: int
    count: int
    type_name: str
    redop: str | None
    root: int | None
    placements: dict[bool, dict[str, float | None]]


@dataclass
class ParsedBlock:
    """Result lines under one column header, with what the log said about them."""

    op: str | None
    world_size: int | None
    iters: int | None
    warmup: int | None
    backend: str
    mode: str
    time_stat: str
    env: dict[str, Any]
    rows: list[ParsedRow] = field(default_factory=list)
    split: tuple[float, int] | None = None
    """all_to_allv's (skew, seed) when a stepscope log says it."""


_LEAD_NAMES = {"size": "size", "bytes": "size", "count": "count", "n": "count", "type": "type", "redop": "redop",
               "op": "redop", "root": "root"}
_RANK_LINE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\S+)\s+on\s+(\S+)\s+device\s+(\S+)"
                        r"\s*(?:\[[^\]]*\]\s*)?(.*)$")


def parse_nccl_tests(text: str) -> list[ParsedBlock]:
    """Every result block of an nccl-tests log (several runs may be concatenated)."""
    blocks: list[ParsedBlock] = []
    op: str | None = None
    backend, mode, time_stat = "nccl", "batch", "mean"
    split: tuple[float, int] | None = None
    ranks: dict[int, dict[str, Any]] = {}
    iters = warmup = None
    env: dict[str, Any] = {}
    current: ParsedBlock | None = None
    lead: list[str] = []
    groups: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if "rccl-tests" in stripped:
            backend = "rccl"
        if (match := _STEPSCOPE_LINE.match(stripped)) is not None:
            backend, mode, time_stat = match.group(1), match.group(2), match.group(3)
            split = None
            continue
        if (match := _SKEW_LINE.match(stripped)) is not None:
            split = (float(match.group(1)), int(match.group(2)))
            continue
        if "Collective test starting:" in stripped:
            op = _op_of(stripped.split("Collective test starting:", 1)[1].strip())
            ranks, current = {}, None
            continue
        if stripped.startswith("# nccl-tests version") or stripped.startswith("# rccl-tests version"):
            env["tests_version"] = stripped.lstrip("# ").strip()
            continue
        if stripped.startswith("NCCL version") or stripped.startswith("RCCL version"):
            env["nccl_version"] = stripped
            continue
        if stripped.lstrip("# ").startswith("nThread"):
            found = re.search(r"warmup iters:\s*(\d+)\s+iters:\s*(\d+)", stripped)
            if found:
                warmup, iters = int(found.group(1)), int(found.group(2))
            ranks, current = {}, None
            continue
        if (match := _RANK_LINE.match(stripped)) is not None:
            ranks[int(match.group(1))] = {"host": match.group(3), "pid": _int_or(match.group(2)),
                                          "device": match.group(4), "name": match.group(5).strip()}
            continue
        tokens = stripped.lstrip("#").split()
        if "algbw" in tokens and "busbw" in tokens and ("time" in tokens or "cputime" in tokens):
            first_time = next(i for i, t in enumerate(tokens) if t in ("time", "cputime"))
            lead = [_LEAD_NAMES.get(t.lower(), t.lower()) for t in tokens[:first_time]]
            groups = [tokens[i + 3] for i in range(first_time, len(tokens) - 3, 4)]
            names = sorted({r["name"] for r in ranks.values() if r["name"]})
            block_env = dict(env, hosts=sorted({r["host"] for r in ranks.values()}),
                             ranks=[ranks[k] for k in sorted(ranks)])
            if names:
                block_env["device_name"] = ", ".join(names)
            current = ParsedBlock(op=op, world_size=(max(ranks) + 1) if ranks else None, iters=iters, warmup=warmup,
                                  backend=backend, mode=mode, time_stat=time_stat, env=block_env, split=split)
            blocks.append(current)
            continue
        if current is None or not stripped or stripped.startswith("#"):
            continue
        row = _parse_row(tokens, lead, groups)
        if row is not None:
            current.rows.append(row)
    return [b for b in blocks if b.rows]


def _op_of(program: str) -> str:
    name = Path(program.split()[0]).name if program else program
    return OPS_BY_PERF.get(name, name.removesuffix("_perf"))


def _int_or(text: str, default: int = 0) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def _number(text: str) -> float | None:
    if text.upper() == "N/A":
        return None
    return float(text)


def _parse_row(tokens: list[str], lead: list[str], groups: list[str]) -> ParsedRow | None:
    """A result line, or None for anything else (noise that happens to sit between results)."""
    if len(tokens) != len(lead) + 4 * len(groups) or not lead or "size" not in lead:
        return None
    values = dict(zip(lead, tokens[:len(lead)], strict=True))
    try:
        size, count = int(values["size"]), int(values.get("count", "0"))
        placements: dict[bool, dict[str, float | None]] = {}
        for index, wrong_name in enumerate(groups[:2]):
            time_us, algbw, busbw, last = (_number(t) for t in tokens[len(lead) + 4 * index:len(lead) + 4 * index + 4])
            counted = wrong_name.lower() in ("#wrong", "wrong")
            placements[index == 1] = {"time_us": time_us, "algbw": algbw, "busbw": busbw,
                                      "wrong": None if (last is None or not counted) else last,
                                      "error": None if counted else last}
    except ValueError:
        return None
    root = values.get("root")
    return ParsedRow(size, count, values.get("type", "?"), values.get("redop"), _int_or(root, -1) if root else None,
                     placements)


def import_records(path: str | Path, *, op_hint: str | None = None,
                   world_hint: int | None = None) -> list[dict[str, Any]]:
    """`comm` records from an nccl-tests log file (see the module docstring); UsageError when the file
    is unreadable, holds no results, or does not say its op / world size and no hint was given."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror or error}") from None
    blocks = parse_nccl_tests(text)
    if not blocks:
        raise UsageError(f"{path}: no nccl-tests results found (expected a '# size count type ...' header "
                         "followed by result lines)")
    records = []
    for block in blocks:
        op = block.op or op_hint
        world = block.world_size or world_hint
        if op is None:
            raise UsageError(f"{path}: the log does not say which collective it measured; pass --op")
        if world is None:
            raise UsageError(f"{path}: the log has no '#  Rank' lines to count ranks; pass --world N")
        for row in block.rows:
            records.extend(_row_records(row, block, op, world, str(path)))
    return records


def _row_records(row: ParsedRow, block: ParsedBlock, op: str, world: int, source: str) -> list[dict[str, Any]]:
    out = []
    dtype = NCCL_TYPE_NAMES.get(row.type_name, row.type_name)
    for in_place, values in row.placements.items():
        if values["time_us"] is None:
            continue
        config: dict[str, Any] = {"record": "point", "backend": block.backend, "op": op, "world_size": world,
                                  "size_bytes": row.size_bytes, "requested_bytes": row.size_bytes, "count": row.count,
                                  "dtype": dtype, "mode": block.mode, "in_place": in_place, "iters": block.iters,
                                  "warmup": block.warmup}
        if op in ROOTED_OPS:
            config["root"] = row.root if row.root is not None and row.root >= 0 else 0
        if row.redop not in (None, "sum", "none"):
            config["redop"] = row.redop
        if block.split is not None and op == "all_to_allv":
            config["skew"], config["seed"] = block.split
        config["source"] = source
        metrics: dict[str, Any] = {f"time_us_{block.time_stat}": values["time_us"], "algbw_GBps": values["algbw"],
                                   "busbw_GBps": values["busbw"]}
        if values["wrong"] is not None:
            metrics["wrong"] = int(values["wrong"])
        if values["error"] is not None:
            metrics["max_error"] = values["error"]
        status = "mismatch" if metrics.get("wrong") else "ok"
        out.append(make_record("comm", config, metrics, status=status,
                               env=dict(block.env, imported_from=source, world_size=world)))
    return out
