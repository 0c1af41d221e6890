"""Step cost model: exact against the costed graph, interpolation close to exact, fast."""

from __future__ import annotations

import numpy as np
import pytest

from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.hardware import load_system
from perfcast.serving.backends import CudaGraphConfig, Overheads, load_backend
from perfcast.serving.step_cost import StepCostModel, StepShape, grid_nodes
from perfcast.evidence.factory import build_resolver
from perfcast.workload import Batch, BatchSegment, ParallelPlan, load_model_spec

SYSTEM = load_system("h100_sxm")
MODEL = load_model_spec("Qwen/Qwen3-8B")
NO_OVERHEAD = Overheads(0.0, 0.0, 0.0, 0.0)


def model(interpolate=True, overheads=NO_OVERHEAD, cuda_graph=None, plan=ParallelPlan(tp=2)):
    resolver = build_resolver(SYSTEM, launch_in_kernel_times=False)
    return StepCostModel(MODEL, plan, SYSTEM, resolver, overheads=overheads,
                         cuda_graph=cuda_graph, interpolate=interpolate)


def graph_latency(batch: Batch, plan=ParallelPlan(tp=2)) -> float:
    """Sum of the resolver-costed tasks of the same batch, kernel launch excluded."""
    res = estimate_step(EstimateRequest(model=MODEL, device=SYSTEM, plan=plan, batch=batch),
                        build_resolver(SYSTEM, launch_in_kernel_times=False))
    return res.latency_s


def test_grid_nodes_are_geometric():
    assert grid_nodes(20) == [1, 2, 3, 4, 6, 8, 12, 16, 24]
    assert grid_nodes(5, with_zero=True) == [0, 1, 2, 3, 4, 6]


@pytest.mark.parametrize("batch,shape", [
    (Batch.prefill(1, 700), StepShape(0, 0, ((700, 0),))),
    (Batch.decode(24, 1500), StepShape(24, 1500)),
    (Batch.mixed((BatchSegment(24, 1, 1500), BatchSegment(1, 700, 300))),
     StepShape(24, 1500, ((700, 300),))),
])
def test_exact_step_equals_the_costed_graph(batch, shape):
    assert model(interpolate=False).step_s(shape) == pytest.approx(graph_latency(batch), rel=1e-9)


def test_interpolated_steps_stay_close_to_exact():
    exact, interp = model(interpolate=False), model()
    rng = np.random.default_rng(0)
    for _ in range(25):
        shape = StepShape(int(rng.integers(1, 200)), float(rng.integers(1, 6000)),
                          tuple((int(rng.integers(1, 3000)), int(rng.integers(0, 4000)))
                                for _ in range(int(rng.integers(0, 3)))))
        assert interp.step_s(shape) == pytest.approx(exact.step_s(shape), rel=0.03)


def test_decode_runs_are_priced_without_a_graph_per_token():
    m = model()
    run = m.decode_run_s(37, 1000.0, 3000)
    built = m.graphs_built
    assert built < 40
    for j in (0, 999, 2999):
        assert run[j] == pytest.approx(m.step_s(StepShape(37, 1000.0 + j)), rel=1e-9)
    assert np.all(np.diff(run) >= 0)  # longer contexts never get cheaper
    m.decode_run_s(37, 1000.0, 3000)
    assert m.graphs_built == built      # cached by shape key


def test_overheads_and_cuda_graph_launch_costs():
    ov = Overheads(kernel_launch_eager_s=4e-6, kernel_launch_graph_s=1e-6,
                   step_overhead_s=1e-3, per_request_overhead_s=1e-5)
    cg = CudaGraphConfig(decode_only=True, max_batch=64, capture_sizes=(8, 16, 32, 64))
    bare, dressed = model(interpolate=False), model(interpolate=False, overheads=ov, cuda_graph=cg)
    shape = StepShape(10, 500)
    part, padded = dressed.kernel_parts(shape)
    assert padded == 16
    # replayed graph: padded GEMMs, 1 us per kernel, host overheads on top
    expected = part.kernel_s + part.kernels * 1e-6 + 1e-3 + 10 * 1e-5
    assert dressed.step_s(shape) == pytest.approx(expected)
    assert part.kernel_s >= bare.kernel_parts(shape)[0].kernel_s
    mixed = StepShape(10, 500, ((100, 0),))
    part, padded = dressed.kernel_parts(mixed)
    assert padded is None  # prefill steps run eagerly
    assert dressed.step_s(mixed) == pytest.approx(part.kernel_s + part.kernels * 4e-6 + 1e-3
                                                  + 11 * 1e-5)


def test_attention_dp_prices_the_busiest_rank():
    plan = ParallelPlan(tp=1, dp=4)
    m = model(interpolate=False, plan=plan)
    tokens, chunks = m.busiest_rank(StepShape(8, 100, ((500, 0), (400, 0), (300, 0), (200, 0))))
    assert tokens == 2 + 500 and chunks == ((500, 0),)
    one = m.step_s(StepShape(0, 0, ((500, 0),)))
    four = m.step_s(StepShape(0, 0, ((500, 0),) * 4))
    assert four == pytest.approx(one, rel=0.05)  # four prompts on four ranks at once


def test_backend_files_load_with_sources():
    for name in ("vllm", "sglang", "trtllm"):
        b = load_backend(name)
        assert b.name == name and b.scheduler.token_budget >= 1024
        assert b.cuda_graph.padded(3) in b.cuda_graph.capture_sizes


def test_backend_value_without_source_is_refused(tmp_path):
    from perfcast.core.errors import ConfigError

    text = (load_backend("vllm").source and open(load_backend("vllm").source).read())
    bad = tmp_path / "mine.yaml"
    bad.write_text(text.replace("  token_budget_source:", "  token_budget_note:"))
    with pytest.raises(ConfigError, match="token_budget"):
        load_backend(str(bad))


def _without(text: str, prefix: str) -> str:
    return "".join(ln for ln in text.splitlines(keepends=True)
                   if not ln.lstrip().startswith(prefix))


def test_host_overheads_in_backend_files_are_physics_only_defaults():
    # fitted host times live in calibration revisions, never in the backend files
    for name in ("vllm", "sglang", "trtllm"):
        ov = load_backend(name).overheads
        assert (ov.step_overhead_s, ov.per_request_overhead_s, ov.frontend_overhead_s,
                ov.first_chunk_overhead_s, ov.frontend_request_service_s) == (0.0,) * 5
        assert ov.kernel_launch_eager_s == pytest.approx(4e-6)
        assert "fitted physical parameter" not in open(load_backend(name).source).read()


def test_first_chunk_overhead_is_read_in_microseconds_and_optional(tmp_path):
    text = _without(open(load_backend("vllm").source).read(), "first_chunk_overhead")
    mine = tmp_path / "mine.yaml"
    mine.write_text(text)
    assert load_backend(str(mine)).overheads.first_chunk_overhead_s == 0.0
    mine.write_text(text + '  first_chunk_overhead_us: 1500.0\n'
                    '  first_chunk_overhead_source: "test"\n')
    assert load_backend(str(mine)).overheads.first_chunk_overhead_s == pytest.approx(1.5e-3)


def test_frontend_request_service_is_read_in_microseconds_and_optional(tmp_path):
    text = _without(open(load_backend("vllm").source).read(), "frontend_request_service")
    mine = tmp_path / "mine.yaml"
    mine.write_text(text)
    assert load_backend(str(mine)).overheads.frontend_request_service_s == 0.0
    mine.write_text(text + '  frontend_request_service_us: 20000.0\n'
                    '  frontend_request_service_source: "test"\n')
    assert load_backend(str(mine)).overheads.frontend_request_service_s == pytest.approx(0.02)


def test_overlapped_host_sets_a_floor_instead_of_adding():
    """Host work 2 ms + 0.1 ms per request. Without overlap it adds to the GPU time;
    with an overlap scheduler the iteration lasts the longer of the two, so a small
    batch pays the GPU time and a large one becomes host-bound."""
    add = Overheads(step_overhead_s=2e-3, per_request_overhead_s=1e-4)
    lap = Overheads(step_overhead_s=2e-3, per_request_overhead_s=1e-4, host_overlapped=True)
    m_add, m_lap = model(interpolate=False, overheads=add), model(interpolate=False, overheads=lap)
    assert m_add.with_host(5e-3, 10) == pytest.approx(8e-3)    # 5 + 2 + 1 ms
    assert m_lap.with_host(5e-3, 10) == pytest.approx(5e-3)    # GPU-bound
    assert m_lap.with_host(5e-3, 40) == pytest.approx(6e-3)    # host-bound: 2 + 4 ms
    # whole steps and decode runs use the same rule
    shape = StepShape(40, 300)
    gpu = m_lap.step_s(shape)
    assert gpu >= 6e-3 - 1e-12
    run = m_lap.decode_run_s(40, 300.0, 3)
    assert run[0] == pytest.approx(gpu)


def test_host_overlapped_flag_is_read_from_the_backend_file(tmp_path):
    text = open(load_backend("vllm").source).read()
    # vLLM before 0.14 schedules synchronously (async scheduling default from 0.14.0)
    assert load_backend("vllm", "0.12.0").overheads.host_overlapped is False
    mine = tmp_path / "mine.yaml"
    mine.write_text(text + "  host_overlapped: true\n")
    assert load_backend(str(mine), "0.12.0").overheads.host_overlapped is True


def test_vllm_kv_budget_leaves_room_for_the_sampler_profile_run():
    from dataclasses import replace

    from perfcast.serving.deploy import GIB, kv_capacity_tokens, sampler_reserve_bytes
    step = model()
    vllm = load_backend("vllm")
    # 20 B per logit x 1024 running requests x Qwen3-8B's 151,936-token vocabulary
    assert sampler_reserve_bytes(step, vllm) == 20 * 1024 * MODEL.vocab_size
    assert sampler_reserve_bytes(step, vllm) / GIB == pytest.approx(2.90, abs=0.01)
    without = replace(vllm, kv_cache=replace(vllm.kv_cache, sampler_profile_bytes_per_logit=0.0))
    per_token = step.memory_facts().kv_bytes_per_request(2048) / 2048
    lost = kv_capacity_tokens(step, without) - kv_capacity_tokens(step, vllm)
    assert lost == pytest.approx(20 * 1024 * MODEL.vocab_size / per_token, abs=2)
    assert sampler_reserve_bytes(step, load_backend("trtllm")) == 0.0
