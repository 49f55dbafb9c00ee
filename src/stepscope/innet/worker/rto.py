"""The worker's retransmission timeout: fixed, or adaptive from measured round trips, with per-packet
exponential backoff.

A block's round trip includes waiting for the slowest worker (the switch answers when the block
completes), so on a loaded host it can be milliseconds. A fixed timeout below that retransmits packets
that were not lost, which loads the switch further (congestion collapse on a 2-core machine); the
adaptive timeout follows RFC 6298: rto = srtt + 4 rttvar from first transmissions only (Karn's rule:
a retransmitted packet's round trip is ambiguous), clamped to [min, max].
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RetransmitTimeout:
    """Current timeout (seconds) for a packet sent `sends` times."""

    fixed_s: float | None
    """A fixed first timeout, or None for adaptive."""
    min_s: float
    """Smallest adaptive timeout."""
    max_s: float
    """Largest timeout, backoff included."""
    backoff: float
    """Multiplier per retransmission of the same packet."""
    initial_s: float = 0.02
    """Adaptive timeout before the first round trip was measured."""
    srtt: float | None = None
    rttvar: float = 0.0

    def base(self) -> float:
        if self.fixed_s is not None:
            return self.fixed_s
        if self.srtt is None:
            return self.initial_s
        return min(max(self.srtt + 4 * self.rttvar, self.min_s), self.max_s)

    def for_send(self, sends: int) -> float:
        """Timeout after the `sends`-th transmission (1 = first)."""
        return min(self.base() * self.backoff ** (sends - 1), self.max_s)

    def sample(self, rtt_s: float) -> None:
        """A measured round trip of a packet sent once."""
        if self.srtt is None:
            self.srtt, self.rttvar = rtt_s, rtt_s / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt_s)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt_s
