"""Query inspector: build or paste a CostQuery, resolve it as `perfcast evidence query`
does, and see the attempts, the chosen estimate, its provenance, record ids and the
nearest measured rows."""

from __future__ import annotations

import json

from perfcast.workbench import evidence_views as views
from perfcast.workbench.pages.common import header, json_block, show_error, us

EXAMPLE = {"operation": "gemm", "dtype": "bf16", "dims": {"m": 100, "n": 4096, "k": 4096}}


def example_query(db) -> dict:
    """A query between two measured points of the snapshot's largest GEMM curve (the
    static example when it holds none)."""
    curves = views.series(db, "gemm", "bf16")
    if not curves:
        return dict(EXAMPLE)
    key = curves[0]["key"]
    body = {"operation": "gemm", "dtype": "bf16"}
    for sel, fld in views.CONTEXT_SELECTORS.items():
        if sel in key:
            body[fld] = key[sel]
    dims = {k: v for k, v in key.items()
            if k not in views.CONTEXT_SELECTORS and k != "hardware"}
    body["dims"] = {"m": 100, **dims}
    return body


def resolve(wb, ref: str, body: dict) -> tuple[dict, list[dict], str]:
    """(the `evidence query` record, the neighbours, the system asked about)."""
    from perfcast.cli.evidence import query_record
    from perfcast.workbench.api import QueryBody

    q = QueryBody(**body)
    resolvers, hw = wb.query_resolvers(ref, q.hardware, q.policy)
    record = query_record(resolvers, hw, q.spec(), source="query")
    _, db = wb.database(ref)
    return record, views.neighbours(db, q.spec(), hw), hw


def register(wb, jobs) -> None:
    from nicegui import run, ui
    from pydantic import ValidationError

    @ui.page("/query")
    def query_page() -> None:
        header("Query inspector")
        manifests = wb.evidence_store().list()
        if not manifests:
            ui.label("The evidence store is empty: nothing to query.")
            return
        options = {m["digest"]: f"{m['digest'][7:19]} {m.get('name', '')}" for m in manifests}
        with ui.row().classes("full-width"):
            with ui.column().style("width: 24rem"):
                ui.label("build a query").classes("text-bold")
                snap = ui.select(options, value=manifests[0]["digest"], label="snapshot") \
                    .classes("full-width")
                op = ui.input("operation", value="gemm")
                dtype = ui.input("dtype", value="bf16")
                hardware = ui.input("hardware (empty: the snapshot's system)")
                runtime = ui.input("runtime")
                version = ui.input("runtime_version")
                impl = ui.input("implementation")
                dims = ui.input("dims (NAME=VALUE ...)", value="m=100 n=4096 k=4096") \
                    .classes("full-width")
                policy = ui.select(["exact", "interpolate", "extrapolate"], value="interpolate",
                                   label="policy")

                def build() -> None:
                    from perfcast.evidence.query_spec import parse_dim

                    try:
                        d = dict(parse_dim(t) for t in dims.value.split())
                    except Exception as exc:  # noqa: BLE001
                        show_error(out, exc)
                        return
                    body = {"operation": op.value, "dtype": dtype.value, "dims": d}
                    for key, el in (("hardware", hardware), ("runtime", runtime),
                                    ("runtime_version", version), ("implementation", impl)):
                        if el.value:
                            body[key] = el.value
                    body["policy"] = policy.value
                    text.set_value(json.dumps(body, indent=1))

                ui.button("to JSON", on_click=build)
            with ui.column().classes("col-grow"):
                ui.label("or paste one (the fields of an `evidence query --queries` line, "
                         "plus policy)").classes("text-bold")
                try:
                    example = example_query(wb.database(manifests[0]["digest"])[1])
                except Exception:  # noqa: BLE001 - an unreadable snapshot: the static one
                    example = dict(EXAMPLE)
                text = ui.textarea(value=json.dumps(example, indent=1)) \
                    .classes("full-width").style("font-family: monospace").props('rows=10 data-testid="query-json"')
                go = ui.button("resolve").props('data-testid="resolve"')
        out = ui.column().classes("full-width")

        async def resolve_clicked() -> None:
            out.clear()
            try:
                body = json.loads(text.value)
                if not isinstance(body, dict):
                    raise ValueError("the query must be a JSON object")
                record, near, hw = await run.io_bound(resolve, wb, snap.value, body)
            except (ValidationError, ValueError, KeyError) as exc:
                show_error(out, exc)
                return
            except Exception as exc:  # noqa: BLE001 - PerfcastError and the unexpected
                show_error(out, exc)
                return
            with out:
                with ui.card().classes("full-width").props('data-testid="chosen"'):
                    ui.label(f"{us(record['latency_s'])} us   {record['method']} "
                             f"({record['match_kind']})   provider {record['provider']}   "
                             f"confidence {record['confidence']:.2f}   on {hw}") \
                        .classes("text-h6 text-bold")
                    ui.label(f"provider revision {record['provider_revision']}   source "
                             f"revision {record['source_revision']}   query "
                             f"{record['query_digest'][:19]}").classes("text-body2")
                ui.label("resolver attempts (in order)").classes("text-bold")
                ui.table(columns=[{"name": k, "label": k, "field": k, "align": "left"}
                                  for k in ("provider", "outcome", "reason")],
                         rows=[dict(a, i=i) for i, a in enumerate(record["attempts"])],
                         row_key="i").classes("full-width").props('data-testid="attempts"')
                ui.label("raw record ids: " + (", ".join(record["raw_record_ids"]) or "none "
                                                "(an analytic answer)")).style("font-family: monospace")
                ui.label("nearest measured rows of the family").classes("text-bold")
                ui.table(columns=[{"name": k, "label": k, "field": k, "align": "left",
                                   "sortable": True}
                                  for k in ("record_id", "latency_us", "dims", "distance")],
                         rows=[{"record_id": n["record_id"], "latency_us": us(n["latency_s"]),
                                "dims": " ".join(f"{k}={v}" for k, v in n["dims"].items()),
                                "distance": f"{n['distance']:.3f}", "i": i}
                               for i, n in enumerate(near)],
                         row_key="i").classes("full-width").props('data-testid="neighbours"')
                ui.label("the record (evidence query --format json)").classes("text-bold")
                json_block(record)

        go.on_click(resolve_clicked)
