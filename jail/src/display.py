"""jail's rich results, Jupyter's way: how an object becomes a MIME
bundle (text/plain always, and what its `_repr_mimebundle_` and
`_repr_*_` methods give: HTML, Markdown, SVG, PNG, JPEG, JSON, LaTeX;
images as base64), and the figures shown. Trusted, stdlib only; compiled
only when a step first shows something (shown.py holds it as text), in a
namespace of its own that shown.py gives `send` and `SAVED`.
"""

import io
import sys

# What a representation may be at most here: the supervisor refuses more
# (artifacts/bundle.rs), so larger ones are not sent.
MAX_REPRESENTATION = 2 << 20
MAX_PLAIN = 64 << 10
REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/json", "_repr_json_"),
    ("text/latex", "_repr_latex_"),
)


class Results:
    """Where a step's rich results go: one `display` line each, for the
    step in flight (`cell`, set by shown.py's `Shown`)."""

    def __init__(self, ctl):
        self.ctl = ctl
        self.cell = None

    def emit(self, obj, main=False):
        if self.cell is None:
            return
        data = bundle_of(obj)
        if data:
            cell_id, nonce = self.cell
            send(self.ctl, {"op": "display", "id": cell_id, "nonce": nonce, "main": main, "data": data})

    def flush_figures(self, shown=True):
        """The open figures as results, then closed (Jupyter's inline
        backend): every one at `plt.show()`; at the step's end (`shown`
        false) those the code neither saved to a file nor displayed: a
        saved one's file is its result already, and is not sent twice."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None or self.cell is None:
            return
        try:
            numbers = plt.get_fignums()
            for n in numbers:
                figure = plt.figure(n)
                if shown or not getattr(figure, SAVED, False):
                    self.emit(figure)
            if numbers:
                plt.close("all")
        except Exception:
            pass


def figure_png(obj):
    """A matplotlib Figure's PNG, else None."""
    figure = sys.modules.get("matplotlib.figure")
    if figure is None or not isinstance(obj, figure.Figure):
        return None
    buf = io.BytesIO()
    obj.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def bundle_of(obj):
    """Jupyter's formatters, in short: text/plain from repr, then what the
    object's `_repr_mimebundle_` and `_repr_*_` methods give. A method that
    raises gives nothing; the cell goes on."""
    import base64
    import json

    data = {}
    try:
        png = figure_png(obj)
        if png is not None:
            data["image/png"] = png
    except Exception:
        pass
    method = _method(obj, "_repr_mimebundle_")
    if method is not None:
        try:
            got = method(include=None, exclude=None)
            if isinstance(got, tuple):
                got = got[0]
            if isinstance(got, dict):
                data.update((k, v) for k, v in got.items() if isinstance(k, str))
        except Exception:
            pass
    for mime, name in REPR_METHODS:
        if mime in data:
            continue
        method = _method(obj, name)
        if method is None:
            continue
        try:
            value = method()
        except Exception:
            continue
        if isinstance(value, tuple):
            value = value[0]
        if value is not None:
            data[mime] = value
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)[:MAX_PLAIN]
        except Exception as e:
            data["text/plain"] = f"<repr failed: {type(e).__name__}>"
    out = {}
    for mime, value in data.items():
        if isinstance(value, (bytes, bytearray)):
            if len(value) <= MAX_REPRESENTATION:
                out[mime] = base64.b64encode(bytes(value)).decode("ascii")
        elif isinstance(value, str):
            if mime in ("image/png", "image/jpeg"):
                out[mime] = value  # already base64, as Jupyter carries it
            elif len(value) <= MAX_REPRESENTATION:
                out[mime] = value
        elif mime == "application/json":
            try:
                json.dumps(value)
                out[mime] = value
            except (TypeError, ValueError):
                pass
    return out


def _method(obj, name):
    """A representation method of `obj`'s class (not one a `__getattr__`
    makes up for any name), bound to it."""
    try:
        if getattr(type(obj), name, None) is None:
            return None
        method = getattr(obj, name)
        return method if callable(method) else None
    except Exception:
        return None
