"""The systems added after AIConfigurator's `systems/data/` (B300, GB300, RTX PRO 6000
Server, Intel B60), device-name aliases, and `has_matrix_dtype`.

Every expected number is written as the sheet figure and the arithmetic that turns it
into a per-GPU dense value, so a person can check it against the sheet cited in the
YAML file's `sources:`."""

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.core.errors import ConfigError
from perfcast.hardware import (
    available_devices,
    device_aliases,
    load_system,
    resolve_device_name,
)
from perfcast.hardware import catalog_loader

T, G = 1e12, 1e9
GIB = 2**30

# System ids that have tables under AIConfigurator's systems/data/ (ai-dynamo/aiconfigurator
# @ 095f58a, Aug 2026); a100_pcie, a30, h100_pcie and l4 have a system file and only a
# .gitkeep there, and are in the catalog too (from their datasheets).
AIC_SYSTEMS_WITH_DATA = {"a100_sxm", "b200_sxm", "b300_sxm", "b60", "gb200", "gb300",
                         "h100_sxm", "h200_sxm", "l40s", "rtx_pro_6000_server"}
AIC_SYSTEMS_WITHOUT_DATA = {"a100_pcie", "a30", "h100_pcie", "l4"}


def _mx(name):
    return load_system(name).device.engine("matrix")


def test_every_aiconfigurator_system_with_data_is_in_the_catalog_under_its_name():
    assert AIC_SYSTEMS_WITH_DATA | AIC_SYSTEMS_WITHOUT_DATA <= set(available_devices())


# Datasheet columns (dense = half the printed sparse rate): BF16 and FP8 (INT8 where the
# part has no FP8) tensor, FP32, memory GiB and GB/s, and the PCIe tier of an 8-GPU server.
PCIE_SHEETS = {"h100_pcie": (756.5, 1513, 51.2, 80, 2000, "pcie_gen5", 64),
               "a100_pcie": (312, 624, 19.5, 80, 1935, "pcie_gen4", 32),
               "a30": (165, 330, 10.3, 24, 933, "pcie_gen4", 32),
               "l4": (121, 242.5, 30.3, 24, 300, "pcie_gen4", 32)}


@pytest.mark.parametrize("name", sorted(PCIE_SHEETS))
def test_pcie_parts_sheet_numbers(name):
    bf16, low, fp32, gib, bw, tier, tier_bw = PCIE_SHEETS[name]
    s = load_system(name)
    mx = s.device.engine("matrix")
    assert mx.peak_for("bf16") == pytest.approx(bf16 * T)
    assert mx.peak_for("fp8" if name in ("h100_pcie", "l4") else "int8") == pytest.approx(low * T)
    assert s.device.engine("vector").peak_for("fp32") == pytest.approx(fp32 * T)
    assert s.device.memory.capacity_bytes == gib * GIB
    assert s.device.memory.bw_bytes_per_s == pytest.approx(bw * G)
    assert s.tier_for_group(8).name == tier
    assert s.tier_for_group(8).bw_bytes_per_s == pytest.approx(tier_bw * G)
    assert s.tier_for_group(16).name != tier


# The sheet column each Blackwell Ultra profile divides, as printed (PF = 1e15 FLOPS):
# FP4 dense; FP8, BF16, TF32 sparse. Then per-GPU datasheet values (dense INT8, FP32,
# capacity "GB" read as GiB, bandwidth) and the NVLink group.
ULTRA_SHEETS = {
    # HGX B300 8-GPU column: FP4 144 | 108 PF, FP8/FP6 72, FP16/BF16 36, TF32 18 PF; FP32 600 TF
    "b300_sxm": dict(gpus=8, fp4=108e15, fp8=72e15, bf16=36e15, tf32=18e15,
                     int8=0.15e15, fp32=600e12 / 8, gib=270, bw=7.7e12, group=8),
    # GB300 NVL72 rack column: FP4 1,440 | 1,080 PF, FP8/FP6 720, FP16/BF16 360, TF32 180 PF;
    # 576 TB/s HBM
    "gb300": dict(gpus=72, fp4=1080e15, fp8=720e15, bf16=360e15, tf32=180e15,
                  int8=0.165e15, fp32=80e12, gib=279, bw=576e12 / 72, group=72),
}


@pytest.mark.parametrize("name", sorted(ULTRA_SHEETS))
def test_blackwell_ultra_sheet_numbers(name):
    sheet, s = ULTRA_SHEETS[name], load_system(name)
    mx, n = s.device.engine("matrix"), sheet["gpus"]
    assert mx.peak_for("nvfp4") == pytest.approx(sheet["fp4"] / n)          # printed dense
    for dtype in ("fp8", "bf16", "tf32"):                                    # printed sparse
        assert mx.peak_for(dtype) == pytest.approx(sheet[dtype] / n / 2), dtype
    assert mx.peak_for("fp16") == mx.peak_for("bf16")
    assert mx.peak_for("int8") == pytest.approx(sheet["int8"])
    assert s.device.engine("vector").peak_for("fp32") == pytest.approx(sheet["fp32"])
    assert s.device.memory.capacity_bytes == sheet["gib"] * GIB
    assert s.device.memory.bw_bytes_per_s == pytest.approx(sheet["bw"])
    nvl, ib = s.tiers
    assert (nvl.name, nvl.group_capacity, ib.name) == ("nvlink", sheet["group"], "infiniband")
    assert nvl.bw_bytes_per_s == pytest.approx(1.8e12 / 2)      # NVLink 5 1.8 TB/s bidirectional
    assert ib.bw_bytes_per_s == pytest.approx(800e9 / 8)        # one 800 Gb/s ConnectX-8 per GPU
    assert s.tier_for_group(sheet["group"]).name == "nvlink"
    assert s.tier_for_group(sheet["group"] + 1).name == "infiniband"


def test_blackwell_ultra_cross_checks():
    # HGX B300 networking 1.6 TB/s (bidirectional, 8 GPUs); GB300 NVL72 NVLink 130 TB/s (72 GPUs)
    assert load_system("b300_sxm").tiers[1].bw_bytes_per_s == pytest.approx(1.6e12 / 8 / 2)
    assert load_system("gb300").tiers[0].bw_bytes_per_s == pytest.approx(130e12 / 72 / 2, rel=0.01)
    # GB300 rack "up to 20 TB" / 72 = 277.8 GB, read as GiB like the per-GPU "279 GB"
    assert load_system("gb300").device.memory.capacity_bytes == pytest.approx(20e12 / 72 * 2**30 / 1e9,
                                                                             rel=0.01)


def test_dense_is_half_of_sparse_except_blackwell_ultra_fp4():
    # Sheets print 2:4-sparse rates; dense = sparse / 2 for every rate but Blackwell
    # Ultra's FP4, where the sheets print both (18 | 13.5 PF per B300, 20 | 15 per GB300).
    sparse_per_gpu = {"b300_sxm": {"fp8": 9e15, "bf16": 4.5e15, "tf32": 2.25e15},
                      "gb300": {"fp8": 10e15, "bf16": 5e15, "tf32": 2.5e15}}
    for name, rates in sparse_per_gpu.items():
        for dtype, sparse in rates.items():
            assert _mx(name).peak_for(dtype) == pytest.approx(sparse / 2), (name, dtype)
    assert _mx("b300_sxm").peak_for("fp4") == pytest.approx(144e15 / 8 * 0.75)
    assert _mx("gb300").peak_for("fp4") == pytest.approx(1440e15 / 72 * 0.75)
    # B200/GB200 FP4 is a plain 2:1 (HGX B200 144 | 72 PF)
    assert _mx("b200_sxm").peak_for("fp4") == pytest.approx(144e15 / 8 / 2)


def test_b300_and_gb300_are_one_silicon_at_two_clocks():
    # The same ratio on every floating-point tensor rate: the B300 figures come from the
    # same chip at a lower power limit, which is why FP4 13.5 PF (not 14) is used.
    ratios = {d: _mx("gb300").peak_for(d) / _mx("b300_sxm").peak_for(d)
              for d in ("fp4", "fp8", "bf16", "tf32")}
    assert all(r == pytest.approx(2500 / 2250) for r in ratios.values()), ratios
    # Blackwell Ultra gains FP4 over Blackwell and loses INT8
    assert _mx("gb300").peak_for("fp4") == pytest.approx(1.5 * _mx("gb200").peak_for("fp4"))
    assert _mx("b300_sxm").peak_for("int8") < _mx("b200_sxm").peak_for("int8") / 25


def test_rtx_pro_6000_server_sheet_numbers():
    s = load_system("rtx_pro_6000_server")
    mx = s.device.engine("matrix")
    assert s.device.memory.capacity_bytes == 96 * GIB
    assert s.device.memory.bw_bytes_per_s == pytest.approx(1597 * G)   # Server Edition, not 1792
    assert s.device.engine("vector").peak_for("fp32") == pytest.approx(120 * T)
    # secondary (AIConfigurator) dense rates keep Blackwell's 1 : 2 : 4 bf16 : fp8 : fp4 ladder
    assert mx.peak_for("bf16") == pytest.approx(467.8 * T)
    assert mx.peak_for("fp8") == pytest.approx(2 * mx.peak_for("bf16"))
    assert mx.peak_for("fp4") == pytest.approx(4 * mx.peak_for("bf16"))
    assert s.tiers[0].name == "pcie_gen5"
    assert s.tiers[0].bw_bytes_per_s == pytest.approx(128 * G / 2)     # Gen5 x16, per direction
    assert s.tier_for_group(8).name == "pcie_gen5"


def test_b60_sheet_numbers():
    s = load_system("b60")
    mx = s.device.engine("matrix")
    assert s.device.vendor == "intel"
    assert mx.peak_for("int8") == pytest.approx(197 * T)
    assert mx.peak_for("bf16") == pytest.approx(98.3 * T)
    assert mx.peak_for("bf16") == pytest.approx(mx.peak_for("int8") / 2, rel=3e-3)
    assert not s.has_matrix_dtype("fp8")      # no native FP8 XMX path
    assert s.device.memory.capacity_bytes == 24 * GIB
    assert s.device.memory.bw_bytes_per_s == pytest.approx(456 * G)
    assert s.tiers[0].bw_bytes_per_s == pytest.approx(64 * G / 2)      # PCIe 5.0 x8, per direction


@pytest.mark.parametrize("name,dtype,expected", [
    ("b300_sxm", "nvfp4", True), ("gb300", "nvfp4", True), ("b200_sxm", "nvfp4", True),
    ("gb200", "mxfp4", True), ("b300_sxm", "mxfp4", True), ("rtx_pro_6000_server", "nvfp4", True),
    ("h100_sxm", "nvfp4", False), ("h200_sxm", "nvfp4", False), ("h100_sxm", "mxfp4", False),
    ("h100_sxm", "fp4", False), ("a100_sxm", "nvfp4", False), ("l40s", "nvfp4", False),
    ("mi300x", "nvfp4", False),
    ("h100_sxm", "fp8", True), ("h200_sxm", "fp8_block", True), ("a100_sxm", "fp8", False),
    ("b60", "fp8", False), ("b60", "int8", True),
    ("a100_sxm", "int4", True), ("h100_sxm", "int4", False),
    ("h100_sxm", "tf32", True), ("h100_sxm", "fp32", False), ("mi300x", "fp32", True),
    ("b300_sxm", "bfloat16", True), ("gb300", "NVFP4", True), ("b300_sxm", "e2m1", True),
    ("h100_sxm", "int32", False), ("b300_sxm", "bool", False),
])
def test_has_matrix_dtype(name, dtype, expected):
    s = load_system(name)
    assert s.has_matrix_dtype(dtype) is expected
    assert s.device.has_matrix_dtype(dtype) is expected


def test_has_matrix_dtype_agrees_with_peak_for_on_every_device():
    for name in available_devices():
        dev = load_system(name).device
        for dtype in ("bf16", "fp16", "tf32", "fp8", "fp8_block", "int8", "int4", "nvfp4", "mxfp4"):
            assert dev.has_matrix_dtype(dtype) is (dev.engine("matrix").peak_for(dtype) is not None)


def test_has_matrix_dtype_rejects_unknown_spelling():
    with pytest.raises(ConfigError, match="unknown dtype 'fp5'"):
        load_system("b300_sxm").has_matrix_dtype("fp5")


def test_aliases_load_the_same_system():
    for alias, target in device_aliases().items():
        assert target in available_devices()
        assert alias not in available_devices()
        s = load_system(alias)
        assert s.name == target and s.digest == load_system(target).digest
    assert device_aliases()["gb200_sxm"] == "gb200"
    assert resolve_device_name("GB300-NVL72") == "gb300"
    assert resolve_device_name("B300") == "b300_sxm"
    assert resolve_device_name("H100_SXM") == "h100_sxm"
    assert resolve_device_name("gb200") == "gb200"      # the old name keeps working


def test_device_aliases_is_a_copy():
    device_aliases()["h999"] = "h100_sxm"
    with pytest.raises(ConfigError, match="unknown device 'h999'"):
        load_system("h999")


def test_unknown_device_lists_names_and_aliases():
    with pytest.raises(ConfigError) as err:
        load_system("b400")
    msg = str(err.value)
    assert "unknown device 'b400'" in msg and "b300_sxm" in msg and "gb200_sxm" in msg


@pytest.mark.parametrize("body,match", [
    ("aliases:\n  h100_sxm: h200_sxm\n", "shadows a catalog device"),
    ("aliases:\n  b400: b400_sxm\n", "names unknown device 'b400_sxm'"),
    ("aliases: [b300]\n", "is not a mapping"),
])
def test_bad_alias_file_names_file_and_entry(tmp_path, monkeypatch, body, match):
    p = tmp_path / "aliases.yaml"
    p.write_text(body)
    monkeypatch.setattr(catalog_loader, "_aliases_path", lambda: p)
    catalog_loader._load_aliases.cache_clear()
    try:
        with pytest.raises(ConfigError, match=match) as err:
            device_aliases()
        assert str(p) in str(err.value)
    finally:
        monkeypatch.undo()
        catalog_loader._load_aliases.cache_clear()


def test_perfcast_devices_lists_every_catalog_device():
    res = CliRunner().invoke(app, ["devices"], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    for name in available_devices():
        assert name in res.output
    row = next(line for line in res.output.splitlines() if " b300_sxm " in line)
    assert all(f" {v} " in row for v in ("2250", "270", "7700")), row   # bf16, GiB, GB/s
    row = next(line for line in res.output.splitlines() if " gb300 " in line)
    assert all(f" {v} " in row for v in ("2500", "279", "8000")), row
