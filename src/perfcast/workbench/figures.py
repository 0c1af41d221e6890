"""Plotly figures (declarative dicts, drawn by plotly.js through `ui.plotly`) of the
records the pages show. Pure functions of the records: tested without a browser."""

from __future__ import annotations

import re

METHOD_COLOURS = {"measured": "#1b9e77", "interpolated": "#7570b3", "calibrated": "#d95f02",
                  "analytical": "#666666", "extrapolated": "#e7298a", "fallback": "#a6761d"}
SERIES_COLOURS = {"roofline": "#666666", "database + interpolation": "#7570b3",
                  "calibrated": "#d95f02"}


def heatmap_figure(h: dict) -> dict:
    return {"data": [{"type": "heatmap", "z": h["counts"],
                      "x": [f"2^{r.bit_length() - 1}" for r in h["regions"]],
                      "y": h["families"], "colorscale": "Viridis",
                      "hovertemplate": "%{y}<br>region %{x}<br>%{z} rows<extra></extra>"}],
            "layout": {"title": {"text": "rows per operation family and shape region "
                                         "(log2 bucket of the line axis)"},
                       "margin": {"l": 260, "r": 20, "t": 50, "b": 50},
                       "xaxis": {"title": {"text": "shape region"}},
                       "height": max(320, 28 * len(h["families"]) + 120)}}


def curve_figure(c: dict) -> dict:
    """Three panels sharing the size axis: latency, achieved TFLOP/s, achieved GB/s; the
    measured range (validity domain of the measured and interpolated answers) shaded."""
    axis = c["axis"]
    panels = (("latency_s", "latency (s)", "y"), ("tflops", "achieved TFLOP/s", "y2"),
              ("gb_per_s", "achieved GB/s", "y3"))
    data = []
    for field, _, yref in panels:
        first = yref == "y"
        m = c["measured"]
        data.append({"type": "scatter", "mode": "markers", "name": "measured",
                     "legendgroup": "measured", "showlegend": first,
                     "x": [p["x"] for p in m], "y": [p[field] for p in m],
                     "text": [p["record_id"] for p in m],
                     "marker": {"color": METHOD_COLOURS["measured"], "size": 7},
                     "hovertemplate": f"{axis}=%{{x}}<br>%{{y:.4g}}<br>%{{text}}<extra>measured"
                                      "</extra>", "yaxis": yref})
        for name, pts in c["predicted"].items():
            data.append({"type": "scatter", "mode": "lines+markers", "name": name,
                         "legendgroup": name, "showlegend": first,
                         "x": [p["x"] for p in pts], "y": [p[field] for p in pts],
                         "text": [f"{p['method']} ({p['provider']})" for p in pts],
                         "line": {"color": SERIES_COLOURS.get(name, "#333"), "width": 1.5},
                         "marker": {"size": 4},
                         "hovertemplate": f"{axis}=%{{x}}<br>%{{y:.4g}}<br>%{{text}}"
                                          f"<extra>{name}</extra>", "yaxis": yref})
    shapes = []
    if c["domain"]:
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": c["domain"][0],
                       "x1": c["domain"][1], "y0": 0, "y1": 1, "fillcolor": "#1b9e77",
                       "opacity": 0.08, "line": {"width": 0}, "layer": "below"})
    layout = {"title": {"text": f"{c['operation']} {c['dtype']}: "
                                f"{', '.join(f'{k}={v}' for k, v in c['key'].items())}",
                        "font": {"size": 12}},
              "xaxis": {"type": "log", "title": {"text": axis + (
                  f" (= {', '.join(c['tied'])})" if c["tied"] else "")}, "anchor": "y3"},
              "yaxis": {"type": "log", "domain": [0.68, 1.0],
                        "title": {"text": panels[0][1]}},
              "yaxis2": {"type": "log", "domain": [0.35, 0.63],
                         "title": {"text": panels[1][1]}},
              "yaxis3": {"type": "log", "domain": [0.0, 0.30],
                         "title": {"text": panels[2][1]}},
              "shapes": shapes, "height": 760, "margin": {"l": 70, "r": 20, "t": 60, "b": 50},
              "annotations": [{"text": "shaded: measured range (validity domain)",
                               "xref": "paper", "yref": "paper", "x": 1, "y": 1.04,
                               "showarrow": False, "font": {"size": 10}}]}
    return {"data": data, "layout": layout}


def memory_figure(doc: dict) -> dict:
    mem = doc["memory_bytes"]
    gib = 2 ** 30
    parts = ("weights", "kv_cache", "activations", "reserve")
    data = [{"type": "bar", "orientation": "h", "name": p, "y": ["per device"],
             "x": [mem[p] / gib], "hovertemplate": f"{p}: %{{x:.2f}} GiB<extra></extra>"}
            for p in parts]
    cap = mem["capacity"] / gib
    return {"data": data,
            "layout": {"barmode": "stack", "height": 200,
                       "title": {"text": f"memory per device: {mem['total'] / gib:.2f} GiB of "
                                         f"{cap:.1f} GiB" + ("" if mem["fits"]
                                                              else " (does not fit)")},
                       "xaxis": {"title": {"text": "GiB"},
                                 "range": [0, max(cap, mem["total"] / gib) * 1.05]},
                       "shapes": [{"type": "line", "x0": cap, "x1": cap, "y0": -0.5,
                                   "y1": 0.5, "line": {"color": "red", "dash": "dash"}}],
                       "margin": {"l": 90, "r": 20, "t": 40, "b": 40}}}


def timeline_figure(events: list[dict]) -> dict:
    """Chrome trace events drawn as a Gantt chart: one row per device stream."""
    procs = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    rows: dict[str, dict] = {}
    for e in events:
        if e["ph"] != "X":
            continue
        lane = f"{procs.get(e['pid'], e['pid'])} / {threads.get((e['pid'], e['tid']), e['tid'])}"
        r = rows.setdefault(lane, {"base": [], "x": [], "text": []})
        r["base"].append(e["ts"])
        r["x"].append(max(e["dur"], 1e-3))
        a = e.get("args", {})
        r["text"].append(f"{e['name']}<br>{a.get('method', '')} {a.get('provider', '')}")
    data = [{"type": "bar", "orientation": "h", "name": lane, "y": [lane] * len(r["x"]),
             "base": r["base"], "x": r["x"], "text": r["text"], "textposition": "none",
             "hovertemplate": "%{text}<br>start %{base:.1f} us, %{x:.2f} us<extra></extra>"}
            for lane, r in rows.items()]
    return {"data": data,
            "layout": {"barmode": "overlay", "height": 160 + 40 * len(rows),
                       "title": {"text": "step timeline (streams per device)"},
                       "xaxis": {"title": {"text": "time (us)"}}, "showlegend": False,
                       "margin": {"l": 260, "r": 20, "t": 40, "b": 40}}}


def pareto_figure(doc: dict) -> dict:
    """Every simulated configuration (meets the SLOs or not), the frontier joined, and
    the TPOT limit as the tokens/s/user it allows. customdata: index into
    doc["configurations"]."""
    rows = doc["configurations"]
    groups = {"meets the SLOs": [], "misses an SLO": [], "Pareto frontier": []}
    for i, c in enumerate(rows):
        if c["tokens_per_s_per_gpu"] is None:
            continue
        groups["Pareto frontier" if c["pareto"] else
               "meets the SLOs" if c["meets_slo"] else "misses an SLO"].append(i)
    style = {"meets the SLOs": {"color": "#1f77b4", "size": 6},
             "misses an SLO": {"color": "#bbbbbb", "size": 5},
             "Pareto frontier": {"color": "#d62728", "size": 10}}
    data = []
    for name, idx in groups.items():
        idx = sorted(idx, key=lambda i: rows[i]["tokens_per_s_per_user"])
        data.append({"type": "scatter",  # SVG: WebGL is software-rendered headless
                     "mode": "lines+markers" if name == "Pareto frontier" else "markers",
                     "name": name, "x": [rows[i]["tokens_per_s_per_user"] for i in idx],
                     "y": [rows[i]["tokens_per_s_per_gpu"] for i in idx],
                     "customdata": idx, "marker": style[name],
                     "text": [f"{rows[i]['layout']} C={rows[i]['concurrency']}" for i in idx],
                     "hovertemplate": "%{text}<br>%{x:.1f} tok/s/user, %{y:.1f} tok/s/GPU"
                                      "<extra></extra>"})
    slo = doc["slo"]
    shapes, notes = [], []
    if slo.get("max_tpot_ms"):
        x = 1000.0 / slo["max_tpot_ms"]
        shapes.append({"type": "line", "x0": x, "x1": x, "yref": "paper", "y0": 0, "y1": 1,
                       "line": {"color": "orange", "dash": "dash"}})
        notes.append({"x": x, "y": 1, "yref": "paper", "text": f"TPOT {slo['max_tpot_ms']:g} ms",
                      "showarrow": False, "xanchor": "left"})
    title = f"{doc['evaluated']} configurations, {doc['meet_slo']} meet the SLOs"
    if slo.get("max_ttft_ms"):
        title += f" (TTFT <= {slo['max_ttft_ms']:g} ms, {slo['statistic']})"
    return {"data": data,
            "layout": {"title": {"text": title}, "height": 520, "shapes": shapes,
                       "annotations": notes, "clickmode": "event",
                       "legend": {"orientation": "h", "y": -0.15},
                       "xaxis": {"title": {"text": "tokens/s/user"}},
                       "yaxis": {"title": {"text": "tokens/s/GPU"}},
                       "margin": {"l": 70, "r": 20, "t": 50, "b": 50}}}


def explain_figure(doc: dict) -> dict:
    """Mean time per phase of a `serve --explain` record as two stacked bars: TTFT and
    end-to-end latency (a phase shows in the bars it is part of)."""
    from perfcast.serving.explain import E2E_PHASES, TTFT_PHASES

    bars = (("TTFT", TTFT_PHASES), ("e2e", E2E_PHASES))
    data = []
    for name, stats in doc["phases"].items():
        xs = [stats["mean"] if name in phases else 0.0 for _, phases in bars]
        if all(abs(x) < 1e-9 for x in xs):   # absent (float remainders of ~1e-17 ms)
            continue
        data.append({"type": "bar", "orientation": "h", "name": name, "x": xs,
                     "y": [label for label, _ in bars],
                     "hovertemplate": f"{name}: %{{x:.2f}} ms<extra></extra>"})
    return {"data": data,
            "layout": {"title": {"text": f"where the time goes (mean of {doc['requests']} "
                                         "requests, ms)"},
                       "barmode": "stack", "height": 260,
                       "xaxis": {"title": {"text": "ms"}},
                       "margin": {"l": 60, "r": 20, "t": 50, "b": 40}}}


LAYOUT = re.compile(r"(\d+)xtp(\d+)(?:dp(\d+))?(?:ep(\d+))?")


def serve_args_for(search: dict, row: dict) -> dict:
    """The `perfcast serve` options (ServeArgs fields) that simulate one configuration of
    a search record as the search did (its layout label, concurrency, lengths and the
    search's request count per client)."""
    inp = search["inputs"]
    pools = [(int(w), int(tp), int(dp or 1), int(ep or 1))
             for w, tp, dp, ep in LAYOUT.findall(row["layout"].replace(" ", ""))]
    if not pools:
        raise ValueError(f"cannot read the layout {row['layout']!r}")
    w, tp, dp, ep = pools[0]
    from perfcast.workload import builtin_models

    model = inp["model"] if inp["model"] in builtin_models() else inp["model_source"]
    args = {"model": model or inp["model"], "device": inp["device"],
            "backend": inp["backend"], "backend_version": inp["backend_version"] or "",
            "tp_size": tp, "dp_size": dp, "ep_size": ep, "workers": w, "mode": row["mode"],
            "isl": inp["isl"], "osl": inp["osl"], "range_ratio": inp["range_ratio"],
            "concurrency": row["concurrency"],
            "num_requests": inp["client"]["requests_per_client"] * row["concurrency"],
            "calibration": calibration_ref(search["calibration"]),
            "stack": (inp.get("stack") or {}).get("requested") or "auto"}
    if row["mode"] == "disagg" and len(pools) > 1:
        dw, dtp, ddp, dep = pools[1]
        args.update(decode_workers=dw, decode_tp_size=dtp, decode_dp_size=ddp,
                    decode_ep_size=dep)
    ev = search.get("provenance", {}).get("evidence") if isinstance(
        search.get("provenance"), dict) else None
    if ev and ev.get("root"):
        args["evidence_root"] = ev["root"]
    return args


def calibration_ref(digest: str) -> str:
    """What `--calibration` takes for the revision a record names: `default` for the
    shipped revision (not in any store), `none`, else the digest."""
    from perfcast.calibrate.store import default_revision

    if digest in ("none", default_revision().digest):
        return "default" if digest != "none" else "none"
    return digest


def scatter_figure(rows: list[dict], metric: str, label: str = "") -> list[dict]:
    """Predicted vs measured `metric` (ttft | tpot) traces, one per system/model/backend;
    hover: the row id, version, concurrency, reason and assumptions."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        pred, meas = r.get(f"pred_{metric}_ms"), r.get(f"measured_{metric}_ms")
        if pred is None or meas is None or pred <= 0 or meas <= 0:
            continue
        groups.setdefault(f"{label}{r['system']} {r['model'].split('/')[-1]} {r['backend']}",
                          []).append(r)
    out = []
    for name, rs in sorted(groups.items()):
        out.append({"type": "scatter", "mode": "markers", "name": name,
                    "x": [r[f"measured_{metric}_ms"] for r in rs],
                    "y": [r[f"pred_{metric}_ms"] for r in rs],
                    "text": [f"{r['row_id']}<br>{r['backend']} {r['backend_version']} "
                             f"{r['mode']} isl {r['isl']} osl {r['osl']} C={r['concurrency']}"
                             + (f"<br>assumptions: {'; '.join(r['assumptions'])}"
                                if r.get("assumptions") else "") for r in rs],
                    "hovertemplate": "measured %{x:.2f} ms, predicted %{y:.2f} ms<br>%{text}"
                                     "<extra></extra>"})
    return out


def validation_figure(traces: list[dict], metric: str) -> dict:
    xs = [v for t in traces for v in t["x"] + t["y"]]
    lo, hi = (min(xs) / 1.5, max(xs) * 1.5) if xs else (0.1, 10)
    return {"data": traces + [{"type": "scatter", "mode": "lines", "name": "predicted = measured",
                               "x": [lo, hi], "y": [lo, hi],
                               "line": {"color": "#999", "dash": "dot"}}],
            "layout": {"title": {"text": f"{metric.upper()}: predicted vs measured (ms)"},
                       "xaxis": {"type": "log", "title": {"text": "measured (ms)"}},
                       "yaxis": {"type": "log", "title": {"text": "predicted (ms)"}},
                       "height": 480, "margin": {"l": 70, "r": 20, "t": 50, "b": 50}}}
