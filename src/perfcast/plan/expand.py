"""Turn costed graphs into scheduler instances: layer expansion, microbatches, streams.

Full mode expands every repeated layer block into one instance per layer (lineage
`L{n}.{group}`, the block's per-layer calls); inside a layer, deps are the block's own
deps; the block's first tasks of layer n > first also wait for the last tasks of layer
n - 1. Compressed mode keeps the first one or two layers of each block as
representatives (see `perfcast.plan.compose` for how they are scaled back up).

Units are the microbatches (times two halves under two-microbatch overlap), each a
copy of its costed graph. Across units, stage s starts unit j only after unit j - g has
left stage s (g = halves interleaving per stage), and a pipeline schedule may bound the
units in flight (see `perfcast.plan.pipeline`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from perfcast.core.errors import ConfigError
from perfcast.evidence.costing import CostedGraph, CostedTask
from perfcast.plan.resources import ResourceModel
from perfcast.plan.scheduler import Problem
from perfcast.workload.tensors import TaskKind

_PRIORITY_STRIDE = 1 << 32


@dataclass
class Template:
    """One unit's instances with local indices (shared by every unit of one graph)."""

    lineage: list[str] = field(default_factory=list)
    costed: list[CostedTask] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    duration_s: list[float] = field(default_factory=list)
    shared_s: list[float] = field(default_factory=list)
    stage: list[int] = field(default_factory=list)
    stream: list[str] = field(default_factory=list)
    link_tier: list[str] = field(default_factory=list)
    preds: list[list[int]] = field(default_factory=list)
    stage_sources: dict[int, list[int]] = field(default_factory=dict)
    stage_sinks: dict[int, list[int]] = field(default_factory=dict)
    exits: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.lineage)


def block_lengths(costed: CostedGraph) -> list[int]:
    """Layers of each repeated block of the graph."""
    return sorted({t.task.layers[1] - t.task.layers[0] + 1 for t in costed.tasks
                   if t.task.layers is not None})


# Compressed mode: a block of more than SHORT_BLOCK_LAYERS layers keeps `rep_layers`
# representative layers (each standing for R / ref_layers of its layers) plus up to
# EXTRA_LAYERS_CAP real layers for what it has beyond the shortest long block; shorter
# blocks are always expanded.
SHORT_BLOCK_LAYERS = 6
EXTRA_LAYERS_CAP = 4


def build_template(costed: CostedGraph, resources: ResourceModel, *,
                   rep_layers: int | None = None, ref_layers: int = 1) -> Template:
    """Instances of one unit. `rep_layers=None` expands every layer; otherwise each long
    block of L layers becomes `rep_layers` representative layers scaled by
    (L - e) / `ref_layers` followed by e = min(L - ref_layers, EXTRA_LAYERS_CAP) real
    layers, so at rep_layers = ref_layers the block holds exactly L layers of work."""
    tasks = [ct.task for ct in costed.tasks]
    pos = {t.lineage: i for i, t in enumerate(tasks)}
    for t in tasks:
        for d in t.deps:
            if d not in pos:
                raise ConfigError(f"task {t.lineage} depends on unknown lineage {d!r}",
                                  field="deps", expected="a lineage id of the same graph")
    blocks: dict[tuple, list[int]] = {}
    for i, t in enumerate(tasks):
        if t.layers is not None:
            blocks.setdefault((t.stage, t.layers), []).append(i)
    tpl = Template()
    index: dict[tuple[int, int | None], int] = {}  # (task index, layer) -> instance
    last_layer: dict[tuple, int] = {}

    def emit(i: int, layer: int | None, reps: int, scale: float) -> None:
        ct = costed.tasks[i]
        t = ct.task
        place = resources.place(t)
        duration = ct.latency_s * t.count / reps * scale
        shared = 0.0
        if place.link_tier and t.kind is TaskKind.COMMUNICATION:
            bw = ct.resolution.estimate.components.get("bandwidth_s")
            shared = duration if bw is None else min(bw * t.count / reps * scale, duration)
        index[(i, layer)] = len(tpl.lineage)
        tpl.lineage.append(t.lineage if layer is None else f"L{layer}.{t.group}")
        tpl.costed.append(ct)
        tpl.calls.append(t.count // reps)
        tpl.duration_s.append(duration)
        tpl.shared_s.append(shared)
        tpl.stage.append(t.stage)
        tpl.stream.append(place.stream)
        tpl.link_tier.append(place.link_tier)

    for i, t in enumerate(tasks):
        key = (t.stage, t.layers)
        if key in blocks:
            if key in last_layer:
                continue
            first, last = t.layers
            reps = last - first + 1
            scales = [1.0] * reps
            if rep_layers is not None and reps > SHORT_BLOCK_LAYERS:
                extra = min(reps - ref_layers, EXTRA_LAYERS_CAP)
                scales = [(reps - extra) / ref_layers] * rep_layers + [1.0] * extra
            last_layer[key] = first + len(scales) - 1
            for n, scale in enumerate(scales):
                for j in blocks[key]:
                    emit(j, first + n, reps, scale)
        else:
            emit(i, None, 1, 1.0)

    block_of = {i: key for key, members in blocks.items() for i in members}
    block_sources: dict[tuple, list[int]] = {}
    block_sinks: dict[tuple, list[int]] = {}
    for key, members in blocks.items():
        inside = set(members)
        has_succ = {pos[d] for j in members for d in tasks[j].deps if pos[d] in inside}
        block_sources[key] = [j for j in members
                              if not any(pos[d] in inside for d in tasks[j].deps)]
        block_sinks[key] = [j for j in members if j not in has_succ]
    tpl.preds = [[] for _ in tpl.lineage]
    for (i, layer), inst in index.items():
        t = tasks[i]
        preds = tpl.preds[inst]
        own = block_of.get(i)
        for d in t.deps:
            k = pos[d]
            dkey = block_of.get(k)
            if dkey is not None and dkey == own:
                preds.append(index[(k, layer)])
            elif dkey is not None:
                preds.append(index[(k, last_layer[dkey])])
            else:
                preds.append(index[(k, None)])
        if own is not None and layer != own[1][0] and i in block_sources[own]:
            preds.extend(index[(k, layer - 1)] for k in block_sinks[own])
    _stage_ends(tpl)
    return tpl


def _stage_ends(tpl: Template) -> None:
    n = len(tpl.lineage)
    has_same_stage_succ = [False] * n
    has_succ = [False] * n
    for i, preds in enumerate(tpl.preds):
        same = False
        for d in preds:
            has_succ[d] = True
            if tpl.stage[d] == tpl.stage[i]:
                has_same_stage_succ[d] = True
                same = True
        if not same:
            tpl.stage_sources.setdefault(tpl.stage[i], []).append(i)
    for i in range(n):
        if not has_same_stage_succ[i]:
            tpl.stage_sinks.setdefault(tpl.stage[i], []).append(i)
    tpl.exits = [i for i in range(n) if not has_succ[i]]


@dataclass
class Expanded:
    """A scheduler problem plus what each instance is (for the timeline)."""

    problem: Problem
    templates: list[Template]
    unit_of: list[int]
    local_of: list[int]
    offsets: list[int]
    streams: list[tuple[int, str]]  # stream id -> (stage, name)


def expand_units(units: Sequence[CostedGraph], resources: ResourceModel, *,
                 rep_layers: int | None = None, ref_layers: int = 1,
                 per_stage_in_flight: int = 1, max_in_flight: int | None = None) -> Expanded:
    """Instances of every unit; unit j waits on stage s for unit j - per_stage_in_flight
    to leave s, and enters the first stage only after unit j - max_in_flight has exited."""
    cache: dict[int, Template] = {}
    templates = []
    for costed in units:
        key = id(costed)
        if key not in cache:
            cache[key] = build_template(costed, resources, rep_layers=rep_layers,
                                        ref_layers=ref_layers)
        templates.append(cache[key])
    prob = Problem()
    stream_ids: dict[tuple[int, str], int] = {}
    link_ids: dict[tuple[int, str], int] = {}
    ids_of: dict[int, tuple[list[int], list[int]]] = {}  # template -> (stream ids, link ids)
    for tpl in templates:
        if id(tpl) not in ids_of:
            sids = [stream_ids.setdefault(k, len(stream_ids))
                    for k in zip(tpl.stage, tpl.stream)]
            lids = [link_ids.setdefault((st, tier), len(link_ids)) if tier else -1
                    for st, tier in zip(tpl.stage, tpl.link_tier)]
            ids_of[id(tpl)] = (sids, lids)
    unit_of: list[int] = []
    local_of: list[int] = []
    offsets: list[int] = []
    for u, tpl in enumerate(templates):
        off = len(prob.duration_s)
        n = len(tpl)
        offsets.append(off)
        sids, lids = ids_of[id(tpl)]
        prob.duration_s.extend(tpl.duration_s)
        prob.shared_s.extend(tpl.shared_s)
        prob.stream.extend(sids)
        prob.link.extend(lids)
        base = u * _PRIORITY_STRIDE
        prob.priority.extend(range(base, base + n))
        prob.preds.extend([off + d for d in ps] for ps in tpl.preds)
        unit_of.extend([u] * n)
        local_of.extend(range(n))
        g = per_stage_in_flight
        if u >= g:
            prev, poff = templates[u - g], offsets[u - g]
            for stage, sources in tpl.stage_sources.items():
                sinks = [poff + k for k in prev.stage_sinks.get(stage, ())]
                for i in sources:
                    prob.preds[off + i].extend(sinks)
        if max_in_flight is not None and u >= max_in_flight:
            prev, poff = templates[u - max_in_flight], offsets[u - max_in_flight]
            first_stage = min(tpl.stage_sources)
            exits = [poff + k for k in prev.exits]
            for i in tpl.stage_sources[first_stage]:
                prob.preds[off + i].extend(exits)
    prob.num_streams = len(stream_ids)
    # a link used by one stream only never carries two transfers at once: drop it
    streams_on: dict[int, set[int]] = {}
    for lk, sid in zip(prob.link, prob.stream):
        if lk >= 0:
            streams_on.setdefault(lk, set()).add(sid)
    shared_links = {lk for lk, sids in streams_on.items() if len(sids) > 1}
    if len(shared_links) < len(streams_on):
        renum = {lk: n for n, lk in enumerate(sorted(shared_links))}
        prob.link = [renum.get(lk, -1) for lk in prob.link]
        prob.shared_s = [x if lk >= 0 else 0.0 for x, lk in zip(prob.shared_s, prob.link)]
        link_ids = {k: renum[v] for k, v in link_ids.items() if v in renum}
    prob.num_links = len(link_ids)
    streams = [k for k, _ in sorted(stream_ids.items(), key=lambda kv: kv[1])]
    return Expanded(problem=prob, templates=templates, unit_of=unit_of, local_of=local_of,
                    offsets=offsets, streams=streams)
