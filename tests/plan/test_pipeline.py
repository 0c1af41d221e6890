"""Pipeline parallelism: bubbles, schedules and microbatch splitting."""

import pytest

from perfcast.core.errors import ConfigError
from perfcast.plan import PlanOptions, bubble_fraction, schedule_plan, split_batch
from perfcast.workload import Batch, BatchSegment
from .handgraphs import MS, SYSTEM, graph, task


def pipeline(stage_ms):
    """One compute task per stage, each stage consuming the previous one."""
    tasks, prev = [], ()
    for s, ms in enumerate(stage_ms):
        tasks.append(task(f"s{s}", ms * MS, prev, stage=s))
        prev = (f"s{s}",)
    return graph(*tasks, pp=len(stage_ms))


@pytest.mark.parametrize("p,m", [(2, 8), (4, 4), (4, 1), (1, 5), (3, 6)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_uniform_stages_show_the_textbook_bubble(p, m, schedule):
    unit = pipeline([1.0] * p)
    tl = schedule_plan([unit] * m, SYSTEM, PlanOptions(num_microbatches=m, pp_schedule=schedule))
    assert tl.makespan_s == pytest.approx((m + p - 1) * MS)
    assert tl.sum_of_tasks_s == pytest.approx(m * p * MS)
    assert tl.bubble_fraction == pytest.approx(bubble_fraction(p, m))
    assert bubble_fraction(p, m) == pytest.approx((p - 1) / (m + p - 1))
    for idle in tl.idle_s:  # every stage idles (p - 1) stage times
        assert idle == pytest.approx((p - 1) * MS)


def test_1f1b_bounds_microbatches_in_flight():
    unit = pipeline([1.0, 3.0])  # the second stage is the bottleneck
    m = 4
    runs = {s: schedule_plan([unit] * m, SYSTEM, PlanOptions(num_microbatches=m, pp_schedule=s))
            for s in ("gpipe", "1f1b")}
    enter = {s: [t.start_s for t in tl.tasks if t.lineage == "s0"] for s, tl in runs.items()}
    assert enter["gpipe"] == pytest.approx([0, 1 * MS, 2 * MS, 3 * MS])
    # 1f1b: microbatch 2 enters after microbatch 0 leaves stage 1 (at 4 ms), 3 after 1 (7 ms)
    assert enter["1f1b"] == pytest.approx([0, 1 * MS, 4 * MS, 7 * MS])
    # the bottleneck stage sets the makespan either way: 1 + 4 * 3 ms
    for tl in runs.values():
        assert tl.makespan_s == pytest.approx(13 * MS)


def test_a_stage_serves_one_microbatch_at_a_time_without_two_microbatch_overlap():
    # g -> ar -> g2 per microbatch: microbatch 1 may not fill microbatch 0's comm wait
    unit = graph(task("g", 2 * MS), task("ar", 1 * MS, ["g"], comm=True),
                 task("g2", 1 * MS, ["ar"]))
    tl = schedule_plan([unit, unit], SYSTEM, PlanOptions(num_microbatches=2))
    assert tl.makespan_s == pytest.approx(8 * MS)


def test_split_batch_conserves_requests_and_mix():
    batch = Batch.mixed((BatchSegment(5, 128, 0), BatchSegment(6, 1, 512)))
    parts = split_batch(batch, 4)
    assert len(parts) == 4
    assert sum(p.num_requests for p in parts) == 11
    assert sum(p.tokens for p in parts) == batch.tokens
    assert sorted(p.num_requests for p in parts) == [2, 3, 3, 3]
    with pytest.raises(ConfigError, match="too few"):
        split_batch(Batch.prefill(1, 8192), 2)
