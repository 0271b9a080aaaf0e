#!/usr/bin/env python3
"""Lists every precondition check in include/ctxpar as a Markdown table, for docs/errors.md.

Reads the calls that raise a ctxpar::Error -- `chk.require(...)` / `need(...)` (agreed through
`ctxpar::Preconditions`, or thrown at once by the single-rank SWA step), `require_local(...)`
(local), `require_same(...)` (agreed: the value must be equal on every rank), `PackedViolation{...}`
(agreed or local depending on the PackedMetadata builder), `require_contiguous`, `mpi_count` and
explicit `throw Error(...)` -- and prints, per header, the source line, whether it is agreed, and
the condition text as it appears in the message (string literals joined; other expressions shown
as source). Usage: scripts/errors_table.py [include-dir] > table.md
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "include/ctxpar")

# name -> (index of the condition argument, kind)
CALLS = {
    "require_local": (2, "local"),
    "require": (1, "agreed"),
    "need": (1, "agreed"),
    "require_same": (0, "agreed (same on every rank)"),
    "PackedViolation": (0, "see PackedMetadata"),
    "Error": (2, "thrown"),
    "UsageError": (2, "thrown"),
}
PATTERN = re.compile(r"\b(require_local|require_same|require|need|PackedViolation|Error)\s*[({]")


def split_args(text, start):
    """Top-level comma-separated arguments of the call whose '(' or '{' is at text[start]."""
    close = {"(": ")", "{": "}"}[text[start]]
    depth, i, args, cur = 0, start, [], []
    in_str = None
    while i < len(text):
        c = text[i]
        if in_str:
            cur.append(c)
            if c == "\\":
                cur.append(text[i + 1])
                i += 1
            elif c == in_str:
                in_str = None
        elif c in "\"'":
            in_str = c
            cur.append(c)
        elif c in "([{<" and not (c == "<" and text[i + 1] in "<= "):
            depth += 1
            if depth > 1:
                cur.append(c)
        elif c in ")]}>" and not (c == ">" and text[i - 1] in "-= " or (c == ">" and depth <= 1)):
            depth -= 1
            if depth == 0:
                args.append("".join(cur).strip())
                return args
            cur.append(c)
        elif c == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    return args


def text_of(expr):
    """String literals of `expr` joined; non-literal parts kept as `<expr>`."""
    parts = re.split(r'("(?:[^"\\]|\\.)*")', expr)
    out = []
    for p in parts:
        p = p.strip().strip("+").strip()
        if not p:
            continue
        if p.startswith('"'):
            out.append(bytes(p[1:-1], "utf-8").decode("unicode_escape"))
        elif p not in ("std::string(", ")", "std::string"):
            out.append("<" + re.sub(r"\s+", " ", p) + ">")
    return "".join(out)


def function_region(src, pos):
    """Source from the start of the function (or class) enclosing `pos` up to `pos`."""
    starts = [m.end() for m in re.finditer(r"\n}[^\n]*\n", src[:pos])]
    return src[starts[-1] if starts else 0 : pos]


def operator_of(region):
    """The operator name a message starts with: the last `"ctxpar..."` literal of the region."""
    names = re.findall(r'"(ctxpar(?:::[A-Za-z_]+)+|ctxpar [a-z]+)"', region)
    return names[-1] if names else "(the caller's op)"


def kind_of(name, region, path, default):
    if name in ("require", "need"):
        if "LocalChecker" in region and "Preconditions" not in region:
            return "local"
        if "Checker& chk" in region:
            return "agreed (distributed step) / local (single-rank step)"
    if name == "require_local" and "agree_on_checks(" in region:
        return "agreed (default); local with `ctxpar::unchecked`"
    if name == "require_local" and path.name == "sendrecv.hpp":
        return "local (point-to-point: only the partners call it)"
    if name == "require_local" and path.parent.name == "comm":
        return "local (`ctxpar::unchecked` variant)"
    return default


def main():
    print("| header | operator | call | agreed? | condition (message text) |")
    print("|---|---|---|---|---|")
    for path in sorted(ROOT.rglob("*.hpp")):
        src = path.read_text()
        for m in PATTERN.finditer(src):
            name = m.group(1)
            line_start = src.rfind("\n", 0, m.start()) + 1
            line = src[line_start : src.find("\n", m.start())]
            if line.lstrip().startswith("//") or "///" in line[: m.start() - line_start]:
                continue
            if name == "Error" and "throw" not in src[max(0, m.start() - 20) : m.start()]:
                continue
            if name in ("require", "need") and src[m.start() - 1] not in ".(\n (":
                continue
            if re.match(r"\s*(template|inline|void|bool|static|LocalChecker|Preconditions)",
                        line) and name in ("require", "require_local", "need"):
                continue  # a definition, not a call
            args = split_args(src, m.end() - 1)
            index, kind = CALLS[name]
            if len(args) <= index:
                continue
            cond = text_of(args[index])
            if '"' not in args[index]:
                continue  # forwards a condition made elsewhere (listed where it is made)
            region = function_region(src, m.start())
            kind = kind_of(name, region, path, kind)
            if name == "require_local" and len(args) > 1 and args[1].startswith('"'):
                op = text_of(args[1])
            else:
                op = operator_of(region)
            if name == "require_same":
                cond = "every rank must agree on " + cond
            rel = path.relative_to(ROOT.parent)
            print(f"| `{rel}` | `{op}` | `{name}` | {kind} | {cond.replace('|', '/')} |")


if __name__ == "__main__":
    main()
