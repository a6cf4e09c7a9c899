"""jail's rich results, the part every step pays for: the control
channel, the `display` builtin, the inline matplotlib backend's finder and
the last expression split off, for the cell driver (session/driver.py) and
the script runner (runner.py), each of which is this file with its own main
after it. Trusted, stdlib only. The rest (display.py: bundles, figures) is
here as text, `DISPLAY`, compiled the first time a step shows something, so
a script that shows nothing pays for none of it.

What the code shows goes to the supervisor as MIME bundles, one line each
on the control channel (`{"op": "display", "id", "nonce", "main", "data"}`):
each `display(obj)`, each figure `plt.show()` shows or the code leaves
open without saving it, and the value of its last expression (`main`,
unless the code ends with `;`). The code runs in this process and can
write such lines itself: the supervisor judges every bundle (artifacts/
bundle.rs) and believes none.
"""

import _ast
import builtins
import os
import sys

# json is imported where a line is sent: a step that shows nothing pays
# nothing for it (`import json` brings `re` with it).


def take_control_fd():
    """The control socket, moved off fd 0 to a private close-on-exec fd:
    a buffered reader of it and its descriptor for replies."""
    fd = os.dup(0)  # os.dup's copy is not inheritable (PEP 446)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return open(fd, "rb", buffering=1 << 16, closefd=False), fd


def send(fd, message):
    import json

    data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    while data:
        data = data[os.write(fd, data):]


# Set on a figure the inline backend's canvas printed (savefig, a display).
SAVED = "_jail_saved"


INLINE_BACKEND = "_jail_inline"


class Shown:
    """What a step shows: `cell` is the (id, nonce) of the step in flight
    (None between cells); the bundles are made by display.py's `Results`,
    compiled on first use."""

    def __init__(self, ctl):
        self.ctl = ctl
        self.cell = None
        self._results = None

    def _made(self):
        if self._results is None:
            ns = {"__name__": "_jail_display", "__builtins__": builtins, "send": send, "SAVED": SAVED}
            exec(compile(DISPLAY, "<jail display>", "exec"), ns)
            self._results = ns["Results"](self.ctl)
        self._results.cell = self.cell
        return self._results

    def emit(self, obj, main=False):
        if self.cell is not None:
            self._made().emit(obj, main)

    def flush_figures(self, shown=True):
        if self.cell is not None and "matplotlib.pyplot" in sys.modules:
            self._made().flush_figures(shown)

    def display(self, *objs, **kwargs):
        """Show each object as a rich result of this step (Jupyter's display)."""
        for obj in objs:
            self.emit(obj)


def inline_backend(results):
    """matplotlib's backend for this interpreter, Jupyter's inline one in
    short: Agg's canvas, and a `show` that shows the open figures as the
    step's results. matplotlib loads a `module://NAME` backend by import,
    so a finder makes that module when asked; and as pyplot is first
    imported, where the backend chosen is Agg or none, it becomes this one
    (`MPLBACKEND` itself is left as it was: a Python this one starts does
    not have the module). Nothing of matplotlib is imported here."""

    class Inline:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == INLINE_BACKEND:
                import importlib.util

                return importlib.util.spec_from_loader(name, Inline)
            if name == "matplotlib.pyplot" and name not in sys.modules:
                choose_inline()
            return None

        @staticmethod
        def create_module(spec):
            return None

        @staticmethod
        def exec_module(module):
            from matplotlib.backend_bases import FigureManagerBase
            from matplotlib.backends.backend_agg import FigureCanvasAgg

            class Canvas(FigureCanvasAgg):
                """Agg's, noting each figure it printed (results.flush_figures)."""

                def print_figure(self, *args, **kwargs):
                    setattr(self.figure, SAVED, True)
                    return super().print_figure(*args, **kwargs)

            module.FigureCanvas = Canvas
            module.FigureManager = FigureManagerBase
            module.show = lambda *args, **kwargs: results.flush_figures()

    sys.meta_path.insert(0, Inline)


def choose_inline():
    """Agg, or no choice yet: the inline backend instead (read without
    resolving an automatic choice, which would import pyplot)."""
    mpl = sys.modules.get("matplotlib")
    if mpl is None:
        return
    try:
        chosen = dict.__getitem__(mpl.rcParams, "backend")
        if not isinstance(chosen, str) or chosen.lower() == "agg":
            mpl.rcParams["backend"] = "module://" + INLINE_BACKEND
    except Exception:
        pass


def split_last(code, filename):
    """The code's statements, and its last expression apart (None when it
    ends with a statement, or with `;` as Jupyter reads it). `code` is
    text or a file's bytes (its coding line honoured). `_ast` is the
    interpreter's own: nothing is imported for it."""
    tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST)
    last = None
    semicolon = ";" if isinstance(code, str) else b";"
    if tree.body and isinstance(tree.body[-1], _ast.Expr) and not code.rstrip().endswith(semicolon):
        last = _ast.Expression(tree.body.pop().value)
    return tree, last
