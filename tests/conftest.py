import pytest

from perfcast.hardware.catalog_loader import system_from_mapping


@pytest.fixture
def round_system():
    """A made-up device with round numbers: 100 TFLOP/s bf16, 10 TFLOP/s fp32 vector,
    1 TB/s memory, no launch overhead, 100 GB/s link with 1 us latency, efficiency 1."""
    return system_from_mapping({
        "name": "round", "vendor": "test", "sources": ["made up for tests"],
        "device": {"matrix_engine": {"peak_tflops": {"bf16": 100, "fp8": 200}},
                   "vector_engine": {"peak_tflops": {"fp32": 10}},
                   "memory": {"capacity_gib": 10, "bandwidth_gb_per_s": 1000},
                   "launch_overhead_us": 0},
        "efficiency": {"matrix": 1.0, "vector": 1.0, "memory": 1.0},
        "interconnect": [
            {"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 1, "efficiency": 1.0,
             "topology": "switch", "group_capacity": 8},
            {"name": "net", "bandwidth_gb_per_s": 10, "latency_us": 10, "efficiency": 1.0,
             "topology": "fat_tree", "group_capacity": None}],
    }, "<round>")
