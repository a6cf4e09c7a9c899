"""Rust source as the measuring scripts read it (import-cycles.py,
fn-lengths.py, client-loc.py): comments, string and char literals and
`#[cfg(test)]` modules taken out, line count kept, so a `file:line` still
points at the code. A lexer, not a parser: good for counting and for `use`
lines, and it never runs or trusts what it reads."""
import re


def strip(text):
    """Drop comments, string and char literals (keep line count)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j
            seg = text[i:j + len(end)]
            out.append('""' + "\n" * seg.count("\n"))
            i = j + len(end)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text[i:j].count("\n"))
            i = j + 1
        elif c == "'" and (re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12])):
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_mods(text):
    """Blank out `#[cfg(test)] mod name { ... }` blocks (newlines kept)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", text)
        if not m:
            return text
        i, depth = m.end(), 1
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[:m.start()] + "\n" * text[m.start():i].count("\n") + text[i:]


def code(path):
    """A file's text with comments, literals and test modules taken out."""
    with open(path, encoding="utf-8") as f:
        return drop_test_mods(strip(f.read()))
