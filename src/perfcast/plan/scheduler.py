"""Discrete-event list scheduler over task instances on streams and shared links.

A task instance starts when all its predecessors have finished and its stream is free;
among ready instances a free stream takes the one with the lowest priority value
(non-delay list scheduling). A transfer on a link first spends its unshared part
(latency), then its shared part progresses at rate 1/n while n transfers use the link
(two equal transfers that overlap fully each take twice as long).

The problem is given as flat arrays so that a 10,000-instance timeline schedules in
tens of milliseconds; `perfcast.plan.expand` builds them from a CostedGraph.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

_DONE = 0
_LINK_ENTER = 1
_LINK_CHECK = 2
_TIE_S = 1e-12  # transfers whose remaining work differs by under a picosecond end together


@dataclass
class Problem:
    """Instances 0..n-1. `shared_s[i]` <= `duration_s[i]` is the part that shares the
    bandwidth of link `link[i]` (-1: no link). `preds[i]` lists instances that must end
    before i starts."""

    duration_s: list[float] = field(default_factory=list)
    shared_s: list[float] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    link: list[int] = field(default_factory=list)
    priority: list[int] = field(default_factory=list)
    preds: list[list[int]] = field(default_factory=list)
    num_streams: int = 0
    num_links: int = 0

    def add(self, duration_s: float, stream: int, *, priority: int, preds=(),
            link: int = -1, shared_s: float = 0.0) -> int:
        if duration_s < 0:
            raise ValueError(f"negative duration {duration_s!r}")
        self.duration_s.append(duration_s)
        self.shared_s.append(min(shared_s, duration_s) if link >= 0 else 0.0)
        self.stream.append(stream)
        self.link.append(link)
        self.priority.append(priority)
        self.preds.append(list(preds))
        self.num_streams = max(self.num_streams, stream + 1)
        self.num_links = max(self.num_links, link + 1)
        return len(self.duration_s) - 1


@dataclass(frozen=True)
class Schedule:
    start_s: tuple[float, ...]
    end_s: tuple[float, ...]
    gate: tuple[int, ...]  # what released each instance: a predecessor or the stream's previous task; -1 = none

    @property
    def makespan_s(self) -> float:
        return max(self.end_s, default=0.0)

    def critical_path(self) -> list[int]:
        """Instances from the first to the one that ends last, following what gated each start."""
        if not self.end_s:
            return []
        i = max(range(len(self.end_s)), key=self.end_s.__getitem__)
        path = []
        while i >= 0:
            path.append(i)
            i = self.gate[i]
        path.reverse()
        return path


def simulate(p: Problem) -> Schedule:
    n = len(p.duration_s)
    dur, shared, stream_of, link_of, prio = (p.duration_s, p.shared_s, p.stream, p.link,
                                            p.priority)
    succs: list[list[int]] = [[] for _ in range(n)]
    waiting = [len(ps) for ps in p.preds]
    for i, ps in enumerate(p.preds):
        if ps and (min(ps) < 0 or max(ps) >= n):
            raise ValueError(f"instance {i} depends on an unknown instance in {ps}")
        for d in ps:
            succs[d].append(i)
    nan = float("nan")
    start = [nan] * n
    end = [nan] * n
    gate = [-1] * n
    ready_at = [0.0] * n
    dep_gate = [-1] * n
    n_streams = p.num_streams
    busy = [False] * n_streams
    last_on = [-1] * n_streams
    free_at = [0.0] * n_streams
    ready: list[list[tuple[int, int]]] = [[] for _ in range(n_streams)]
    active: list[dict[int, float]] = [{} for _ in range(p.num_links)]
    link_t = [0.0] * p.num_links
    link_ver = [0] * p.num_links
    events: list[tuple[float, int, int, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    seq = 0
    touched: set[int] = set()
    finished: list[int] = []  # instances that end at the current time
    for i in range(n):
        if waiting[i] == 0:
            push(ready[stream_of[i]], (prio[i], i))
            touched.add(stream_of[i])

    def link_update(lk: int, t: float) -> None:
        """Advance the link's transfers to t (each got 1/n of the bandwidth)."""
        act = active[lk]
        if act:
            dec = (t - link_t[lk]) / len(act)
            for j in act:
                act[j] -= dec
        link_t[lk] = t

    def link_next(lk: int, t: float) -> None:
        nonlocal seq
        link_ver[lk] += 1
        act = active[lk]
        if act:
            seq += 1
            push(events, (t + max(min(act.values()), 0.0) * len(act), seq, _LINK_CHECK, lk,
                          link_ver[lk]))

    t = 0.0
    done = 0
    while True:
        for s in touched:
            if busy[s] or not ready[s]:
                continue
            _, j = pop(ready[s])
            busy[s] = True
            start[j] = t
            dg = dep_gate[j]
            gate[j] = dg if (dg >= 0 and ready_at[j] >= free_at[s]) else last_on[s]
            seq += 1
            if link_of[j] >= 0 and shared[j] > 0:
                push(events, (t + dur[j] - shared[j], seq, _LINK_ENTER, j, 0))
            else:
                push(events, (t + dur[j], seq, _DONE, j, 0))
        touched.clear()
        if not events:
            break
        t = events[0][0]
        while events and events[0][0] == t:
            _, _, kind, a, b = pop(events)
            if kind == _DONE:
                finished.append(a)
            elif kind == _LINK_ENTER:
                lk = link_of[a]
                link_update(lk, t)
                active[lk][a] = shared[a]
                link_next(lk, t)
            elif b == link_ver[a]:  # _LINK_CHECK, not superseded
                link_update(a, t)
                act = active[a]
                # the transfer this check was scheduled for ends now, with any that tie
                limit = min(act.values()) + _TIE_S
                for j in [j for j, rem in act.items() if rem <= limit]:
                    del act[j]
                    finished.append(j)
                link_next(a, t)
        for i in finished:
            end[i] = t
            s = stream_of[i]
            busy[s] = False
            last_on[s] = i
            free_at[s] = t
            touched.add(s)
            for j in succs[i]:
                if t >= ready_at[j]:
                    ready_at[j] = t
                    dep_gate[j] = i
                waiting[j] -= 1
                if not waiting[j]:
                    push(ready[stream_of[j]], (prio[j], j))
                    touched.add(stream_of[j])
        done += len(finished)
        finished.clear()
    if done != n:
        stuck = [i for i in range(n) if end[i] != end[i]][:5]
        raise ValueError(f"{n - done} task instances never became ready (dependency cycle?); "
                         f"first: {stuck}")
    return Schedule(start_s=tuple(start), end_s=tuple(end), gate=tuple(gate))
