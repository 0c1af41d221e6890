"""Turn costed graphs into scheduler instances: layer expansion, microbatches, streams.

Full mode expands every repeated layer block into one instance per layer (lineage
`L{n}.{group}`, the block's per-layer calls); inside a layer, deps are the block's own
deps; the block's first tasks of layer n > first also wait for the last tasks of layer
n - 1. Compressed mode keeps the first few layers of each long block as
representatives (see `perfcast.plan.compose` for how they are scaled back up).

Units are the microbatches (times two halves under two-microbatch overlap), each a
copy of its costed graph. Across units, stage s starts unit j only after unit j - g has
left stage s (g = halves interleaving per stage), and a pipeline schedule may bound the
units in flight (see `perfcast.plan.pipeline`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from perfcast.core.errors import ConfigError
from perfcast.evidence.costing import CostedGraph, CostedTask
from perfcast.plan.resources import ResourceModel
from perfcast.plan.scheduler import Problem
from perfcast.workload.tensors import Task, TaskKind

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


_STRIDED = re.compile(r"L(\d+)-(\d+):(\d+)\.")


def block_layers(task: Task) -> range:
    """The layers a repeated task runs in: `layers=(first, last)`, every `step`-th when
    its lineage says so (`L0-34:2.` = layers 0, 2, ..., 34 of an alternating pattern)."""
    first, last = task.layers[0], task.layers[1]
    m = _STRIDED.match(task.lineage)
    return range(first, last + 1, int(m.group(3)) if m else 1)


def block_lengths(costed: CostedGraph) -> list[int]:
    """Layers of each repeated block of the graph."""
    return sorted({len(block_layers(t.task)) for t in costed.tasks if t.task.layers is not None})


# Compressed mode: a block of more than SHORT_BLOCK_LAYERS layers keeps `rep_layers`
# representative layers (each standing for R / ref_layers of its layers) plus up to
# EXTRA_LAYERS_CAP real layers for what it has beyond the shortest long block; shorter
# blocks are always expanded.
SHORT_BLOCK_LAYERS = 6
EXTRA_LAYERS_CAP = 4


def _kept_layers(layers: range, rep_layers: int | None, ref_layers: int) -> list[tuple[int, float]]:
    """(layer, scale) of the instances that stand for a block."""
    reps = len(layers)
    if rep_layers is None or reps <= SHORT_BLOCK_LAYERS:
        return [(n, 1.0) for n in layers]
    extra = min(reps - ref_layers, EXTRA_LAYERS_CAP)
    scales = [(reps - extra) / ref_layers] * rep_layers + [1.0] * extra
    return list(zip(layers, scales))


def build_template(costed: CostedGraph, resources: ResourceModel, *,
                   rep_layers: int | None = None, ref_layers: int = 1) -> Template:
    """Instances of one unit. `rep_layers=None` expands every layer; otherwise each long
    block of L layers becomes `rep_layers` representative layers scaled by
    (L - e) / `ref_layers` followed by e = min(L - ref_layers, EXTRA_LAYERS_CAP) real
    layers, so at rep_layers = ref_layers the block holds exactly L layers of work.

    Dependencies of layer n: the block's own deps inside layer n; a dep on another block
    means its latest layer before n (its last layer for tasks outside blocks); a task
    that starts a layer (no dep inside its block) also waits for the tasks that end the
    stage's previous layer (n - 1, or the latest kept layer before n), whichever block
    it belongs to, so alternating blocks (`L0-34:2`, `L1-35:2`) chain layer by layer.
    Tasks with the attribute `async` (gradient reductions) are not waited for."""
    tasks = [ct.task for ct in costed.tasks]
    pos = {t.lineage: i for i, t in enumerate(tasks)}
    for t in tasks:
        for d in t.deps:
            if d not in pos:
                raise ConfigError(f"task {t.lineage} depends on unknown lineage {d!r}",
                                  field="deps", expected="a lineage id of the same graph")
    blocks: dict[tuple, list[int]] = {}
    block_of: dict[int, tuple] = {}
    kept: dict[tuple, list[tuple[int, float]]] = {}
    reps_of: dict[tuple, int] = {}
    for i, t in enumerate(tasks):
        if t.layers is not None:
            layers = block_layers(t)
            key = (t.stage, layers.start, layers.stop, layers.step)
            blocks.setdefault(key, []).append(i)
            block_of[i] = key
            if key not in kept:
                kept[key] = _kept_layers(layers, rep_layers, ref_layers)
                reps_of[key] = len(layers)
    kept_layers = {key: [n for n, _ in ks] for key, ks in kept.items()}
    tpl = Template()
    index: dict[tuple[int, int | None], int] = {}  # (task index, layer) -> instance
    layer_block: dict[tuple[int, int], tuple] = {}   # (stage, layer) -> block emitted there

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

    done: set[tuple] = set()
    for i, t in enumerate(tasks):
        key = block_of.get(i)
        if key is None:
            emit(i, None, 1, 1.0)
            continue
        if key in done:
            continue
        group = _interleaved(key, blocks, done)
        done.update(group)
        by_layer = sorted((n, scale, k) for k in group for n, scale in kept[k])
        for n, scale, k in by_layer:
            layer_block[(k[0], n)] = k
            for j in blocks[k]:
                emit(j, n, reps_of[k], scale)

    stage_layers: dict[int, list[int]] = {}
    for st, n in sorted(layer_block):
        stage_layers.setdefault(st, []).append(n)
    block_sinks: dict[tuple, list[int]] = {}
    is_source: set[int] = set()
    for key, members in blocks.items():
        inside = set(members)
        has_succ = {pos[d] for j in members for d in tasks[j].deps if pos[d] in inside}
        is_source.update(j for j in members if not any(pos[d] in inside for d in tasks[j].deps))
        # a task marked `async` (e.g. a gradient reduction nobody in the layer waits
        # for) does not end its layer: the next layer starts without it
        block_sinks[key] = [j for j in members if j not in has_succ
                            and not tasks[j].attributes.get("async")]
    tpl.preds = [[] for _ in tpl.lineage]
    for (i, layer), inst in index.items():
        preds = tpl.preds[inst]
        own = block_of.get(i)
        for d in tasks[i].deps:
            k = pos[d]
            dkey = block_of.get(k)
            if dkey is None:
                preds.append(index[(k, None)])
            elif dkey == own:
                preds.append(index[(k, layer)])
            else:
                preds.append(index[(k, _latest_before(kept_layers[dkey], layer))])
        if own is not None and i in is_source and layer != kept_layers[own][0]:
            layers = stage_layers[own[0]]
            prev = layers[bisect.bisect_left(layers, layer) - 1]
            prev_block = layer_block[(own[0], prev)]
            preds.extend(index[(k, prev)] for k in block_sinks[prev_block])
    _stage_ends(tpl)
    return tpl


def _interleaved(key: tuple, blocks: dict[tuple, list[int]], done: set[tuple]) -> list[tuple]:
    """`key` and the not yet emitted blocks of its stage whose layer spans overlap it."""
    group = [key]
    lo, hi = key[1], key[2]
    grown = True
    while grown:
        grown = False
        for k in blocks:
            if k[0] == key[0] and k not in done and k not in group and k[1] < hi and lo < k[2]:
                group.append(k)
                lo, hi = min(lo, k[1]), max(hi, k[2])
                grown = True
    return group


def _latest_before(layers: list[int], layer: int | None) -> int:
    """The latest of a block's (sorted) layers before `layer`; its last when none is."""
    if layer is None:
        return layers[-1]
    i = bisect.bisect_left(layers, layer)
    return layers[i - 1] if i > 0 else layers[-1]


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
