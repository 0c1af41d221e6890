import pytest
import yaml

from perfcast.core.errors import ConfigError
from perfcast.hardware import available_devices, load_system

REQUIRED = {"a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "gb200", "l40s", "mi300x",
            "atlas_800_a2_376t_64g", "atlas_800_a3_752t_128g_die",
            "b300_sxm", "gb300", "rtx_pro_6000_server", "b60", "h100_pcie", "a100_pcie",
            "a30", "l4"}


def test_catalog_has_required_devices():
    assert REQUIRED <= set(available_devices())


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_device_loads_with_sane_values(name):
    s = load_system(name)
    dev = s.device
    assert s.name == name and s.sources, "every profile names its sources"
    bf16 = dev.engine("matrix").peak_for("bf16")
    assert bf16 and 5e13 < bf16 < 1e16      # the Intel B60 (98.3 TFLOPS) is the smallest
    assert dev.engine("vector").peak_for("fp32") > 1e12
    assert 16 * 2**30 <= dev.memory.capacity_bytes <= 512 * 2**30
    assert 2e11 < dev.memory.bw_bytes_per_s < 2e13   # L4 GDDR6 300 GB/s .. B300-class HBM3e
    assert s.tiers and s.tiers[0].bw_bytes_per_s > 1e10
    assert s.digest == load_system(name).digest


def test_h100_spec_sheet_numbers():
    s = load_system("h100_sxm")
    assert s.device.engine("matrix").peak_for("bf16") == pytest.approx(989.4e12, rel=1e-3)
    assert s.device.engine("matrix").peak_for("fp8") == pytest.approx(1978.9e12, rel=1e-3)
    assert s.device.memory.capacity_bytes == 80 * 2**30
    assert s.device.memory.bw_bytes_per_s == pytest.approx(3.35e12)
    assert s.tier_for_group(8).name == "nvlink"
    assert s.tier_for_group(16).name != "nvlink"


def _write(tmp_path, data):
    p = tmp_path / "dev.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _valid():
    return {"name": "round", "vendor": "test", "sources": ["made up"],
            "device": {"matrix_engine": {"peak_tflops": {"bf16": 100}},
                       "vector_engine": {"peak_tflops": {"fp32": 10}},
                       "memory": {"capacity_gib": 10, "bandwidth_gb_per_s": 1000},
                       "launch_overhead_us": 0},
            "efficiency": {"matrix": 1.0, "vector": 1.0, "memory": 1.0},
            "interconnect": [{"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 1,
                              "efficiency": 1.0, "topology": "switch", "group_capacity": 8}]}


def test_user_device_file_loads(tmp_path):
    s = load_system(_write(tmp_path, _valid()))
    assert s.device.engine("matrix").peak_for("bf16") == 100e12


def test_bad_type_names_file_field_and_expected(tmp_path):
    data = _valid()
    data["device"]["memory"]["bandwidth_gb_per_s"] = "fast"
    p = _write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_system(p)
    msg = str(err.value)
    assert str(p) in msg and "device.memory.bandwidth_gb_per_s" in msg and "a number" in msg


def test_missing_field_and_unknown_dtype(tmp_path):
    data = _valid()
    del data["device"]["launch_overhead_us"]
    with pytest.raises(ConfigError, match="device.launch_overhead_us"):
        load_system(_write(tmp_path, data))
    data = _valid()
    data["device"]["matrix_engine"]["peak_tflops"]["fp9"] = 1
    with pytest.raises(ConfigError, match="unknown dtype key 'fp9'"):
        load_system(_write(tmp_path, data))


def test_unknown_device_name():
    with pytest.raises(ConfigError, match="unknown device 'h999'"):
        load_system("h999")


# -- strict loading: unknown keys and zero rates are refused, naming file and field --
def _strict_valid():
    data = _valid()
    data["comm_grid"] = {"shape": [8], "tiers": [{"topology_tier": 0, "interconnect": "link"}]}
    return data


def _load(tmp_path, edit):
    data = _strict_valid()
    edit(data)
    p = _write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_system(p)
    msg = str(err.value)
    assert str(p) in msg
    return msg


def test_the_valid_file_loads(tmp_path):
    p = _write(tmp_path, _strict_valid())
    assert load_system(p).name == "round"


@pytest.mark.parametrize("where, key, field", [
    ((), "efficency", "efficency"),
    (("device",), "hbm", "device.hbm"),
    (("device", "memory"), "bandwith_gb_per_s", "device.memory.bandwith_gb_per_s"),
    (("device", "matrix_engine"), "peak_tflop", "device.matrix_engine.peak_tflop"),
    (("efficiency",), "matrx", "efficiency.matrx"),
    (("interconnect", 0), "latency", "interconnect[0].latency"),
    (("comm_grid",), "shapes", "comm_grid.shapes"),
    (("comm_grid", "tiers", 0), "tier", "comm_grid.tiers[0].tier"),
])
def test_unknown_keys_name_the_key_and_the_known_ones(tmp_path, where, key, field):
    def edit(data):
        node = data
        for k in where:
            node = node[k]
        node[key] = 1
    msg = _load(tmp_path, edit)
    assert f"unknown key {key!r}" in msg and field in msg and "keys among" in msg


def test_unknown_top_level_key_lists_the_known_keys(tmp_path):
    msg = _load(tmp_path, lambda d: d.update(efficency={"matrix": 0.5}))
    for known in ("efficiency", "interconnect", "device", "comm_grid"):
        assert known in msg


@pytest.mark.parametrize("path", [
    ("device", "memory", "bandwidth_gb_per_s"),
    ("device", "memory", "capacity_gib"),
    ("device", "matrix_engine", "peak_tflops", "bf16"),
    ("device", "vector_engine", "peak_tflops", "fp32"),
    ("interconnect", 0, "bandwidth_gb_per_s"),
])
def test_zero_rates_and_bandwidths_are_refused_at_load(tmp_path, path):
    def edit(data):
        node = data
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = 0
    msg = _load(tmp_path, edit)
    assert "a positive number" in msg
    assert ".".join(str(p) for p in path if not isinstance(p, int)).split(".")[-1] in msg


def test_zero_group_capacity_is_refused(tmp_path):
    msg = _load(tmp_path, lambda d: d["interconnect"][0].update(group_capacity=0))
    assert "interconnect[0].group_capacity" in msg


@pytest.mark.parametrize("name", available_devices())
def test_every_shipped_device_passes_the_strict_loader(name):
    assert load_system(name).device.memory.bw_bytes_per_s > 0
