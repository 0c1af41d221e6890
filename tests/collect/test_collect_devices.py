"""The replay backend follows the database's device; a mismatch is refused."""

import pytest

from perfcast.collect.devices import backend_for_device, choose_backend, database_device
from perfcast.core.errors import ConfigError


def test_backend_of_a_device():
    assert backend_for_device("ATLAS_800_A3_752T_128G_DIE") == "npu"
    assert backend_for_device("h100_sxm") == "cuda"
    assert backend_for_device("local_cpu") == "cpu"
    assert backend_for_device("mi300x") is None and backend_for_device("") is None


def test_choose_backend():
    assert choose_backend("auto", "ATLAS_800_A3_752T_128G_DIE") == "npu"
    assert choose_backend("", "h200_sxm") == "cuda"
    assert choose_backend("cpu", "") == "cpu"          # nothing to contradict
    with pytest.raises(ConfigError, match="cpu timings into a database of ATLAS"):
        choose_backend("cpu", "ATLAS_800_A3_752T_128G_DIE")
    with pytest.raises(ConfigError, match="declares no device"):
        choose_backend("auto", "")
    with pytest.raises(ConfigError, match="no replay backend is known to run on mi300x"):
        choose_backend("auto", "mi300x")
    with pytest.raises(ConfigError, match="unknown backend"):
        choose_backend("tpu", "h100_sxm")


def test_database_device_from_mapping_or_manifest(tmp_path):
    (tmp_path / "collection_manifest.json").write_text('{"runs": [{"device": "local_cpu"}]}')
    assert database_device(tmp_path) == "local_cpu"
    assert database_device(tmp_path, "LOCAL_CPU") == "local_cpu"
    (tmp_path / "op_mapping.yaml").write_text("device: h100_sxm\noperator_mappings: {}\n")
    with pytest.raises(ConfigError, match="for h100_sxm, not local_cpu"):
        database_device(tmp_path, "local_cpu")
