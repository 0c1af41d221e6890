"""Paths of the real data slices the observe tests read."""

import pathlib

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
SILICON = FIXTURES / "silicon" / "h100_sxm_slice.csv"
AIC_H100 = FIXTURES / "aiconfigurator" / "h100_sxm"
FIA = FIXTURES / "msmodeling" / "fia_fixture"
TRACE = FIXTURES / "observe" / "cpu_mm_trace.json"
A3 = "atlas_800_a3_752t_128g_die"

