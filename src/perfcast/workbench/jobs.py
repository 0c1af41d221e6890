"""Long computations (search, validate silicon) as background jobs.

Each job runs in its own child process (spawned, so it shares no state with the server),
reports progress over a queue and ends with the record the CLI's `--format json` prints
(or the error a user can act on). Cancelling terminates the child: nothing of a job is
written anywhere, so nothing is left half-done. Jobs of different browser sessions run
side by side."""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field

STATES = ("running", "done", "failed", "cancelled")


def _child(kind: str, args: dict, out) -> None:
    """Runs in the job's process: the command's record function with progress."""
    from perfcast.core.errors import PerfcastError

    try:
        if kind == "search":
            from perfcast.cli.search import SearchArgs, run_search

            state = {"done": 0, "total": 0}

            def on_start(total: int) -> None:
                state["total"] = total
                out.put(("progress", 0, total))

            def on_done() -> None:
                state["done"] += 1
                out.put(("progress", state["done"], state["total"]))

            doc, _ = run_search(SearchArgs(**args), on_start=on_start, on_done=on_done)
        elif kind == "validate":
            from perfcast.cli.validate import ValidateArgs, run_validate, silicon_rows

            a = ValidateArgs(**args)
            rows = silicon_rows(a)
            out.put(("progress", 0, len(rows)))
            doc, _ = run_validate(a, rows,
                                  progress=lambda done, total: out.put(("progress", done, total)))
        else:
            raise ValueError(f"unknown job kind {kind!r}")
        out.put(("done", doc))
    except PerfcastError as exc:
        out.put(("failed", error_json(exc)))
    except Exception as exc:  # a bug: say so with the traceback, never hang
        out.put(("failed", {"error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc()}))


def error_json(exc) -> dict:
    """A PerfcastError as the API reports it: the message and, for a ConfigError, the
    field, the source and what was expected."""
    return {"error": str(exc), "field": getattr(exc, "field", None),
            "source": getattr(exc, "source", None), "expected": getattr(exc, "expected", None)}


@dataclass
class Job:
    id: str
    kind: str
    args: dict
    state: str = "running"
    done: int = 0
    total: int = 0
    started_s: float = field(default_factory=time.time)
    finished_s: float | None = None
    error: dict | None = None
    result: dict | None = None

    def status(self, with_result: bool = True) -> dict:
        d = asdict(self)
        if not with_result:
            d.pop("result")
        return d


class JobManager:
    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._procs: dict[str, multiprocessing.Process] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._ctx = multiprocessing.get_context("spawn")

    def submit(self, kind: str, args: dict) -> Job:
        job = Job(id=f"{kind}-{next(self._ids)}", kind=kind, args=args)
        q = self._ctx.Queue()
        proc = self._ctx.Process(target=_child, args=(kind, args, q), daemon=True)
        with self._lock:
            self._jobs[job.id] = job
            self._procs[job.id] = proc
        proc.start()
        threading.Thread(target=self._follow, args=(job, proc, q), daemon=True).start()
        return job

    def _follow(self, job: Job, proc, q) -> None:
        while True:
            try:
                msg = q.get(timeout=0.2)
            except queue.Empty:
                if not proc.is_alive():
                    try:  # the last message may arrive after the process ended
                        msg = q.get(timeout=0.5)
                    except queue.Empty:
                        self._finish(job, "cancelled" if job.state == "cancelled" else "failed",
                                     error=None if job.state == "cancelled" else
                                     {"error": f"the job's process ended with exit code "
                                               f"{proc.exitcode}"})
                        return
                else:
                    continue
            kind = msg[0]
            if kind == "progress":
                job.done, job.total = msg[1], msg[2]
            elif kind == "done":
                self._finish(job, "done", result=msg[1])
                break
            elif kind == "failed":
                self._finish(job, "failed", error=msg[1])
                break
        proc.join(timeout=5)

    def _finish(self, job: Job, state: str, *, result=None, error=None) -> None:
        with self._lock:
            if job.state == "running":
                job.state, job.result, job.error = state, result, error
                job.finished_s = time.time()

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def list(self) -> list[Job]:
        return list(self._jobs.values())

    def cancel(self, job_id: str) -> Job | None:
        job = self._jobs.get(job_id)
        if job is None:
            return None
        proc = self._procs.get(job_id)
        with self._lock:
            if job.state != "running":
                return job
            job.state, job.finished_s = "cancelled", time.time()
        if proc is not None and proc.is_alive():
            proc.terminate()
        return job

    def shutdown(self) -> None:
        for job_id in list(self._procs):
            self.cancel(job_id)
