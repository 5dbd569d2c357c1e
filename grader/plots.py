"""Figures drawn by matplotlib for files people read: the batch report's plots (grader.analytics)
and the lab's bandwidth plot (lab/bandwidth.py). No torch, and matplotlib only once a figure is
drawn, so that importing this module (and `--help`) stays fast where matplotlib is not installed.

Every figure is drawn with the Agg backend (no display: a login node, a compute node, CI) and
comes back as bytes, SVG or PNG; `data_uri` embeds them in a page that needs no other file.
"""

import base64
import io

WIDTH = 7.5     # inches (72 pt each, drawn at 96 px per inch): a laptop screen's page, and A4 paper
HEIGHT = 3.4


def _pyplot():
    """matplotlib.pyplot on the Agg backend (ImportError when matplotlib is not installed)."""
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.fonttype": "path", "svg.hashsalt": "a4", "font.size": 9,
                                "axes.spines.top": False, "axes.spines.right": False})
    import matplotlib.pyplot as plt
    return plt


def render(fig, fmt: str = "svg") -> bytes:
    """The figure as `fmt` bytes (svg: text drawn as paths, no font needed), then closed."""
    plt = _pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=120, metadata={"Date": None} if fmt == "svg" else None)
    plt.close(fig)
    return buffer.getvalue()


def data_uri(image: bytes, fmt: str = "svg") -> str:
    """`image` as a data: URI for an <img src>: the page opens from disk, with no network."""
    kind = "svg+xml" if fmt == "svg" else fmt
    return f"data:image/{kind};base64,{base64.b64encode(image).decode()}"


def histogram(series: dict, bins: list, xlabel: str, marks: dict = None, title: str = "") -> bytes:
    """Overlaid histograms of `series` (label -> values) on `bins` edges, each series' median as a
    dashed line of its colour, and `marks` (label -> x) as thin grey lines (e.g. part points)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT), layout="constrained")
    for i, (label, values) in enumerate(series.items()):
        colour = f"C{i}"
        ax.hist(values, bins=bins, alpha=0.55 if len(series) > 1 else 0.85, color=colour, label=label,
                edgecolor="white")
        if values:
            median = sorted(values)[len(values) // 2]
            ax.axvline(median, color=colour, linestyle="--", linewidth=1.2)
            ax.annotate(f"median {median:g}", (median, 1), xycoords=("data", "axes fraction"),
                        xytext=(3, -10 - 11 * i), textcoords="offset points", color=colour, fontsize=8)
    for label, x in (marks or {}).items():
        ax.axvline(x, color="0.6", linewidth=0.7)
        ax.annotate(label, (x, 0), xycoords=("data", "axes fraction"), xytext=(2, 2),
                    textcoords="offset points", color="0.4", fontsize=7, rotation=90)
    ax.set(xlabel=xlabel, ylabel="hand-ins", title=title)
    ax.yaxis.get_major_locator().set_params(integer=True)
    if len(series) > 1:
        ax.legend(loc="upper left")
    return render(fig)


def heatmap(values: list, rows: list, columns: list, title: str = "", fmt: str = "{:.0%}",
            vmax: float = 1.0, cmap: str = "RdYlGn", empty: str = "-", width: float = WIDTH) -> bytes:
    """A grid of numbers (rows x columns, None for no value) coloured on [0, vmax], each written in
    its cell by `fmt`."""
    plt = _pyplot()
    import numpy
    grid = numpy.array([[numpy.nan if v is None else v for v in row] for row in values], dtype=float)
    height = max(1.6, 0.36 * len(rows) + 1.1)
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    shown = ax.imshow(numpy.ma.masked_invalid(grid), cmap=cmap, vmin=0.0, vmax=vmax or 1.0, aspect="auto")
    ax.set_xticks(range(len(columns)), columns, rotation=20, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            r, g, b, _ = shown.cmap(shown.norm(v)) if v is not None else (1, 1, 1, 1)
            ink = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"   # readable on its cell
            ax.text(j, i, empty if v is None else fmt.format(v), ha="center", va="center", fontsize=8, color=ink)
    ax.set_title(title)
    return render(fig)


def lines(series: dict, xlabel: str, ylabel: str, title: str = "", log2_x: bool = False,
          x_format=None) -> bytes:
    """One line with markers per series (label -> ([x], [y])): the lab's bandwidth against size."""
    plt = _pyplot()
    import matplotlib.ticker
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    if log2_x:
        ax.set_xscale("log", base=2)
    if x_format is not None:
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: x_format(x)))
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return render(fig, "png")
