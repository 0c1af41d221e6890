"""Temporaries of imports that died are removed on the next store open (and named);
those of a live import are kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.evidence.store import EvidenceStore, locked_temporary


def test_a_killed_import_leaves_nothing_after_the_next_open(tmp_path):
    script = textwrap.dedent(f"""
        import time
        from perfcast.evidence.database import PerformanceDatabase
        from perfcast.evidence.store import EvidenceStore
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from evidence_helpers import make_record

        def slow_save(self, folder, fmt="parquet"):
            (folder / "records.parquet").write_bytes(b"partial")
            time.sleep(60)

        PerformanceDatabase.save = slow_save
        db = PerformanceDatabase.from_records([make_record(1e-3, {{"m": 1}})])
        EvidenceStore({str(tmp_path)!r}).put(db)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.time() + 30
        while not list(tmp_path.glob(".tmp-*/records.parquet")):
            assert time.time() < deadline and proc.poll() is None, "the import did not start"
            time.sleep(0.05)
        # while it runs, its temporary is held: an open keeps it
        assert EvidenceStore(tmp_path).removed == []
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    left = sorted(p.name for p in tmp_path.glob(".tmp-*"))
    assert len(left) == 2  # the folder and its lock file
    result = CliRunner().invoke(app, ["evidence", "list", "--store", str(tmp_path)])
    assert result.exit_code == 0
    assert "removed" in result.output and left[0] in result.output
    assert "interrupted import" in result.output
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_live_temporary_is_kept_and_old_lockless_ones_go(tmp_path):
    with locked_temporary(tmp_path) as tmp:
        (tmp / "x").write_text("partial")
        assert EvidenceStore(tmp_path).removed == []
        assert tmp.exists()
    assert not list(tmp_path.glob(".tmp-*"))  # removed with its lock when done
    old, fresh = tmp_path / ".tmp-old", tmp_path / ".tmp-fresh"
    old.mkdir()
    fresh.mkdir()
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert EvidenceStore(tmp_path).removed == [old]
    assert fresh.exists() and not old.exists()
