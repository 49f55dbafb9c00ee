"""α–β model of collectives on a two-tier network (scalar reference; `vectorized.py` has the array form).

A group of n ranks spans N = ceil(n/g) fast domains with g members in each. Hierarchical algorithms do
the intra-domain part on NVLink and the inter-domain part on each GPU's own NIC with 1/g of the data:
- ring all-reduce:  2(g−1)/g·S/B_intra + 2(g−1)·α_intra + 2(N−1)/N·(S/g)/B_inter + 2(N−1)·α_inter
  (the factor 2 holds in every case, also when the group fits in one tier; the published LBNL model
  dropped it there);
- tree all-reduce (what libraries pick for small messages): 2·ceil(log2 n)·α + 2·S/B on the slowest tier
  the group uses; the model takes the faster of ring and tree;
- reduce-scatter / all-gather (S = the total, gathered size): (g−1)/g·S/B_intra + (g−1)·α_intra
  + (N−1)/N·(S/g)/B_inter + (N−1)·α_inter;
- all-to-all (S = one rank's send buffer, nccl-tests' size; each peer gets S/n): the (g−1)/n·S bound for
  its own domain go over NVLink, the (n−g)/n·S for the others over its NIC, one after the other:
  (g−1)/n·S/B_intra + α_intra + (n−g)/n·S/B_inter + α_inter (a tier's α only where the group uses it); in
  one domain this is nccl-tests' (n−1)/n bus-bandwidth factor;
- point-to-point: α + S/B on the tier joining the two ranks.
B = tier bandwidth x tier efficiency (per GPU, unidirectional), α = tier latency.
"""

from __future__ import annotations

import math

from stepscope.spec.system import Network

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "p2p")


def members_per_domain(size: int, stride: int, domain_size: int) -> int:
    """How many of a group's `size` ranks (spaced `stride` apart) share one fast domain."""
    if size <= 1:
        return 1
    if stride >= domain_size:
        return 1
    if stride * size <= domain_size:
        return size
    return max(1, domain_size // stride)


def ring_all_reduce(nbytes: float, n: int, g: int, network: Network) -> float:
    if n <= 1:
        return 0.0
    domains = math.ceil(n / g)
    intra, inter = network.intra, network.inter
    t = 2 * (g - 1) / g * nbytes / intra.bytes_per_s + 2 * (g - 1) * intra.latency_s
    t += 2 * (domains - 1) / domains * (nbytes / g) / inter.bytes_per_s + 2 * (domains - 1) * inter.latency_s
    return t


def tree_all_reduce(nbytes: float, n: int, g: int, network: Network) -> float:
    if n <= 1:
        return 0.0
    tier = network.intra if g >= n else network.inter
    return 2 * math.ceil(math.log2(n)) * tier.latency_s + 2 * nbytes / tier.bytes_per_s


def all_reduce(nbytes: float, n: int, g: int, network: Network) -> float:
    """Seconds for an all-reduce of a `nbytes` buffer over n ranks, g per domain (best of ring and tree)."""
    if n <= 1:
        return 0.0
    return min(ring_all_reduce(nbytes, n, g, network), tree_all_reduce(nbytes, n, g, network))


def reduce_scatter(nbytes: float, n: int, g: int, network: Network) -> float:
    """Seconds for a reduce-scatter (or all-gather) whose total size is `nbytes`."""
    if n <= 1:
        return 0.0
    domains = math.ceil(n / g)
    intra, inter = network.intra, network.inter
    t = (g - 1) / g * nbytes / intra.bytes_per_s + (g - 1) * intra.latency_s
    t += (domains - 1) / domains * (nbytes / g) / inter.bytes_per_s + (domains - 1) * inter.latency_s
    return t


all_gather = reduce_scatter


def all_to_all(nbytes: float, n: int, g: int, network: Network) -> float:
    """Seconds for an all-to-all in which every rank sends a `nbytes` buffer split evenly over the n ranks."""
    if n <= 1:
        return 0.0
    intra, inter = network.intra, network.inter
    t = (g - 1) / n * nbytes / intra.bytes_per_s + (intra.latency_s if g > 1 else 0.0)
    return t + ((n - g) / n * nbytes / inter.bytes_per_s + inter.latency_s if n > g else 0.0)


def p2p(nbytes: float, same_domain: bool, network: Network) -> float:
    """Seconds to send `nbytes` from one rank to another."""
    tier = network.intra if same_domain else network.inter
    return tier.latency_s + nbytes / tier.bytes_per_s


def collective_time(kind: str, nbytes: float, n: int, g: int, network: Network) -> float:
    """Dispatch by kind (p2p: same domain when g >= 2, i.e. both ends share one)."""
    if kind == "all-reduce":
        return all_reduce(nbytes, n, g, network)
    if kind in ("reduce-scatter", "all-gather"):
        return reduce_scatter(nbytes, n, g, network)
    if kind == "all-to-all":
        return all_to_all(nbytes, n, g, network)
    if kind == "p2p":
        return p2p(nbytes, g >= 2, network)
    raise ValueError(f"unknown collective {kind!r}")
