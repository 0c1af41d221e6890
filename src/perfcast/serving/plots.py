"""Pareto plots of a search: self-contained HTML (inline SVG) or PNG (matplotlib)."""

from __future__ import annotations

import html
from pathlib import Path

from perfcast.core.errors import ConfigError


def _points(cands):
    return [(c.metrics["tokens_per_s_per_user"], c.metrics["tokens_per_s_per_gpu"], c)
            for c in cands if c.metrics and not c.error]


def write_html(cands, path: Path, title: str = "tokens/s/GPU vs tokens/s/user") -> None:
    pts = _points(cands)
    w, h, m = 720, 480, 60
    xmax = max((p[0] for p in pts), default=1.0) * 1.05 or 1.0
    ymax = max((p[1] for p in pts), default=1.0) * 1.05 or 1.0

    def sx(x):
        return m + (w - 2 * m) * x / xmax

    def sy(y):
        return h - m - (h - 2 * m) * y / ymax

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">',
             f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 15}" text-anchor="middle">tokens/s/user</text>',
             f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" '
             f'text-anchor="middle">tokens/s/GPU</text>']
    front = sorted((p for p in pts if p[2].pareto), key=lambda p: p[0])
    if front:
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in front)
        parts.append(f'<polyline points="{d}" fill="none" stroke="crimson"/>')
    for x, y, c in pts:
        color = "crimson" if c.pareto else ("steelblue" if c.meets_slo else "lightgray")
        tip = html.escape(f"{c.layout} C={c.concurrency}: {y:.0f} tok/s/GPU, {x:.1f} tok/s/user")
        parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{color}">'
                     f'<title>{tip}</title></circle>')
    parts.append("</svg>")
    doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
           f"</title></head><body><h3>{html.escape(title)}</h3>{''.join(parts)}"
           "<p>red: Pareto frontier; blue: meets the SLOs; grey: misses them</p></body></html>")
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(doc, encoding="utf-8")
    tmp.replace(path)


def write_png(cands, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("PNG plots need matplotlib", field="--plot",
                          expected="`pip install matplotlib` or an .html path") from None
    pts = _points(cands)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for x, y, c in pts:
        ax.scatter(x, y, s=14, c="crimson" if c.pareto else ("steelblue" if c.meets_slo
                                                            else "lightgray"))
    front = sorted((p for p in pts if p[2].pareto), key=lambda p: p[0])
    if front:
        ax.plot([p[0] for p in front], [p[1] for p in front], c="crimson")
    ax.set_xlabel("tokens/s/user")
    ax.set_ylabel("tokens/s/GPU")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def check_plot_path(path: Path) -> None:
    """Refuse, before any work, a plot that could not be written: an unknown suffix or a
    PNG without matplotlib (the folder is checked by cli.errors.check_output_paths)."""
    suffix = path.suffix.lower()
    if suffix not in (".html", ".htm", ".png"):
        raise ConfigError(f"unknown plot format {path.suffix!r}", source=str(path),
                          field="--plot", expected="a .html or .png path")
    if suffix == ".png":
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("PNG plots need matplotlib", source=str(path), field="--plot",
                              expected="`pip install matplotlib` or an .html path") from None


def write_plot(cands, path: Path) -> None:
    check_plot_path(path)
    if path.suffix.lower() == ".png":
        write_png(cands, path)
    else:
        write_html(cands, path)
