"""KV-cache transfer from the prefill pool to the decode pool (disaggregated serving).

The tier: when both pools together fit in one scale-up domain of the system (the first
interconnect tier's group, e.g. 8 GPUs of an HGX board on NVLink), the cache moves over
that tier; otherwise over the innermost tier that holds all their devices (the
scale-out network, e.g. InfiniBand between nodes).

Per-link concurrency: each worker has one link per direction (prefill: out, decode:
in) with one channel per attention-DP rank (a rank's devices send or receive its
requests' caches, each device at the tier's per-device bandwidth). A transfer holds one
channel of its prefill worker's link and one of its decode worker's link from its start
to its end; transfers that find every channel busy wait in arrival order (a FIFO
queue). So n equal transfers through one channel end after n times the time of one,
and transfers over separate links do not wait for each other.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from perfcast.evidence.collectives import collective_time
from perfcast.hardware import InterconnectTier, System


def kv_tier(system: System, prefill_gpus: int, decode_gpus: int) -> InterconnectTier:
    """The tier that joins a prefill pool of `prefill_gpus` and a decode pool of
    `decode_gpus` devices: the scale-up tier when both fit in one of its domains, else
    the innermost tier holding both."""
    return system.tier_for_group(prefill_gpus + decode_gpus)


def transfer_s(bytes_per_device: float, tier: InterconnectTier) -> float:
    """One transfer alone on its link: every device of the sending rank moves its
    `bytes_per_device` at once (alpha-beta point-to-point over `tier`)."""
    total, _, _ = collective_time("send_recv", bytes_per_device, 2, tier, "ring")
    return total


@dataclass
class Link:
    """`channels` parallel channels, each serving one transfer at a time (FIFO)."""

    channels: int = 1
    _free: list[float] = field(default_factory=list)   # heap of channel free times

    def __post_init__(self) -> None:
        if self.channels < 1:
            raise ValueError("a link needs at least one channel")
        self._free = [0.0] * self.channels

    def earliest_free_s(self) -> float:
        return self._free[0]

    def hold(self, end_s: float) -> None:
        """The earliest-free channel is busy until `end_s`."""
        heapq.heapreplace(self._free, end_s)


class KVLinks:
    """Transfers of one simulation. `duration_s(request)` is the time of the request's
    transfer alone on its links; `channels(engine)` the parallel channels of an engine's
    link (its attention-DP ranks)."""

    def __init__(self, duration_s: Callable[[object], float],
                 channels: Callable[[object], int]) -> None:
        self.duration_s = duration_s
        self.channels = channels
        self._out: dict[str, Link] = {}
        self._in: dict[str, Link] = {}

    def _link(self, table: dict[str, Link], engine) -> Link:
        link = table.get(engine.name)
        if link is None:
            link = table[engine.name] = Link(self.channels(engine))
        return link

    def __call__(self, request, prefill_engine, decode_engine, start_s: float) -> float:
        """Seconds from `start_s` (the prefill's end) until the cache has arrived at
        `decode_engine`: waiting for a free channel on both links, then the transfer."""
        out, into = self._link(self._out, prefill_engine), self._link(self._in, decode_engine)
        begin = max(start_s, out.earliest_free_s(), into.earliest_free_s())
        end = begin + self.duration_s(request)
        out.hold(end)
        into.hold(end)
        return end - start_s
