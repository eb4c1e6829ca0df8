"""What a plot function drew, read back as plain values from the matplotlib Figure it saved: per
panel its title, axis labels, limits and ticks, lines, bars, bands, horizontal lines, texts and
legend; colours as hex, positions rounded to 1e-6 (offsets such as 1 - 0.2 carry float noise in
the last bits, and every drawn difference that matters is far larger)."""
import matplotlib
import matplotlib.collections
import matplotlib.figure
import pytest
from matplotlib.colors import to_hex

matplotlib.use("Agg")


# matplotlib's defaults moved off its own (100 dpi, 10-point text, solid lines): what the plot draws with
# these still is what it chose itself.
MOVED_DEFAULTS = {"figure.dpi": 72, "savefig.dpi": 72, "font.size": 12, "lines.linestyle": ":"}


def drawn(plot, *args, style: dict | None = None) -> matplotlib.figure.Figure:
    """Run `plot(*args)`, which saves one figure, under MOVED_DEFAULTS and `style` (more rcParams)."""
    saved = []
    real = matplotlib.figure.Figure.savefig

    def keep(fig, *a, **kw):
        saved.append(fig)
        return real(fig, *a, **kw)
    with pytest.MonkeyPatch.context() as mp, matplotlib.rc_context(MOVED_DEFAULTS | (style or {})):
        mp.setattr(matplotlib.figure.Figure, "savefig", keep)
        plot(*args)
    (fig,) = saved
    return fig


def png_size(path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's header."""
    head = open(path, "rb").read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def num(x) -> float:
    return round(float(x), 6)


def nums(xs) -> list[float]:
    return [num(x) for x in xs]


def one(values: list):
    """The value every element shares, or all of them when they differ."""
    return values[0] if len(set(values)) == 1 else values


def line(ln) -> dict:
    out = {"x": nums(ln.get_xdata()), "y": nums(ln.get_ydata()), "style": ln.get_linestyle(),
           "colour": to_hex(ln.get_color()), "alpha": ln.get_alpha()}
    if ln.get_marker() not in ("None", None, ""):
        out |= {"marker": ln.get_marker(), "face": to_hex(ln.get_markerfacecolor()), "size": ln.get_markersize()}
    return out | ({"label": own_label(ln)} if own_label(ln) else {})


def own_label(artist) -> str | None:
    """The label the plot gave, None for matplotlib's own placeholders (_child3, _container0)."""
    label = artist.get_label()
    return None if label.startswith("_") else label


def bars(container) -> dict:
    rects = list(container)
    edges = [r.get_edgecolor() for r in rects]
    return {"label": own_label(container), "x": nums(r.get_x() + r.get_width() / 2 for r in rects),
            "height": nums(r.get_height() for r in rects), "width": one(nums(r.get_width() for r in rects)),
            "colour": one([to_hex(r.get_facecolor()) for r in rects]),
            "edge": one(["none" if e[3] == 0 else to_hex(e) for e in edges]),
            "hatch": [r.get_hatch() or "" for r in rects]}


def text(t) -> dict:
    return {"text": t.get_text(), "at": nums(t.xy), "offset": nums(t.xyann), "coords": t.anncoords,
            "va": t.get_va(), "size": t.get_fontsize(), "colour": to_hex(t.get_color())}


def collections(ax) -> tuple[list, list]:
    """(horizontal lines, bands): the LineCollections of hlines and the PolyCollections of fill_between."""
    hlines, bands = [], []
    for c in ax.collections:
        if isinstance(c, matplotlib.collections.LineCollection):
            hlines.append({"segments": [[nums(p) for p in seg] for seg in c.get_segments()],
                           "colour": one([to_hex(x) for x in c.get_edgecolor()]),
                           "dashed": one([dashes is not None for _, dashes in c.get_linestyle()]),
                           "width": one(nums(c.get_linewidth())), "label": own_label(c)})
        else:
            box = c.get_paths()[0].get_extents()
            bands.append({"x": nums((box.x0, box.x1)), "y": nums((box.y0, box.y1)),
                          "colour": one([to_hex(x) for x in c.get_facecolor()]), "alpha": c.get_alpha()})
    return hlines, bands


def legend(ax) -> dict | None:
    lg = ax.get_legend()
    if lg is None:
        return None
    out = {"labels": [t.get_text() for t in lg.get_texts()], "loc": lg._loc, "ncols": lg._ncols,
           "size": one([t.get_fontsize() for t in lg.get_texts()])}
    title = lg.get_title()
    return out | ({"title": title.get_text(), "title_size": title.get_fontsize()} if title.get_text() else {})


def axes(ax) -> dict:
    """The frame of a panel; a limit matplotlib chose itself (autoscaled) reads "auto"."""
    return {"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
            "xlim": "auto" if ax.get_autoscalex_on() else nums(ax.get_xlim()),
            "ylim": "auto" if ax.get_autoscaley_on() else nums(ax.get_ylim()),
            "xticks": nums(ax.get_xticks()),
            "xticklabels": [(t.get_text(), t.get_fontsize()) for t in ax.get_xticklabels()]}


def panel(ax) -> dict:
    hlines, bands = collections(ax)
    return {"axes": axes(ax), "lines": [line(ln) for ln in ax.lines], "bars": [bars(c) for c in ax.containers],
            "hlines": hlines, "bands": bands, "texts": [text(t) for t in ax.texts], "legend": legend(ax)}


def figure(fig) -> dict:
    title = fig._suptitle
    return {"inches": nums(fig.get_size_inches()), "panels": [panel(ax) for ax in fig.axes],
            "title": (title.get_text(), title.get_fontsize()) if title is not None else None}
