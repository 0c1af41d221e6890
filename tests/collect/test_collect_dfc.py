"""DispatchFFNCombine replay: torchrun launch options, EP Size row matching, per-rank
op_summary results."""

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.collect.kernel_types import spec_for
from perfcast.collect.replay import DistributedLaunch, NpuBackend, ReplaySettings, replay_database
from perfcast.collect.replay.base import ReplayCase, ReplayOutcome
from perfcast.collect.replay.npu import outcomes_from_profile
from perfcast.collect.tables import SampleStats, parse_shapes, read_table, split_list
from perfcast.core.errors import ConfigError

DFC_HEADER = ("OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,"
              "Output Shapes,Output Data Types,Output Formats,EP Size,Average Duration(us)")
DFC_ROWS = [
    'dynamic,MIX_AIC,"16,7168;16,8",DT_BF16;INT32,ND;ND,"16,7168",DT_BF16,ND,16,',
    'dynamic,MIX_AIC,"32,7168;32,8",DT_BF16;INT32,ND;ND,"32,7168",DT_BF16,ND,8,',
    'dynamic,MIX_AIC,"64,7168;64,8",DT_BF16;INT32,ND;ND,"64,7168",DT_BF16,ND,16,300',
]
OP_SUMMARY_HEADER = ("Device_id,Op Name,OP Type,OP State,Task Type,Task Start Time(us),"
                     "Task Duration(us),Task Wait Time(us),Block Dim,Input Shapes,"
                     "Input Data Types,Input Formats,Output Shapes,Output Data Types,"
                     "Output Formats")


def test_launch_defaults_follow_the_spec_and_validate():
    launch = DistributedLaunch()
    assert (launch.ep_size, launch.nnodes, launch.node_rank, launch.master_addr) == \
        (16, 1, 0, "127.0.0.1")
    assert launch.torchrun_args() == ["torchrun", "--nproc-per-node=16", "--nnodes=1",
                                      "--node-rank=0", "--master-addr=127.0.0.1"]
    two = DistributedLaunch(ep_size=16, nnodes=2, node_rank=1, master_addr="10.0.0.1",
                            master_port=29600)
    assert two.torchrun_args()[1:] == ["--nproc-per-node=8", "--nnodes=2", "--node-rank=1",
                                       "--master-addr=10.0.0.1", "--master-port=29600"]
    with pytest.raises(ConfigError, match="nproc-per-node"):
        DistributedLaunch(ep_size=16, nproc_per_node=4)
    with pytest.raises(ConfigError, match="node-rank"):
        DistributedLaunch(nnodes=2, node_rank=2)


def test_npu_command_launches_ep_kernels_under_torchrun(tmp_path):
    backend = NpuBackend(python="/usr/bin/python3",
                         launch=DistributedLaunch(ep_size=4, master_port=29611))
    settings = ReplaySettings(repeat_count=5, warmup=2)
    cmd = backend.command(tmp_path / "c.json", tmp_path / "out", settings, distributed=True)
    assert cmd[:3] == ["msprof", f"--output={tmp_path / 'out'}", "--aic-metrics=PipeUtilization"]
    assert cmd[3] == ("--application=torchrun --nproc-per-node=4 --nnodes=1 --node-rank=0 "
                      "--master-addr=127.0.0.1 --master-port=29611 -m "
                      f"perfcast.collect.replay.npu_worker {tmp_path / 'c.json'} "
                      "--repeat-count 5 --warmup 2")


def test_each_ranks_op_summary_contributes_its_timed_calls(tmp_path):
    # two ranks, each: one warm-up call then two timed calls
    for rank, durations in ((0, (500, 100, 110)), (1, (480, 120, 130))):
        d = tmp_path / f"PROF_{rank}" / "mindstudio_profiler_output"
        d.mkdir(parents=True)
        lines = [OP_SUMMARY_HEADER] + [
            f'{rank},aclnnDispatchFFNCombineBF16,DispatchFFNCombine,dynamic,MIX_AIC,{i * 1000},'
            f'{us},0,24,"16,7168;16,8",DT_BF16;INT32,ND;ND,"16,7168",DT_BF16,ND'
            for i, us in enumerate(durations)]
        (d / f"op_summary_{rank}.csv").write_text("\n".join(lines) + "\n")
    case = ReplayCase("DispatchFFNCombine#0", spec_for("DispatchFFNCombine"),
                      parse_shapes("16,7168;16,8"), split_list("DT_BF16;INT32"),
                      split_list("ND;ND"))
    [out] = outcomes_from_profile([case], tmp_path, ReplaySettings(repeat_count=2, warmup=1))
    assert out.stats.count == 4 and out.stats.mean_us == pytest.approx(115.0)


class RecordingBackend:
    name = "recording"

    def __init__(self, launch=None):
        self.launch = launch
        self.cases = []

    def unavailable_reason(self):
        return ""

    def measure(self, cases, settings):
        self.cases += cases
        return [ReplayOutcome(c.case_id, SampleStats.of([250.0])) for c in cases]


@pytest.fixture
def dfc_db(tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    (db / "DispatchFFNCombine.csv").write_text("\n".join([DFC_HEADER] + DFC_ROWS) + "\n")
    return db


def test_rows_are_matched_by_ep_size(dfc_db):
    backend = RecordingBackend(DistributedLaunch(ep_size=16))
    run = replay_database(dfc_db, backend, update_mode="missing-only")
    assert [c.case_id for c in backend.cases] == ["DispatchFFNCombine#0"]
    assert dict(backend.cases[0].runtime) == {"EP Size": "16"}
    assert (run.skipped_other_ep, run.skipped_valid) == (1, 1)
    run = replay_database(dfc_db, RecordingBackend(), update_mode="all", ep_size=8)
    assert [r.row_index for r in run.results] == [1]
    rows = read_table(dfc_db / "DispatchFFNCombine.csv").rows
    assert [r["Average Duration(us)"] for r in rows] == ["250", "250", "300"]


def test_cli_replay_takes_the_dispatch_ffn_combine_flags(dfc_db):
    res = CliRunner().invoke(app, [
        "collect", "replay", "--database-path", str(dfc_db), "--backend", "cpu",
        "--dispatch-ffn-combine-ep-size", "8", "--dispatch-ffn-combine-nproc-per-node", "4",
        "--dispatch-ffn-combine-nnodes", "2", "--dispatch-ffn-combine-node-rank", "1",
        "--dispatch-ffn-combine-master-addr", "127.0.0.1",
        "--dispatch-ffn-combine-master-port", "29612", "--repeat-count", "1"])
    assert res.exit_code == 0, res.output
    # the EP-8 row is tried (and fails on cpu: an EP-group kernel), the two EP-16 rows not
    assert "0 rows on cpu (cpu), 1 failed, 0 skipped, 2 of another EP size" in res.output
    report = next((dfc_db / "reports").glob("profile_update_report_*.md")).read_text()
    assert "replay it with --backend npu" in report
    bad = CliRunner().invoke(app, ["collect", "replay", "--database-path", str(dfc_db),
                                   "--dispatch-ffn-combine-nproc-per-node", "3"])
    assert bad.exit_code != 0 and "--dispatch-ffn-combine-nproc-per-node" in bad.output


class ProfilingBackend(RecordingBackend):
    """Like the NPU backend: reports samples that matched no row after measuring."""

    def __init__(self, unmatched):
        super().__init__()
        self.unmatched = unmatched

    def take_unmatched(self, kernel_type):
        mine = [s for s in self.unmatched if s.kernel_type == kernel_type]
        self.unmatched = [s for s in self.unmatched if s.kernel_type != kernel_type]
        return mine


def test_unmatched_profiled_samples_are_captured_and_appended_in_all_mode(tmp_path, dfc_db):
    # rank 0 ran the row's shape and, once, another shape (48 tokens) twice
    d = tmp_path / "prof" / "PROF_0"
    d.mkdir(parents=True)
    lines = [OP_SUMMARY_HEADER] + [
        f'0,aclnnDispatchFFNCombineBF16,DispatchFFNCombine,dynamic,MIX_AIC,{i * 1000},{us},0,24,'
        f'"{t},7168;{t},8",DT_BF16;INT32,ND;ND,"{t},7168",DT_BF16,ND'
        for i, (t, us) in enumerate(((16, 100), (48, 200), (48, 220), (16, 110)))]
    (d / "op_summary_0.csv").write_text("\n".join(lines) + "\n")
    case = ReplayCase("DispatchFFNCombine#0", spec_for("DispatchFFNCombine"),
                      parse_shapes("16,7168;16,8"), split_list("DT_BF16;INT32"),
                      split_list("ND;ND"))
    unmatched = []
    [out] = outcomes_from_profile([case], tmp_path / "prof", ReplaySettings(repeat_count=2),
                                  unmatched)
    assert out.stats.mean_us == pytest.approx(105.0)
    assert [s.duration_us for s in unmatched] == [200, 220]

    backend = ProfilingBackend(unmatched)
    run = replay_database(dfc_db, backend, update_mode="all", ep_size=16)
    rows = read_table(dfc_db / "DispatchFFNCombine.csv").rows
    assert run.appended == 1 and len(rows) == 4
    assert (rows[3]["Input Shapes"], rows[3]["EP Size"], rows[3]["Average Duration(us)"],
            rows[3]["MicroBench Count"], rows[3]["MicroBench Backend"]) == \
        ("48,7168;48,8", "16", "210", "2", "recording")
    # missing-only never appends
    backend = ProfilingBackend(list(unmatched))
    assert replay_database(dfc_db, backend, update_mode="missing-only").appended == 0
