import pytest

from perfcast.collect.replay import ReplayOutcome, ReplaySettings, replay_database
from perfcast.collect.replay.writeback import ReplayFailed
from perfcast.collect.report import hotspots, write_reports
from perfcast.collect.tables import SampleStats, read_table

HEADER = ("OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,"
          "Output Data Types,Output Formats,Average Duration(us),Median Duration(us),"
          "Std Duration(us),Count\n")


class FixedBackend:
    """Replays every case in `durations_us[input_shapes]` us; unknown shapes fail."""

    name = "fixed"

    def __init__(self, durations_us):
        self.durations_us = durations_us
        self.seen = []

    def unavailable_reason(self):
        return ""

    def measure(self, cases, settings):
        out = []
        for c in cases:
            self.seen.append(c.case_id)
            key = ";".join(",".join(map(str, s)) for s in c.input_shapes)
            if key in self.durations_us:
                out.append(ReplayOutcome(c.case_id, SampleStats.of([self.durations_us[key]] * 3)))
            else:
                out.append(ReplayOutcome(c.case_id, error="shape not supported"))
        return out


@pytest.fixture
def db(tmp_path):
    d = tmp_path / "db"
    d.mkdir()
    (d / "MatMulV2.csv").write_text(HEADER + "\n".join([
        'dynamic,AI_CORE,"128,64;64,32",DT_BF16;DT_BF16,ND;ND,"128,32",DT_BF16,ND,10,10,0,2',
        'dynamic,AI_CORE,"256,64;64,32",DT_BF16;DT_BF16,ND;ND,"256,32",DT_BF16,ND,,,,',
        'dynamic,AI_CORE,"512,64;64,32",DT_BF16;DT_BF16,ND;ND,"512,32",DT_BF16,ND,0,,,']) + "\n")
    (d / "Mystery.csv").write_text(HEADER + ',AI_CORE,"4",INT8,ND,"4",INT8,ND,,,,\n')
    return d


def test_missing_only_replays_rows_without_valid_durations(db):
    backend = FixedBackend({"256,64;64,32": 20.0, "512,64;64,32": 40.0})
    run = replay_database(db, backend, update_mode="missing-only")
    assert backend.seen == ["MatMulV2#1", "MatMulV2#2"]       # row 0 has 10 us already
    assert run.skipped_valid == 1 and run.not_replayable_types == ["Mystery"]
    rows = read_table(db / "MatMulV2.csv").rows
    assert rows[0]["Average Duration(us)"] == "10"
    assert rows[1]["Average Duration(us)"] == "20" and rows[1]["MicroBench Count"] == "3"
    assert rows[1]["Profiling Average Duration(us)"] == ""     # nothing was profiled
    assert rows[1]["MicroBench Backend"] == "fixed"


def test_all_mode_keeps_profiling_value_and_flags_gap(db, tmp_path):
    backend = FixedBackend({"128,64;64,32": 13.0, "256,64;64,32": 20.0, "512,64;64,32": 40.0})
    run = replay_database(db, backend, update_mode="all")
    row = read_table(db / "MatMulV2.csv").rows[0]
    assert row["Profiling Average Duration(us)"] == "10"
    assert row["Average Duration(us)"] == "13" and row["MicroBench Average Duration(us)"] == "13"
    spots = hotspots(run)
    assert [(h.result.row_index, round(h.ratio, 3)) for h in spots] == [(0, 1.3)]  # 13/10
    md, csv_path = write_reports(run, timestamp="T")
    assert md.name == "profile_update_report_T.md"
    assert "rows replayed: 3" in md.read_text()
    assert csv_path.read_text().splitlines()[1].startswith("MatMulV2,2,")


def test_failures_are_reported_and_pruning_removes_empty_rows(db):
    backend = FixedBackend({"256,64;64,32": 20.0})
    run = replay_database(db, backend, ops=["MatMulV2"], update_mode="missing-only",
                          prune_empty_duration_rows=True)
    assert [r.row_index for r in run.failed] == [2]
    assert run.pruned == 1
    assert [r["Input Shapes"] for r in read_table(db / "MatMulV2.csv").rows] == [
        "128,64;64,32", "256,64;64,32"]


def test_fail_fast_stops_and_keeps_the_rows_measured_before(db):
    with pytest.raises(ReplayFailed, match="MatMulV2#2.*shape not supported"):
        replay_database(db, FixedBackend({"256,64;64,32": 20.0}), update_mode="missing-only",
                        fail_fast=True)
    rows = read_table(db / "MatMulV2.csv").rows
    assert rows[1]["Average Duration(us)"] == "20"           # measured before the failure
    assert rows[2]["Average Duration(us)"] == "0" and not rows[2]["MicroBench Count"]


def test_interrupted_run_writes_nothing(db):
    class Exploding(FixedBackend):
        def measure(self, cases, settings):
            raise KeyboardInterrupt

    before = (db / "MatMulV2.csv").read_text()
    with pytest.raises(KeyboardInterrupt):
        replay_database(db, Exploding({}))
    assert (db / "MatMulV2.csv").read_text() == before
    assert sorted(p.name for p in db.iterdir()) == ["MatMulV2.csv", "Mystery.csv"]


def test_killed_run_keeps_written_batches_and_resumes(tmp_path):
    d = tmp_path / "db"
    d.mkdir()
    shapes = [f"{64 * (i + 1)},64;64,32" for i in range(5)]
    (d / "MatMulV2.csv").write_text(HEADER + "".join(
        f'dynamic,AI_CORE,"{s}",DT_BF16;DT_BF16,ND;ND,"1,32",DT_BF16,ND,,,,\n' for s in shapes))

    class Killed(FixedBackend):
        """Dies (like SIGKILL: no cleanup runs) on its fourth row."""

        def measure(self, cases, settings):
            if len(self.seen) == 3:
                raise SystemExit("killed")
            return super().measure(cases, settings)

    durations = {s: 10.0 + i for i, s in enumerate(shapes)}
    import perfcast.collect.replay.writeback as wb

    real = wb._write
    calls = []

    def write_only_batches(run, table):       # a kill skips the final flush
        calls.append(len(run.results))
        if len(run.results) % 2 == 0:
            real(run, table)
    wb._write = write_only_batches
    try:
        with pytest.raises(SystemExit):
            replay_database(d, Killed(durations), update_mode="missing-only", batch_rows=2)
    finally:
        wb._write = real
    rows = read_table(d / "MatMulV2.csv").rows
    assert [r["Average Duration(us)"] for r in rows] == ["10", "11", "", "", ""]
    again = FixedBackend(durations)
    run = replay_database(d, again, update_mode="missing-only", batch_rows=2)
    assert again.seen == ["MatMulV2#2", "MatMulV2#3", "MatMulV2#4"] and not run.failed
    assert [r["Average Duration(us)"] for r in read_table(d / "MatMulV2.csv").rows] == \
        ["10", "11", "12", "13", "14"]


def test_replayed_rows_record_backend_and_device(db):
    replay_database(db, FixedBackend({"256,64;64,32": 20.0}), ops=["MatMulV2"],
                    update_mode="missing-only", device="ATLAS_800_A3_752T_128G_DIE")
    row = read_table(db / "MatMulV2.csv").rows[1]
    assert (row["MicroBench Backend"], row["MicroBench Device"]) == \
        ("fixed", "ATLAS_800_A3_752T_128G_DIE")


def test_written_files_keep_their_mode_or_get_the_umask_default(tmp_path):
    import os
    import stat

    from perfcast.collect.tables import write_files_atomic

    old = os.umask(0o022)
    try:
        new, kept = tmp_path / "new.csv", tmp_path / "kept.csv"
        kept.write_text("x\n")
        os.chmod(kept, 0o664)
        write_files_atomic({new: "a\n", kept: "b\n"})
        assert stat.S_IMODE(new.stat().st_mode) == 0o644
        assert stat.S_IMODE(kept.stat().st_mode) == 0o664 and kept.read_text() == "b\n"
    finally:
        os.umask(old)


def test_unknown_op_and_mode_are_clear_errors(db):
    from perfcast.core.errors import ConfigError

    with pytest.raises(ConfigError, match="--ops"):
        replay_database(db, FixedBackend({}), ops=["Nope"])
    with pytest.raises(ConfigError, match="--update-mode"):
        replay_database(db, FixedBackend({}), update_mode="some")


def test_cpu_backend_replays_gemm_rows(tmp_path):
    pytest.importorskip("torch")
    from perfcast.collect.replay import CpuBackend

    d = tmp_path / "db"
    d.mkdir()
    (d / "aten__mm.csv").write_text(HEADER.replace("Count\n", "Count,Input Strides\n")
                                    + ',CPU,"16,32;32,8",FLOAT;FLOAT,ND;ND,,,,,,,,"32,1;1,32"\n'
                                    + ',CPU,"16,32;31,8",FLOAT;FLOAT,ND;ND,,,,,,,,\n')
    (d / "MatMulV2.csv").write_text(
        HEADER + ',AI_CORE,"16,32;32,8",DT_BF16;DT_BF16,ND;FRACTAL_NZ,,,,,,,\n')
    run = replay_database(d, CpuBackend(), settings=ReplaySettings(repeat_count=3, warmup=1))
    errors = {(r.kernel_type, r.row_index): r.outcome.error for r in run.failed}
    assert "torch rejected the row" in errors[("aten__mm", 1)]     # 32 != 31
    assert "FRACTAL_NZ" in errors[("MatMulV2", 0)]
    ok = read_table(d / "aten__mm.csv").rows[0]
    assert ok["MicroBench Count"] == "3" and float(ok["Average Duration(us)"]) > 0
