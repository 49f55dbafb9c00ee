"""A discrete-event model of the same protocol at line rate, without sockets: n workers on links of B Gb/s
to one switch, k = 64 x pipes values per packet, s slots, a window, the exponent prologue, a straggler
timeout (in ticks), fastest-K, fixed retransmission timeouts with backoff, loss, jitter, host stalls and
stragglers. It produces the switch's counters (ok, to, kr, re, dup, old) and the throughput.

Vectorized event processing: the stream is processed in segments of L <= min(s, window, prologue) packets.
Every dependency of a packet (its slot's previous packet, the window, the packet that carries its
exponent) lies at least L packets back, so a whole segment (n workers x L packets) is computed at once
with numpy: ready times, NIC serialization (a running max), arrivals, completion per block (sorted
arrivals: first, K-th, last vs the timer), multicast delivery, retransmission and duplicate counts.

With `switch_Mpps` / `worker_Mpps` (a software switch or host: measured packet rates) the switch processes the
contributions one at a time in arrival order, each costing its receive and its share of the results sent, and a
worker's host spends its per-packet time before the wire (the slower of the two paces it).

Approximations (stated; the counters are checked against the emulator on small cases): a link sends in
order of readiness within a segment; retransmissions do not occupy the link; a late worker that already
has a block's result skips it (as the emulator's worker does), and the link time it frees is given back
to the following segments only (the segment's own completions are not recomputed).
Times reported are those of the fastest K workers (K = n: all), from each worker's own op issue.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from stepscope.innet.sim.config import SimConfig
from stepscope.innet.wire.protocol import HEADER_BYTES, TICK_S, sto_ticks_from_ms

# Per-packet bytes on an Ethernet wire besides our header and payload: preamble+SFD 8, inter-frame gap 12,
# Ethernet header 14, FCS 4, IPv4 20, UDP 8.
WIRE_OVERHEAD_BYTES = 8 + 12 + 14 + 4 + 20 + 8


def ideal_bounds(config: SimConfig) -> dict[str, float]:
    """Line-rate limits: in-network algbw = B x payload efficiency (each worker sends and receives S
    once); ring all-reduce algbw = B x n / (2(n-1)) (each worker sends 2(n-1)/n x S)."""
    payload = 4 * config.values
    efficiency = payload / (payload + HEADER_BYTES + WIRE_OVERHEAD_BYTES)
    n = config.workers
    line_GBps = config.link_Gbps / 8  # a link's line rate is sold in bits per second
    return {"ideal_innet_algbw_GBps": line_GBps * efficiency,
            "ideal_ring_algbw_GBps": line_GBps * n / (2 * (n - 1)),
            "payload_efficiency": efficiency}


def simulate(config: SimConfig) -> dict[str, Any]:
    """Run the model; returns counters, simulated seconds, algbw and the simulator's own speed."""
    config.validate()
    wall = time.perf_counter()
    model = _Model(config)
    model.run()
    wall = time.perf_counter() - wall
    total_bytes = config.op_bytes * model.op_count
    out: dict[str, Any] = {name: int(value) for name, value in model.counters.items()}
    out.update({
        "sto_ticks": model.sto_ticks,
        "blocks": model.blocks_total,
        "sim_s": model.end_time,
        "op_ms_mean": float(np.mean(model.op_times)) * 1e3,  # per op, from each worker's own issue
        "algbw_GBps": total_bytes / model.end_time / 1e9 if model.end_time > 0 else float("inf"),
        "sim_packets": model.packets,
        "wall_s": wall,
        "sim_packets_per_s": model.packets / wall if wall > 0 else float("inf"),
    })
    out.update(ideal_bounds(config))
    return out


def _serialize(ready: np.ndarray, tx: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start times on a link per row: in order of readiness, each packet starts at max(ready, the end of
    the previous one), the first not before `free`. Returns the start times and the new `free`: the end
    of the last packet that had to queue (a packet that found the link idle, e.g. one delayed by a loss,
    does not hold back the next segment's packets, which in reality go out before it)."""
    order = np.argsort(ready, axis=1)
    ready_sorted = np.take_along_axis(ready, order, axis=1)
    tx_sorted = np.take_along_axis(tx, order, axis=1)
    before = np.cumsum(tx_sorted, axis=1) - tx_sorted
    shifted = np.concatenate([free[:, None], ready_sorted - before], axis=1)
    start_sorted = np.maximum.accumulate(shifted, axis=1)[:, 1:] + before
    start = np.empty_like(start_sorted)
    np.put_along_axis(start, order, start_sorted, axis=1)
    queued = start_sorted > ready_sorted
    ends = np.where(queued, start_sorted + tx_sorted, -np.inf)
    return start, np.maximum(free, ends.max(axis=1))


class _Model:
    """The vectorized simulation state (see the module docstring)."""

    def __init__(self, c: SimConfig) -> None:
        self.c = c
        self.rng = np.random.default_rng(c.seed)
        self.n, self.s = c.workers, c.slots
        self.window = c.window or c.slots
        self.sto_ticks = sto_ticks_from_ms(c.sto_ms)
        self.sto_s = self.sto_ticks * TICK_S
        self.byte_s = 8 / (c.link_Gbps * 1e9)
        self.one_way_s = c.rtt_us * 1e-6 / 2
        self.jitter_s = c.jitter_us * 1e-6
        # cumulative waits before the j-th transmission: 0, rto, rto + 2 rto, ... (capped per step)
        steps = np.minimum(c.rto_ms * 1e-3 * 2.0 ** np.arange(64), c.rto_max_ms * 1e-3)
        self.attempt_offsets = np.concatenate([[0.0], np.cumsum(steps)])
        self.results = np.full((self.n, self.s), -np.inf)  # result arrival per worker, ring by stream index
        self.nic_free = np.zeros(self.n)
        self.down_free = np.zeros(self.n)
        self.switch_free = np.zeros(1)  # the switch's packet processor (with a finite packet rate)
        # seconds of host or switch time per packet (0: line rate); a packet in brings a result out: twice
        self.worker_s = 2e-6 / c.worker_Mpps if c.worker_Mpps else 0.0
        self.switch_s = 2e-6 / c.switch_Mpps if c.switch_Mpps else 0.0
        self.counters = {name: 0 for name in ("ok", "to", "kr", "re", "dup", "old")}
        self.stream = 0
        self.packets = 0
        self.blocks_total = 0
        self.end_time = 0.0
        self.op_times: list[float] = []
        self.op_count = 1 if c.workload == "one" else c.ops
        self.issue_speed = np.exp(self.rng.normal(0.0, c.issue_skew, self.n)) if c.issue_skew else np.ones(self.n)

    def run(self) -> None:
        c = self.c
        numel = c.op_bytes // 4
        blocks = -(-numel // c.values)
        last_value_count = numel - (blocks - 1) * c.values
        done = np.zeros(self.n)  # when each worker finished its previous op
        host = np.zeros(self.n)  # batch: each worker's host issues ops back to back, so skew accumulates
        last = np.zeros(self.n)
        for op in range(self.op_count):
            overhead = c.op_overhead_us * 1e-6 * self.issue_speed + self._straggle(op)
            if c.workload == "batch":
                host = host + overhead
                issue = host
            else:
                issue = done + overhead
            finished = self._op(issue, blocks, last_value_count)
            # the fastest K workers define when an op is done (K = n: the slowest worker); a straggler that finds
            # every result waiting for it (0 s) did no part of the op and is not one of them
            durations = finished - issue
            working = durations[durations > 0]
            self.op_times.append(float(np.sort(working if len(working) >= c.min_count else durations)[c.min_count - 1]))
            done = finished
            last = np.maximum(last, finished)
        self.end_time = float(np.sort(last)[c.min_count - 1])

    def _straggle(self, op: int) -> np.ndarray:
        """Each straggler rank's delay before op `op` (as `StragglerSpec.delay_for`: steps are ops)."""
        c = self.c
        delay = np.zeros(self.n)
        if c.straggler_steps is not None and not c.straggler_steps[0] <= op <= c.straggler_steps[1]:
            return delay
        for rank in c.straggler_ranks:
            if self.rng.random() < c.straggler_prob:
                amount = c.straggler_ms if c.straggler_dist == "fixed" else self.rng.exponential(c.straggler_ms)
                delay[rank] = amount * 1e-3
        return delay

    def _op(self, issue: np.ndarray, blocks: int, last_value_count: int) -> np.ndarray:
        """Stream one op's packets; returns when each worker holds the whole result."""
        c = self.c
        prologue = min(self.s, blocks) if c.quantized else 0
        packets = prologue + blocks
        segment = min(self.s, self.window, prologue if prologue else self.s)
        finished = np.array(issue, dtype=float)
        for start in range(0, packets, segment):
            q = np.arange(start, min(packets, start + segment))
            finished = np.maximum(finished, self._segment(q, prologue, blocks, last_value_count, issue))
        self.stream += packets
        self.blocks_total += packets
        return finished

    def _segment(self, q: np.ndarray, prologue: int, blocks: int, last_value_count: int,
                 issue: np.ndarray) -> np.ndarray:
        c, n, rng = self.c, self.n, self.rng
        index = self.stream + q
        ring = index % self.s
        width = len(q)
        # ---- when each worker can send each packet ---------------------------------------------------
        ready = np.maximum(issue[:, None], self.results[:, ring])  # slot free: result of index - s
        if self.window < self.s:
            ready = np.maximum(ready, self.results[:, (index - self.window) % self.s])
        is_data = q >= prologue
        if prologue and is_data.any():  # the exponent: result of the packet `prologue` earlier in the op
            carrier = np.where(is_data, index - prologue, index)
            ready = np.where(is_data[None, :], np.maximum(ready, self.results[:, carrier % self.s]), ready)
        values = np.where(is_data, c.values, 0)
        if blocks and is_data.any():
            values = np.where(q == prologue + blocks - 1, last_value_count, values)
        tx = (HEADER_BYTES + WIRE_OVERHEAD_BYTES + 4 * values) * self.byte_s
        # ---- the host and NIC: in ready order; a host stall (natural skew) holds back what follows --------
        occupy = np.broadcast_to(np.maximum(tx, self.worker_s), (n, width))  # host or wire: the slower
        if c.stall_prob:
            stalls = rng.random((n, width)) < c.stall_prob
            if stalls.any():
                occupy = occupy + np.where(stalls, rng.exponential(c.stall_us * 1e-6, (n, width)), 0.0)
        nic_before = self.nic_free
        start, self.nic_free = _serialize(ready, occupy, nic_before)
        send = start + occupy - tx[None, :]  # when the packet starts on the wire
        # ---- uplink: losses are recovered by retransmission (its timer runs from the first send) ------
        failures = self._failures((n, width), 1 - c.loss)
        first_arrival = (send + self.attempt_offsets[failures] + tx[None, :] + self.one_way_s
                         + self._jitter((n, width)))
        if self.switch_s:  # one packet processor for all workers, in arrival order
            handled, self.switch_free = _serialize(first_arrival.reshape(1, -1),
                                                   np.full((1, n * width), self.switch_s), self.switch_free)
            first_arrival = handled.reshape(n, width) + self.switch_s
        # ---- the switch: all, or K after the timer (from the first contribution), or K preemptively --------
        ordered = np.sort(first_arrival, axis=0)
        t_first, t_last, t_k = ordered[0], ordered[-1], ordered[c.min_count - 1]
        deadline = t_first + self.sto_s
        if c.preemptive and c.min_count < n:
            complete = t_k
            self.counters["kr"] += width
        else:
            all_in_time = t_last <= deadline
            complete = np.where(all_in_time, t_last, np.maximum(deadline, t_k))
            full = all_in_time | (t_k >= t_last)
            self.counters["ok"] += int(full.sum())
            self.counters["to"] += int((~full).sum())
        # ---- results: multicast on each worker's downlink, in completion order ----------------------
        result_tx = (HEADER_BYTES + WIRE_OVERHEAD_BYTES + 4 * values) * self.byte_s
        leave = np.broadcast_to(complete, (n, width))
        delivered, self.down_free = _serialize(leave, np.broadcast_to(result_tx, (n, width)), self.down_free)
        delivered = delivered + result_tx[None, :]
        delivered = delivered + self.one_way_s + self._jitter((n, width))
        # a lost result comes back when the worker's timer resends and the switch answers the duplicate
        lost = rng.random((n, width)) < c.loss if c.loss else np.zeros((n, width), dtype=bool)
        if lost.any():
            rtt = 2 * self.one_way_s + tx[None, :] + result_tx[None, :]
            waited = np.searchsorted(self.attempt_offsets, (complete[None, :] - send - self.one_way_s).ravel())
            retry = np.maximum(waited.reshape(n, width), failures + 1)
            retry = retry + self._failures((n, width), (1 - c.loss) ** 2)
            recovered = send + self.attempt_offsets[np.minimum(retry, len(self.attempt_offsets) - 1)] + rtt
            delivered = np.where(lost, np.maximum(recovered, delivered), delivered)
        # ---- a worker that has the result before it could send skips the packet -----------------------
        skipped = delivered <= send
        if skipped.any():  # skipping frees the link: a late worker catches up in the next segments
            _, self.nic_free = _serialize(ready, occupy - np.where(skipped, tx[None, :], 0.0), nic_before)
        late = (first_arrival > complete[None, :]) & ~skipped
        self.counters["old"] += int(late.sum())
        sent = ~skipped
        # timer expiries before the result came back = retransmissions
        expiries = np.searchsorted(self.attempt_offsets, (delivered - send).ravel(), side="left").reshape(n, width) - 1
        retransmissions = np.where(sent, np.maximum(expiries, 0), 0)
        self.counters["re"] += int(retransmissions.sum())
        extra = np.maximum(retransmissions - failures, 0)  # resends after the contribution got through
        arrived_again = rng.binomial(extra, 1 - c.loss) if c.loss else extra
        duplicated = (rng.random((n, width)) < c.duplicate) & sent if c.duplicate else 0
        self.counters["dup"] += int((arrived_again * sent).sum() + np.sum(duplicated))
        self.packets += int(sent.sum() + retransmissions.sum()) + n * width  # uplink + multicast deliveries
        self.results[:, ring] = delivered
        return delivered.max(axis=1)

    def _failures(self, shape: tuple[int, int], success: float) -> np.ndarray:
        """Failed attempts before the first success per packet (0 when nothing is lost)."""
        if success >= 1:
            return np.zeros(shape, dtype=np.int64)
        return np.minimum(self.rng.geometric(success, shape) - 1, len(self.attempt_offsets) - 2)

    def _jitter(self, shape: tuple[int, int]) -> np.ndarray:
        return self.rng.exponential(self.jitter_s, shape) if self.jitter_s else 0.0
