#!/usr/bin/env python3
"""Prints the circles in a Rust crate's file-level import graph.

Usage: scripts/import-cycles.py CRATE_SRC_DIR [--edges]

The graph has one node per .rs file reached from lib.rs (or main.rs) through `mod` declarations
(2018 `foo.rs` + `foo/` and older `foo/mod.rs` alike; `#[path]` is not followed). File A has an
edge to file B when A names a path that resolves into B: `use crate::..`, `use super::..`,
`use self::..`, a `use` of a child module by its bare name, and the same paths written in code
(`crate::x::f()`, `super::X`, `child::f()`). A path resolves to the file of the deepest module it
names, so `crate::FI_EINVAL` is an edge to lib.rs and `crate::ops::FiOps` one to ops.rs; inline
modules (`mod tests { .. }`) belong to their file. A `mod` declaration is not an edge: the parent
naming its child is how the tree is built, not an import. Comments (doc links included) and
string literals are skipped.

Prints each strongly connected component of more than one file, with the edges inside it, and
`no cycles` when there is none. With --edges, the whole graph first. Exits 1 when it found a
cycle, so a check can use it; 2 when it could not read the crate.
"""

import os
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(2)


def strip(text):
    """The source with comments and string/char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
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
            out.append(" ")
        elif c in "rb" and (m := re.match(r'b?r(#*)"', text[i:])) and not _ident_before(text, i):
            close = '"' + m.group(1)
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\(u\{[0-9a-fA-F]*\}|x..|.)|[^\\'])'", text[i:])
            if m:
                out.append("' '")
                i += m.end()
            else:  # a lifetime or label
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident_before(text, i):
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def tokens(code):
    """Identifiers, `::`, and single punctuation characters."""
    return re.findall(r"[A-Za-z_][A-Za-z0-9_]*|::|\S", code)


def inline_scopes(toks):
    """For each token, the names of the inline modules (`mod x { .. }`) it stands in."""
    scopes, stack, depth = [], [], 0  # stack: (name, the brace depth its `}` returns to)
    for i, t in enumerate(toks):
        scopes.append(tuple(name for name, _ in stack))
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
            if stack and stack[-1][1] == depth:
                stack.pop()
        elif t == "mod" and i + 2 < len(toks) and IDENT.fullmatch(toks[i + 1]):
            if toks[i + 2] == "{":
                stack.append((toks[i + 1], depth))
    return scopes


def use_paths(toks, i):
    """Parses the use tree starting at toks[i] (just after `use`); returns (paths, next index)."""

    def tree(i, prefix):
        paths = []
        if toks[i] == "{":
            i += 1
            while toks[i] != "}":
                sub, i = tree(i, prefix)
                paths += sub
                if toks[i] == ",":
                    i += 1
            return paths, i + 1
        if toks[i] == "::":  # `use ::std::..`: an external crate
            return tree(i + 1, prefix + ["::"])
        if toks[i] == "*":
            return [prefix], i + 1
        path = prefix + [toks[i]]
        i += 1
        if toks[i] == "::":
            return tree(i + 1, path)
        if toks[i] == "as":
            i += 2
        return [path], i

    paths, i = tree(i, [])
    return paths, i


class Crate:
    def __init__(self, src):
        self.src = os.path.abspath(src)
        self.modules = {}  # module path (tuple) -> file
        self.files = {}  # file -> (tokens, inline_scopes of them)
        root = next(
            (os.path.join(self.src, f) for f in ("lib.rs", "main.rs")
             if os.path.exists(os.path.join(self.src, f))),
            None,
        )
        if root is None:
            fail(f"{src}: no lib.rs or main.rs")
        self._load((), root)

    def _load(self, modpath, path):
        with open(path, encoding="utf-8") as f:
            toks = tokens(strip(f.read()))
        scopes = inline_scopes(toks)
        self.files[path] = (toks, scopes)
        self.modules[modpath] = path
        if os.path.basename(path) in ("lib.rs", "main.rs", "mod.rs"):
            child_dir = os.path.dirname(path)
        else:
            child_dir = path[: -len(".rs")]
        for i, t in enumerate(toks):
            if t == "mod" and i + 2 < len(toks) and IDENT.fullmatch(toks[i + 1]):
                name, after = toks[i + 1], toks[i + 2]
                inner = modpath + scopes[i] + (name,)
                if after == "{":
                    self.modules[inner] = path
                elif after == ";" and not scopes[i]:
                    for cand in (
                        os.path.join(child_dir, name + ".rs"),
                        os.path.join(child_dir, name, "mod.rs"),
                    ):
                        if os.path.exists(cand):
                            self._load(inner, cand)
                            break

    def file_of(self, path):
        """The file of the deepest module named by an absolute module path."""
        best = None
        for k in range(len(path) + 1):
            if tuple(path[:k]) in self.modules:
                best = self.modules[tuple(path[:k])]
            else:
                break
        return best

    def resolve(self, here, segs):
        """Absolute module path for `segs` written in module `here`, or None if not ours."""
        if not segs:
            return None
        head = segs[0]
        if head == "crate":
            return list(segs[1:])
        if head in ("self", "super"):
            base = list(here)
            rest = list(segs)
            while rest and rest[0] in ("self", "super"):
                if rest.pop(0) == "super":
                    if not base:
                        return None
                    base.pop()
            return base + rest
        if tuple(here) + (head,) in self.modules:
            return list(here) + list(segs)
        return None

    def edges(self):
        graph = {f: set() for f in self.files}
        for modpath, path in self.modules.items():
            if _is_file_root(self, modpath):
                self._scan(modpath, path, graph[path])
        return graph

    def _scan(self, modpath, path, out):
        toks, scopes = self.files[path]
        i = 0
        while i < len(toks):
            t = toks[i]
            here = list(modpath + scopes[i])
            if t == "use" and (i == 0 or toks[i - 1] != "::"):
                paths, i = use_paths(toks, i + 1)
                for p in paths:
                    self._edge(here, p, path, out)
                continue
            elif IDENT.fullmatch(t) and i + 1 < len(toks) and toks[i + 1] == "::" and (
                i == 0 or toks[i - 1] != "::"
            ):
                segs = [t]
                j = i + 1
                while j + 1 < len(toks) and toks[j] == "::" and IDENT.fullmatch(toks[j + 1]):
                    segs.append(toks[j + 1])
                    j += 2
                self._edge(here, segs, path, out)
                i = j
                continue
            i += 1

    def _edge(self, here, segs, path, out):
        target = self.resolve(here, segs)
        if target is None:
            return
        f = self.file_of(target)
        if f and f != path:
            out.add(f)


def _is_file_root(crate, modpath):
    """True when `modpath` is the module a file was loaded as (not an inline module in it)."""
    if not modpath:
        return True
    return crate.modules.get(modpath[:-1]) != crate.modules[modpath]


def sccs(graph):
    """Tarjan's strongly connected components."""
    index, low, on, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        fail(__doc__)
    crate = Crate(args[0])
    graph = crate.edges()
    rel = lambda f: os.path.relpath(f, crate.src)
    if "--edges" in sys.argv:
        for f in sorted(graph):
            print(f"{rel(f)} -> {', '.join(sorted(rel(g) for g in graph[f])) or '(nothing)'}")
        print()
    circles = [c for c in sccs(graph) if len(c) > 1]
    circles.sort(key=lambda c: (-len(c), c))
    for n, comp in enumerate(circles, 1):
        members = set(comp)
        print(f"cycle {n}: {len(comp)} files: {' '.join(rel(f) for f in comp)}")
        for f in comp:
            inside = sorted(rel(g) for g in graph[f] if g in members)
            print(f"  {rel(f)} -> {', '.join(inside)}")
    if not circles:
        print(f"no cycles ({len(graph)} files)")
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
