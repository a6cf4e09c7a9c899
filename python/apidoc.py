"""Write the package's API reference (python/API.md) from its docstrings.

    python3 python/apidoc.py > python/API.md      # make python-api

Every public name of ``jail_sandbox`` (its ``__all__``) and of each module
of ``jail_sandbox.integrations``, in that order: classes with their
signature, docstring and public methods and properties, functions and
constants. Imported from src/ (not an installed copy), without importing
the optional frameworks the integrations need: only their module
docstrings and the names they define are read, from the source.
python/tests/test_package.py checks that API.md is what this prints.
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path
from typing import List

SRC = Path(__file__).resolve().parent / "src"


def _doc(obj: object) -> str:
    return inspect.cleandoc(inspect.getdoc(obj) or "")


def _signature(obj: object) -> str:
    try:
        return str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)"


def _class(name: str, cls: type, out: List[str]) -> None:
    bases = [b.__name__ for b in cls.__bases__ if b is not object]
    out.append(f"### class `{name}`" + (f" ({', '.join(bases)})" if bases else ""))
    out.append("")
    if not issubclass(cls, BaseException):
        out.append(f"```python\n{name}{_signature(cls)}\n```")
        out.append("")
    out.append(_doc(cls))
    out.append("")
    for attr, member in sorted(vars(cls).items()):
        if attr.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
            continue
        doc = _doc(member)
        if isinstance(member, property):
            out.append(f"- property `{attr}`: {doc}" if doc else f"- property `{attr}`")
            continue
        if member.__qualname__.split(".")[0] != cls.__name__:
            continue  # an alias (run_code = run) is listed by its own name
        out.append(f"#### `{name}.{attr}{_signature(member)}`")
        out.append("")
        if doc:
            out.append(doc)
            out.append("")
    aliases = [a for a, m in vars(cls).items() if inspect.isfunction(m) and not a.startswith("_") and m.__name__ != a]
    for a in sorted(aliases):
        out.append(f"- `{name}.{a}` is `{name}.{vars(cls)[a].__name__}`.")
    if aliases:
        out.append("")


def main() -> int:
    sys.path.insert(0, str(SRC))
    import jail_sandbox

    out: List[str] = [
        "# jail-sandbox API reference",
        "",
        "Generated from the docstrings by `python/apidoc.py` (`make python-api`); do not edit by hand.",
        "",
        "## `jail_sandbox`",
        "",
        _doc(jail_sandbox),
        "",
    ]
    for name in jail_sandbox.__all__:
        obj = getattr(jail_sandbox, name)
        if inspect.isclass(obj):
            _class(name, obj, out)
        elif inspect.isfunction(obj):
            out.append(f"### `{name}{_signature(obj)}`")
            out.append("")
            out.append(_doc(obj))
            out.append("")
        else:
            out.append(f"### `{name}` = `{obj!r}`")
            out.append("")
    integrations = SRC / "jail_sandbox" / "integrations"
    out += ["## `jail_sandbox.integrations`", "", inspect.cleandoc(ast.get_docstring(ast.parse((integrations / "__init__.py").read_text())) or ""), ""]
    for path in sorted(integrations.glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out.append(f"### `jail_sandbox.integrations.{path.stem}`")
        out.append("")
        out.append(inspect.cleandoc(ast.get_docstring(tree) or ""))
        out.append("")
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_"):
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                out.append(f"#### {kind} `{node.name}`")
                out.append("")
                out.append(inspect.cleandoc(ast.get_docstring(node) or ""))
                out.append("")
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef) and (not item.name.startswith("_") or item.name == "__call__"):
                            doc = ast.get_docstring(item)
                            if doc:
                                out.append(f"- `{node.name}.{item.name}`: {inspect.cleandoc(doc)}")
                    out.append("")
    text = "\n".join(out)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    sys.stdout.write(text.rstrip("\n") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
