"""Collectives on a two-tier network (NVLink domains and the NICs between them), over numpy arrays: one element
per plan. `Network.collectives` picks the algorithms: "nccl" (NCCL 2.30's ring, double binary tree and PAT, and
its tuner's choice; the GPU presets) or "alpha-beta" (the textbook additive model: gloo, and what `calibrate` fits
to measured collectives). All-to-all, the deduplicated MoE dispatch and point-to-point sends are priced alike in
both. A collective of one rank or of no bytes takes no time.

The formulas, their sources and constants: docs/model.md, "Collectives"; the dispatchers: docs/perfmodel.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.spec.system import Network

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "dispatch", "p2p")


def members_per_domain(size: Any, stride: Any, domain_size: int) -> Any:
    """How many of a group's `size` ranks (spaced `stride` apart on rank numbers) share one fast domain."""
    size, stride = np.asarray(size), np.asarray(stride)
    inside = np.where(stride * size <= domain_size, size, np.maximum(1, domain_size // np.maximum(stride, 1)))
    return np.where((size <= 1) | (stride >= domain_size), 1, inside)


def _runs(nbytes: Any, n: Any) -> Any:
    return (np.asarray(n) > 1) & (np.asarray(nbytes) > 0)


def ring_all_reduce(nbytes: Any, n: Any, g: Any, network: Network) -> Any:
    domains = np.ceil(n / g)
    intra, inter = network.intra, network.inter
    return (2 * (g - 1) / g * nbytes / intra.bytes_per_s + 2 * (g - 1) * intra.latency_s
            + 2 * (domains - 1) / domains * (nbytes / g) / inter.bytes_per_s + 2 * (domains - 1) * inter.latency_s)


def tree_all_reduce(nbytes: Any, n: Any, g: Any, network: Network) -> Any:
    steps = 2 * np.ceil(np.log2(np.maximum(n, 1)))
    one_domain = np.asarray(g) >= np.asarray(n)
    intra, inter = network.intra, network.inter
    return np.where(one_domain, steps * intra.latency_s + 2 * nbytes / intra.bytes_per_s,
                    steps * inter.latency_s + 2 * nbytes / inter.bytes_per_s)


PAT_BANDWIDTH = 0.75
"""PAT's bandwidth relative to the ring's (NCCL tuning.cc: `busBw *= .75` for NCCL_ALGO_PAT)."""
PAT_LINEAR_S = 2.8e-6
"""PAT's latency per rank ("Still a linear part", tuning.cc: `2.8 * nRanks` µs)."""


def _ring_rate(n: Any, g: Any, network: Network) -> Any:
    """Seconds per byte a GPU sends around a ring: both tiers at once, its NIC carrying 1/g of it."""
    one_domain = np.asarray(g) >= np.asarray(n)
    both = np.maximum((g - 1) / g / network.intra.bytes_per_s, 1 / g / network.inter.bytes_per_s)
    return np.where(one_domain, 1 / network.intra.bytes_per_s, both)


def _nccl(candidates: list[tuple[Any, Any, Any] | None], network: Network) -> Any:
    """Of (bandwidth term, latency term, allowed) per algorithm (None: allowed nowhere): the time of the one NCCL's
    tuner picks (least X + L among the allowed), launch + max(X, L)."""
    present = [c for c in candidates if c is not None]
    if len(present) == 1:
        return network.launch_us * 1e-6 + np.maximum(present[0][0], present[0][1])
    best_cost, best_time = np.inf, np.inf
    for x, latency, allowed in present:
        cost = np.where(allowed, x + latency, np.inf)
        best_time = np.where(cost < best_cost, np.maximum(x, latency), best_time)
        best_cost = np.minimum(cost, best_cost)
    return network.launch_us * 1e-6 + best_time


def _ring(nbytes: Any, n: Any, g: Any, network: Network, passes: int) -> tuple[Any, Any, Any]:
    """(X, L, allowed) of NCCL's ring over `passes` passes: 1 for reduce-scatter or all-gather, 2 for all-reduce."""
    domains = np.ceil(n / g)
    volume = passes * (n - 1) / np.maximum(n, 1) * nbytes
    hops = passes * ((n - domains) * network.intra.latency_s + (domains - 1) * network.inter.latency_s)
    return volume * _ring_rate(n, g, network), hops, True


def _pat(nbytes: Any, n: Any, g: Any, network: Network) -> tuple[Any, Any, Any] | None:
    """(X, L, allowed) of NCCL's PAT reduce-scatter or all-gather: one GPU per domain only (None: nowhere)."""
    domains = np.ceil(n / g)
    allowed = (np.asarray(g) == 1) & (domains > 1)
    if not np.any(allowed):
        return None
    return ((n - 1) / np.maximum(n, 1) * nbytes / (PAT_BANDWIDTH * network.inter.bytes_per_s),
            np.log2(np.maximum(domains, 1)) * network.inter.latency_s / 3.5 + PAT_LINEAR_S * n, allowed)


def _tree(nbytes: Any, n: Any, g: Any, network: Network) -> tuple[Any, Any, Any] | None:
    """(X, L, allowed) of NCCL's all-reduce over double binary trees across domains, a chain inside each (None:
    no group spans domains)."""
    domains = np.ceil(n / g)
    if not np.any(domains > 1):
        return None
    depth = np.ceil(np.log2(np.maximum(domains, 1)))
    return (2 * nbytes * np.maximum(1 / network.intra.bytes_per_s, 1 / (g * network.inter.bytes_per_s)),
            2 * ((g - 1) * network.intra.latency_s + depth * network.inter.latency_s), domains > 1)


def all_reduce(nbytes: Any, n: Any, g: Any, network: Network) -> Any:
    """Seconds for an all-reduce of a `nbytes` buffer over n ranks, g per domain (NCCL: ring or tree as its tuner
    picks; α–β: the faster of ring and tree)."""
    if network.collectives == "nccl":
        t = _nccl([_ring(nbytes, n, g, network, 2), _tree(nbytes, n, g, network)], network)
    else:
        t = np.minimum(ring_all_reduce(nbytes, n, g, network), tree_all_reduce(nbytes, n, g, network))
    return np.where(_runs(nbytes, n), t, 0.0)


def reduce_scatter(nbytes: Any, n: Any, g: Any, network: Network) -> Any:
    """Seconds for a reduce-scatter (or all-gather) whose total size is `nbytes`."""
    if network.collectives == "nccl":
        t = _nccl([_ring(nbytes, n, g, network, 1), _pat(nbytes, n, g, network)], network)
        return np.where(_runs(nbytes, n), t, 0.0)
    domains = np.ceil(n / g)
    intra, inter = network.intra, network.inter
    t = ((g - 1) / g * nbytes / intra.bytes_per_s + (g - 1) * intra.latency_s
         + (domains - 1) / domains * (nbytes / g) / inter.bytes_per_s + (domains - 1) * inter.latency_s)
    return np.where(_runs(nbytes, n), t, 0.0)


all_gather = reduce_scatter


def all_to_all(nbytes: Any, n: Any, g: Any, network: Network) -> Any:
    """Seconds for an all-to-all in which every rank sends a `nbytes` buffer split evenly over the n ranks."""
    intra, inter = network.intra, network.inter
    n_safe = np.maximum(n, 1)
    t = (g - 1) / n_safe * nbytes / intra.bytes_per_s + np.where(np.asarray(g) > 1, intra.latency_s, 0.0)
    t = t + np.where(np.asarray(n) > np.asarray(g), (n - g) / n_safe * nbytes / inter.bytes_per_s + inter.latency_s,
                     0.0)
    return np.where(_runs(nbytes, n), t + _launch(network), 0.0)


def _launch(network: Network) -> float:
    """NCCL's fixed cost per call (0 in the α–β model, which folds it into α)."""
    return network.launch_us * 1e-6 if network.collectives == "nccl" else 0.0


def reachable_domains(domains: Any, groups: int = 0, groups_per_token: int = 0) -> Any:
    """Domains a token's experts may sit on: group-limited routing picks `groups_per_token` of `groups` equal
    expert groups, each spread over ceil(domains / groups) domains of the EP group; all domains without it."""
    if not groups:
        return domains
    return np.minimum(domains, groups_per_token * np.ceil(domains / groups))


def domains_reached(copies: float, allowed: Any) -> Any:
    """Mean distinct domains among `copies` uniform picks from `allowed` domains."""
    return allowed * (1.0 - (1.0 - 1.0 / allowed) ** copies)


def dispatch(nbytes: Any, n: Any, g: Any, network: Network, copies: float = 1.0,
             reach: tuple[int, int] = (0, 0)) -> Any:
    """Seconds for a deduplicating dispatch (or combine) of a rank's tokens (`nbytes`, one copy each) to
    `copies` experts each over n ranks, g per domain; `reach` = (expert groups, groups per token) of
    group-limited routing, (0, 0) without."""
    domains = np.ceil(n / g)
    remote = domains_reached(copies, reachable_domains(domains, *reach)) * (domains - 1) / domains
    inter = remote * nbytes / network.inter.bytes_per_s + network.inter.latency_s
    intra = (copies * (g - 1) / g * nbytes / network.intra.bytes_per_s
             + np.where(np.asarray(g) > 1, network.intra.latency_s, 0.0))
    t = np.where(domains == 1, all_to_all(copies * nbytes, n, g, network),
                 np.maximum(inter, intra) + _launch(network))
    return np.where(_runs(nbytes, n), t, 0.0)


def p2p(nbytes: Any, same_domain: Any, network: Network) -> Any:
    """Seconds to send `nbytes` from one rank to another."""
    intra, inter = network.intra, network.inter
    return _launch(network) + np.where(same_domain, intra.latency_s + nbytes / intra.bytes_per_s,
                                       inter.latency_s + nbytes / inter.bytes_per_s)


def collective_time(kind: str, nbytes: Any, n: Any, g: Any, network: Network, copies: float = 1.0,
                    reach: tuple[int, int] = (0, 0)) -> Any:
    """By kind (p2p: same domain when g >= 2, i.e. both ends share one; `copies` and `reach` are a
    deduplicating dispatch's)."""
    if kind == "all-reduce":
        return all_reduce(nbytes, n, g, network)
    if kind in ("reduce-scatter", "all-gather"):
        return reduce_scatter(nbytes, n, g, network)
    if kind == "all-to-all":
        return all_to_all(nbytes, n, g, network)
    if kind == "dispatch":
        return dispatch(nbytes, n, g, network, copies, reach)
    if kind == "p2p":
        return p2p(nbytes, np.asarray(g) >= 2, network)
    raise ValueError(f"unknown collective {kind!r}")
