"""`SystemSpec`: a machine the performance model predicts for (accelerator rates, memory, network tiers).

Pure Python, no torch and no numpy. Presets are TOML files in `stepscope/data/systems/` that users can
copy and edit; `load_system` accepts a preset name or a path, `system_to_toml` writes one back (the
calibration writes its fitted system this way). Every field has a unit in its name.

Compute-efficiency curve: `matrix_efficiency_by_GFLOP` lists knots [op size in GFLOP, fraction of the
matrix peak]. Between knots the efficiency is interpolated *harmonically* in log10(size), i.e. 1/η is
linear in log10(size); outside the knots it is clamped. Harmonic interpolation keeps the time of an op
(size / (η·peak)) linear in the knot values of 1/η, which is what lets `calibrate` fit them by least squares.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.spec.peaks import published_matrix_TFLOPps

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

PRECISION_KEYS = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class Accelerator:
    """One device: peak rates per dtype, memory, per-kernel overhead and the efficiency curve."""

    name: str
    """Device name, e.g. `NVIDIA A100-SXM4-80GB`."""
    matrix_TFLOPps: dict[str, float]
    """Dense matrix-multiply peak per precision (fp32 means PyTorch's default, non-TF32 fp32). A TOML without it: the
    published peaks of its `name` (`spec.peaks`)."""
    vector_TFLOPps: dict[str, float]
    """Elementwise (non-matrix) peak per precision."""
    hbm_GBps: float
    """Device-memory bandwidth (1e9 bytes/s)."""
    hbm_GiB: float
    """Device-memory capacity."""
    matrix_efficiency_by_GFLOP: tuple[tuple[float, float], ...]
    """Knots [op GFLOP, fraction of matrix peak], interpolated harmonically in log10(size)."""
    kernel_overhead_us: float = 5.0
    """Fixed cost of every kernel launch (framework dispatch plus launch latency)."""
    memory_efficiency: float = 0.85
    """Fraction of hbm_GBps that streaming (elementwise) kernels reach."""
    flash_efficiency: float = 0.8
    """Fused attention kernels reach this fraction of the matrix efficiency of an equal-sized GEMM."""
    flash2_efficiency: float = 0.0
    """FlashAttention-2's fraction of an equal-sized GEMM's efficiency, for stacks that run it (`spec.stack`); 0: the
    same as `flash_efficiency` (GPUs whose best fused kernel is FlashAttention-2)."""
    fp8_efficiency: float = 1.0
    """fp8 GEMMs reach this fraction of the efficiency of an equal-sized 16-bit GEMM (each of its own peak)."""
    reserved_GiB: float = 0.0
    """Device memory not available to the model (runtime context, communication buffers, fragmentation)."""
    power_limit_W: float = 0.0
    """The board power limit the GPU runs at (0: unknown)."""
    rated_power_W: float = 0.0
    """The power limit its matrix rates (curve, attention and fp8 efficiencies) were measured at; where the GPU runs
    at another limit its sustained matrix rate follows the clock that limit allows (`perfmodel/model/rates.py`).
    0: the same as `power_limit_W`."""
    gemm_k0: dict[str, float] = dataclasses.field(default_factory=dict)
    """Per precision, the inner dimension K0 at which a GEMM loses half its rate to fixed per-tile costs: a GEMM of
    inner dimension K reaches K/(K + K0) of the curve's efficiency (each output tile pays its pipeline fill and
    its output store against a main loop of K; `perfmodel/model/rates.py`). Absent: no K dependence."""
    sm_count: int = 0
    """Streaming multiprocessors (compute units); 0 = unknown. A communication kernel that holds some of them
    (DeepEP's dispatch) slows the GEMMs it runs beside by that share (`timing.overlapped_exchange`)."""

    def matrix_peak(self, precision: str) -> float:
        """Matrix FLOP/s for `precision`."""
        return 1e12 * _rate(self.matrix_TFLOPps, precision, "matrix_TFLOPps", self.name)

    def vector_peak(self, precision: str) -> float:
        """Elementwise FLOP/s for `precision`."""
        return 1e12 * _rate(self.vector_TFLOPps, precision, "vector_TFLOPps", self.name)

    @property
    def memory_bytes_per_s(self) -> float:
        """Achievable streaming bandwidth: hbm_GBps x memory_efficiency, in bytes/s."""
        return self.hbm_GBps * 1e9 * self.memory_efficiency

    @property
    def capacity_bytes(self) -> float:
        """Memory the model may use: capacity minus the reserve."""
        return (self.hbm_GiB - self.reserved_GiB) * 2**30

    def efficiency(self, flops: float) -> float:
        """Fraction of the matrix peak an op of `flops` FLOPs reaches (see the module docstring)."""
        knots = self.matrix_efficiency_by_GFLOP
        x = math.log10(max(flops, 1.0) / 1e9)
        xs = [math.log10(g) for g, _ in knots]
        if x <= xs[0]:
            return knots[0][1]
        if x >= xs[-1]:
            return knots[-1][1]
        for i in range(1, len(xs)):
            if x <= xs[i]:
                w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
                inverse = (1 - w) / knots[i - 1][1] + w / knots[i][1]
                return 1.0 / inverse
        return knots[-1][1]  # pragma: no cover - unreachable


@dataclass(frozen=True)
class NetworkTier:
    """One level of the network: per-GPU unidirectional bandwidth, per-message latency, efficiency."""

    name: str
    """e.g. `NVLink3 via NVSwitch`, `HDR InfiniBand`."""
    GBps: float
    """Unidirectional bandwidth per GPU (its share of NVLink, or its NIC), 1e9 bytes/s."""
    latency_us: float
    """α: latency of one message step (one hop of a ring)."""
    efficiency: float = 0.7
    """Fraction of GBps that collectives reach."""

    @property
    def bytes_per_s(self) -> float:
        """B of the α–β model: what collectives reach, GBps x efficiency, in bytes/s."""
        return self.GBps * 1e9 * self.efficiency

    @property
    def latency_s(self) -> float:
        """α of the α–β model, in seconds."""
        return self.latency_us * 1e-6


COLLECTIVE_MODELS = ("nccl", "alpha-beta")
"""How a system's collectives are priced (`perfmodel/model/collectives.py`): `nccl` picks ring, tree or PAT as
NCCL's tuner does and times the chosen algorithm with its chunks pipelined (latency shows only where it exceeds
the transfer) and both tiers moving at once; `alpha-beta` is the textbook additive ring/tree model (what gloo does,
and what `calibrate` fits to measured collectives)."""


@dataclass(frozen=True)
class Network:
    """Two tiers: a fast domain (NVLink) of `domain_size` GPUs, and the inter-domain network (NICs)."""

    domain_size: int
    """GPUs per fast domain (8 in a DGX/HGX node, 72 in an NVL72 rack); no "8 GPUs per node" constant elsewhere."""
    intra: NetworkTier
    """Links inside a domain."""
    inter: NetworkTier
    """Links between domains (one NIC per GPU)."""
    collectives: str = "alpha-beta"
    """How collectives are priced: one of COLLECTIVE_MODELS."""
    launch_us: float = 0.0
    """Fixed cost of one collective call beyond its per-hop latencies (NCCL's base latency: 8.4 µs for its ring
    and tree Simple protocol, `src/graph/tuning.cc` `baseLat`)."""
    collective_sms: int = 0
    """SMs a collective's kernels hold while it runs beside compute (NCCL: one per channel; 16 on 8-GPU H100
    nodes with InfiniBand, Megatron-Core's `DistributedDataParallelConfig.nccl_ub` table; NVIDIA/nccl#1649);
    the compute it overlaps gets the rest of the GPU (`schedule.overlapped_exchange`). 0: not modelled."""


@dataclass(frozen=True)
class SystemSpec:
    """A machine: one accelerator type and the network connecting many of them."""

    name: str
    """Preset or file name."""
    accelerator: Accelerator
    """The device every rank runs on."""
    network: Network
    """How devices talk."""
    description: str = ""
    """Where the numbers come from."""

    def replace(self, **changes: Any) -> SystemSpec:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict in the TOML layout (what `system_from_dict` reads)."""
        acc = dataclasses.asdict(self.accelerator)
        acc["matrix_efficiency_by_GFLOP"] = [list(k) for k in self.accelerator.matrix_efficiency_by_GFLOP]
        return {"name": self.name, "description": self.description, "accelerator": acc,
                "network": {"domain_size": self.network.domain_size, "collectives": self.network.collectives,
                            "launch_us": self.network.launch_us, "collective_sms": self.network.collective_sms,
                            "intra": dataclasses.asdict(self.network.intra),
                            "inter": dataclasses.asdict(self.network.inter)}}


def _rate(table: dict[str, float], precision: str, field: str, name: str) -> float:
    if precision in table:
        return table[precision]
    raise UsageError(f"system {name!r} has no {field} entry for {precision} (has {', '.join(table)})")


# ---- reading ---------------------------------------------------------------------------------------

def _check_keys(data: dict[str, Any], cls: type, where: str) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r} in {where}; known: {', '.join(sorted(known))}")
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}  # type: ignore[misc]
    missing = sorted(required - set(data))
    if missing:
        raise UsageError(f"missing key {missing[0]!r} in {where}")


def _positive(value: Any, where: str, *, allow_zero: bool = False, at_most: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise UsageError(f"{where} must be a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise UsageError(f"{where} must be {'non-negative' if allow_zero else 'positive'}, got {value!r}")
    if at_most is not None and value > at_most:
        raise UsageError(f"{where} must be at most {at_most}, got {value!r}")
    return float(value)


def _precision_table(value: Any, where: str) -> dict[str, Any]:
    """A table keyed by precision (possibly empty)."""
    if not isinstance(value, dict):
        raise UsageError(f"{where} must be a table such as {{ bf16 = 113, fp8 = 335 }}")
    for key in value:
        if key not in PRECISION_KEYS:
            raise UsageError(f"unknown precision {key!r} in {where}; known: {', '.join(PRECISION_KEYS)}")
    return value


def _rates(value: Any, where: str) -> dict[str, float]:
    if not isinstance(value, dict) or not value:
        raise UsageError(f"{where} must be a table such as {{ bf16 = 312, fp32 = 19.5 }}")
    for key in value:
        if key not in PRECISION_KEYS:
            raise UsageError(f"unknown precision {key!r} in {where}; known: {', '.join(PRECISION_KEYS)}")
    return {key: _positive(rate, f"{where}.{key}") for key, rate in value.items()}


def _curve(value: Any, where: str) -> tuple[tuple[float, float], ...]:
    if not isinstance(value, list) or not value or not all(isinstance(k, list) and len(k) == 2 for k in value):
        raise UsageError(f"{where} must be a list of [GFLOP, efficiency] pairs")
    knots = tuple((_positive(g, f"{where} size"), _positive(e, f"{where} efficiency")) for g, e in value)
    if any(b[0] <= a[0] for a, b in itertools.pairwise(knots)):
        raise UsageError(f"{where} sizes must increase strictly")
    return knots


def _tier(data: Any, where: str) -> NetworkTier:
    if not isinstance(data, dict):
        raise UsageError(f"[{where}] must be a table")
    _check_keys(data, NetworkTier, f"[{where}]")
    return NetworkTier(name=str(data["name"]), GBps=_positive(data["GBps"], f"{where}.GBps"),
                       latency_us=_positive(data["latency_us"], f"{where}.latency_us", allow_zero=True),
                       efficiency=_positive(data.get("efficiency", 0.7), f"{where}.efficiency", at_most=1.0))


def system_from_dict(data: dict[str, Any], source: str = "system") -> SystemSpec:
    """Validate a parsed TOML document (or `SystemSpec.to_dict()`) and build the SystemSpec."""
    top = {"name", "description", "accelerator", "network"}
    unknown = sorted(set(data) - top)
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r} in {source}; known: {', '.join(sorted(top))}")
    for key in ("name", "accelerator", "network"):
        if key not in data:
            raise UsageError(f"missing key {key!r} in {source}")
    acc, net = data["accelerator"], data["network"]
    if not isinstance(acc, dict) or not isinstance(net, dict):
        raise UsageError(f"[accelerator] and [network] must be tables in {source}")
    if "matrix_TFLOPps" not in acc and "name" in acc:  # the published peaks of its name (`spec.peaks`)
        published = published_matrix_TFLOPps(str(acc["name"]))
        if published is None:
            raise UsageError(f"missing key 'matrix_TFLOPps' in [accelerator] of {source} (no published peaks for "
                             f"{acc['name']!r})")
        acc = {**acc, "matrix_TFLOPps": published}
    _check_keys(acc, Accelerator, f"[accelerator] of {source}")
    defaults = {f.name: f.default for f in dataclasses.fields(Accelerator)}
    accelerator = Accelerator(
        name=str(acc["name"]),
        matrix_TFLOPps=_rates(acc["matrix_TFLOPps"], "accelerator.matrix_TFLOPps"),
        vector_TFLOPps=_rates(acc["vector_TFLOPps"], "accelerator.vector_TFLOPps"),
        hbm_GBps=_positive(acc["hbm_GBps"], "accelerator.hbm_GBps"),
        hbm_GiB=_positive(acc["hbm_GiB"], "accelerator.hbm_GiB"),
        matrix_efficiency_by_GFLOP=_curve(acc["matrix_efficiency_by_GFLOP"],
                                          "accelerator.matrix_efficiency_by_GFLOP"),
        kernel_overhead_us=_positive(acc.get("kernel_overhead_us", defaults["kernel_overhead_us"]),
                                     "accelerator.kernel_overhead_us", allow_zero=True),
        memory_efficiency=_positive(acc.get("memory_efficiency", defaults["memory_efficiency"]),
                                    "accelerator.memory_efficiency", at_most=1.0),
        flash_efficiency=_positive(acc.get("flash_efficiency", defaults["flash_efficiency"]),
                                   "accelerator.flash_efficiency"),
        flash2_efficiency=_positive(acc.get("flash2_efficiency", defaults["flash2_efficiency"]),
                                    "accelerator.flash2_efficiency", allow_zero=True),
        fp8_efficiency=_positive(acc.get("fp8_efficiency", defaults["fp8_efficiency"]),
                                 "accelerator.fp8_efficiency", at_most=1.0),
        reserved_GiB=_positive(acc.get("reserved_GiB", defaults["reserved_GiB"]), "accelerator.reserved_GiB",
                               allow_zero=True),
        power_limit_W=_positive(acc.get("power_limit_W", 0.0), "accelerator.power_limit_W", allow_zero=True),
        rated_power_W=_positive(acc.get("rated_power_W", 0.0), "accelerator.rated_power_W", allow_zero=True),
        gemm_k0={key: _positive(value, f"accelerator.gemm_k0.{key}", allow_zero=True)
                 for key, value in _precision_table(acc.get("gemm_k0", {}), "accelerator.gemm_k0").items()},
        sm_count=_count(acc.get("sm_count", defaults["sm_count"]), "accelerator.sm_count"))
    if accelerator.reserved_GiB >= accelerator.hbm_GiB:
        raise UsageError(f"accelerator.reserved_GiB ({accelerator.reserved_GiB}) must be below hbm_GiB "
                         f"({accelerator.hbm_GiB})")
    unknown = sorted(set(net) - {"domain_size", "intra", "inter", "collectives", "launch_us", "collective_sms"})
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r} in [network] of {source}")
    for key in ("domain_size", "intra", "inter"):
        if key not in net:
            raise UsageError(f"missing key {key!r} in [network] of {source}")
    domain = net["domain_size"]
    if isinstance(domain, bool) or not isinstance(domain, int) or domain <= 0:
        raise UsageError(f"network.domain_size must be a positive integer, got {domain!r}")
    collectives = net.get("collectives", "alpha-beta")
    if collectives not in COLLECTIVE_MODELS:
        raise UsageError(f"network.collectives must be one of {', '.join(COLLECTIVE_MODELS)}, got {collectives!r}")
    network = Network(domain_size=domain, intra=_tier(net["intra"], "network.intra"),
                      inter=_tier(net["inter"], "network.inter"), collectives=collectives,
                      launch_us=_positive(net.get("launch_us", 0.0), "network.launch_us", allow_zero=True),
                      collective_sms=_count(net.get("collective_sms", 0), "network.collective_sms"))
    return SystemSpec(name=str(data["name"]), accelerator=accelerator, network=network,
                      description=str(data.get("description", "")))


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def parse_system_toml(text: str, source: str = "system") -> SystemSpec:
    """Parse and validate TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"malformed TOML in {source}: {error}".splitlines()[0]) from None
    return system_from_dict(data, source)


# ---- presets ---------------------------------------------------------------------------------------

def _preset_files() -> dict[str, Any]:
    folder = resources.files("stepscope") / "data" / "systems"
    return {entry.name[:-5]: entry for entry in folder.iterdir() if entry.name.endswith(".toml")}


def list_systems() -> list[str]:
    """Names of the shipped system presets."""
    return sorted(_preset_files())


def preset_of_device(device_name: str) -> str | None:
    """The shipped preset whose accelerator is named `device_name` (e.g. a trace's `NVIDIA H100 80GB HBM3`), else
    None. Only presets whose text holds the name are parsed (TOML parsing is most of the cost)."""
    for name, entry in sorted(_preset_files().items()):
        text = entry.read_text(encoding="utf-8")
        if device_name and device_name in text and \
                parse_system_toml(text, f"preset {entry.name}").accelerator.name == device_name:
            return name
    return None


def load_system(name_or_path: str | Path) -> SystemSpec:
    """A preset by name (case-insensitive) or a TOML file by path."""
    text = str(name_or_path)
    presets = {name.lower(): entry for name, entry in _preset_files().items()}
    if text.lower() in presets:
        entry = presets[text.lower()]
        return parse_system_toml(entry.read_text(encoding="utf-8"), f"preset {entry.name}")
    path = Path(text)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise UsageError(f"no such system file: {path}")
        try:
            body = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"cannot read system file {path}: {error}") from None
        return parse_system_toml(body, str(path))
    raise UsageError(f"unknown system {text!r}; presets: {', '.join(list_systems())} (or a path to a .toml file)")


# ---- writing ---------------------------------------------------------------------------------------

def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(float(value)) if isinstance(value, float) else str(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def system_to_toml(system: SystemSpec, header: str = "") -> str:
    """TOML text that `parse_system_toml` reads back to an equal SystemSpec."""
    data = system.to_dict()
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += [f"name = {_toml_value(data['name'])}", f"description = {_toml_value(data['description'])}", "",
              "[accelerator]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in data["accelerator"].items()]
    lines += ["", "[network]"] + [f"{key} = {_toml_value(data['network'][key])}"
                                  for key in ("domain_size", "collectives", "launch_us", "collective_sms")]
    for tier in ("intra", "inter"):
        lines += ["", f"[network.{tier}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in data["network"][tier].items()]
    return "\n".join(lines) + "\n"
