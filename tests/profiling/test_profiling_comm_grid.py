"""The topology-tier grid of the Ascend catalog entries (TensorCast CommGrid)."""

from perfcast.hardware import load_system


def test_a3_grid_tiers():
    g = load_system("atlas_800_a3_752t_128g_die").comm_grid
    assert g.shape == (48, 8, 2)
    assert g.topology_tier([0, 1]) == 2          # two dies of one package: SIO
    assert g.topology_tier([0, 2]) == 1          # two packages of one node
    assert g.topology_tier(list(range(16))) == 1  # a whole 16-die node
    assert g.topology_tier([0, 16]) == 0         # across nodes
    assert g.tiers[2] == "sio" and g.tier_key("hccs") == 1


def test_a2_grid_and_non_ascend_devices():
    g = load_system("atlas_800_a2_376t_64g").comm_grid
    assert g.tier_for_contiguous(8) == 1 and g.tier_for_contiguous(16) == 0
    assert load_system("h100_sxm").comm_grid is None


def test_grid_stays_out_of_the_system_digest():
    from dataclasses import replace
    s = load_system("atlas_800_a3_752t_128g_die")
    assert replace(s, comm_grid=None).digest == s.digest
