import pytest

from perfcast.core.frozen import FrozenDict
from perfcast.evidence import (
    CollectiveCostProvider,
    CostQuery,
    CostSubject,
    EstimateMethod,
    MatchKind,
    Miss,
    RooflineCostProvider,
)


def gemm_query(m, n, k, dtype="bf16"):
    b = 2 if dtype == "bf16" else 1
    return CostQuery(subject=CostSubject.OPERATOR, operation="gemm", hardware="round",
                     dtype=dtype, engine="matrix", flops=2.0 * m * n * k,
                     bytes_read=(m * k + k * n) * b, bytes_written=m * n * b,
                     dims=FrozenDict({"m": m, "n": n, "k": k}))


def test_compute_bound_gemm_on_round_device(round_system):
    # 2*4096^3 = 137.4 GFLOP at 100 TFLOP/s = 1.374 ms; bytes 3*32 MiB at 1 TB/s = 0.1 ms
    est = RooflineCostProvider(round_system).estimate(gemm_query(4096, 4096, 4096))
    assert est.latency_s == pytest.approx(2 * 4096**3 / 100e12)
    assert est.bottleneck == "compute"
    assert est.method is EstimateMethod.ANALYTICAL and est.match_kind is MatchKind.MODEL
    assert est.components["memory_s"] == pytest.approx(3 * 4096 * 4096 * 2 / 1e12)


def test_memory_bound_gemv_and_no_overlap_mode(round_system):
    q = gemm_query(1, 8192, 8192)
    mem = (8192 + 8192 * 8192 + 8192) * 2 / 1e12
    comp = 2 * 8192 * 8192 / 100e12
    assert RooflineCostProvider(round_system).estimate(q).latency_s == pytest.approx(mem)
    no_overlap = RooflineCostProvider(round_system, mode="no_overlap").estimate(q)
    assert no_overlap.latency_s == pytest.approx(mem + comp)


def test_fp8_uses_fp8_rate_and_missing_dtype_is_reported(round_system):
    est = RooflineCostProvider(round_system).estimate(gemm_query(4096, 4096, 4096, "fp8"))
    assert est.latency_s == pytest.approx(2 * 4096**3 / 200e12)
    int8 = RooflineCostProvider(round_system).estimate(gemm_query(4096, 4096, 4096, "int8"))
    assert int8.latency_s == pytest.approx(2 * 4096**3 / 100e12)
    assert "no int8 rate" in int8.assumptions[0]


def test_roofline_refuses_communication_and_empty_work(round_system):
    p = RooflineCostProvider(round_system)
    q = CostQuery(subject=CostSubject.COMMUNICATION, operation="all_reduce", hardware="round",
                  dtype="bf16", message_bytes=1e6, participants=8)
    assert isinstance(p.supports(q), Miss)
    empty = CostQuery(subject=CostSubject.OPERATOR, operation="view", hardware="round",
                      dtype="bf16")
    assert isinstance(p.estimate(empty), Miss)
    declared = CostQuery(subject=CostSubject.OPERATOR, operation="view", hardware="round",
                         dtype="bf16", zero_cost=True)
    est = p.estimate(declared)
    assert est.latency_s == 0 and est.match_kind is MatchKind.DECLARED


def comm(op, nbytes, p):
    return CostQuery(subject=CostSubject.COMMUNICATION, operation=op, hardware="round",
                     dtype="bf16", engine="network", message_bytes=nbytes, participants=p)


def test_ring_all_reduce_alpha_beta(round_system):
    # ring: 2(p-1)/p * M/B + 2(p-1)*a = 2*7/8*1e9/1e11 + 14e-6
    est = CollectiveCostProvider(round_system, algorithm="ring").estimate(comm("all_reduce", 1e9, 8))
    assert est.latency_s == pytest.approx(2 * 7 / 8 * 1e-2 + 14e-6)
    assert est.validity["tier"] == "link"


def test_tree_wins_for_small_messages_in_auto(round_system):
    small = comm("all_reduce", 1024, 8)
    ring = CollectiveCostProvider(round_system, algorithm="ring").estimate(small).latency_s
    tree = CollectiveCostProvider(round_system, algorithm="tree").estimate(small).latency_s
    auto = CollectiveCostProvider(round_system).estimate(small).latency_s
    assert tree < ring and auto == pytest.approx(tree)
    assert tree == pytest.approx(2 * 1024 / 1e11 + 2 * 3 * 1e-6)


def test_group_beyond_tier_capacity_uses_outer_tier(round_system):
    est = CollectiveCostProvider(round_system, algorithm="ring").estimate(comm("all_gather", 1.6e9, 16))
    assert est.validity["tier"] == "net"
    assert est.latency_s == pytest.approx(15 / 16 * 1.6e9 / 1e10 + 15 * 10e-6)


def test_send_recv(round_system):
    est = CollectiveCostProvider(round_system).estimate(comm("send_recv", 1e8, 2))
    assert est.latency_s == pytest.approx(1e8 / 1e11 + 1e-6)


def test_all_reduce_across_domains_chains_inside_and_trees_between(round_system):
    """16 devices = 2 domains of 8 (link: 1 us, net: 10 us): on an NVIDIA system NCCL's
    tree is a chain of 7 link hops in each domain and 1 net hop between them, both ways;
    the ring and the bandwidth term stay on the net tier. A named tier, or another
    vendor's system, keeps the one-tier model."""
    from dataclasses import replace

    small = comm("all_reduce", 1024, 16)
    other = CollectiveCostProvider(round_system, algorithm="tree").estimate(small)
    assert other.latency_s == pytest.approx(2 * 1024 / 1e10 + 2 * 4 * 10e-6)
    round_system = replace(round_system, device=replace(round_system.device, vendor="nvidia"))
    tree = CollectiveCostProvider(round_system, algorithm="tree").estimate(small)
    assert tree.latency_s == pytest.approx(2 * 1024 / 1e10 + 2 * (7 * 1e-6 + 1 * 10e-6))
    assert tree.validity["tier"] == "net" and "2 link domains" in tree.assumptions[-1]
    ring = CollectiveCostProvider(round_system, algorithm="ring").estimate(small)
    assert ring.latency_s == pytest.approx(2 * 15 / 16 * 1024 / 1e10 + 30 * 10e-6)
    assert CollectiveCostProvider(round_system).estimate(small).latency_s == pytest.approx(
        tree.latency_s)
    # 64 devices: 8 domains, log2(8) = 3 net hops
    big = CollectiveCostProvider(round_system, algorithm="tree").estimate(
        comm("all_reduce", 1024, 64))
    assert big.latency_s == pytest.approx(2 * 1024 / 1e10 + 2 * (7 * 1e-6 + 3 * 10e-6))
    named = CollectiveCostProvider(round_system, algorithm="tree").estimate(
        CostQuery(subject=CostSubject.COMMUNICATION, operation="all_reduce", hardware="round",
                  dtype="bf16", engine="network", message_bytes=1024, participants=16,
                  network_tier="net"))
    assert named.latency_s == pytest.approx(2 * 1024 / 1e10 + 2 * 4 * 10e-6)
