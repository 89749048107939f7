#!/usr/bin/env python3
"""Circles of file imports in a Rust crate.

    scripts/import-cycles.py core/src            # the circles, and the references that close them
    scripts/import-cycles.py core/src --no-tests # leaving out #[cfg(test)] modules and uses
    scripts/import-cycles.py core/src --edges    # every file-to-file reference, then the circles

A file references another when it names something the other defines: `use crate::a::B`,
`use super::{b, c::D}`, or a path in code such as `crate::a::B::new()`, `super::b::f()` or
`child::f()` (a module the file declares). A path is followed through re-exports (`pub use`,
also a plain `use` a child reaches through `super::`, and globs) to the file that defines the
name, so `use crate::Error` counts as a reference to error.rs, not to lib.rs. Declaring a module
(`mod x;`) is not a reference. The graph's strongly connected components with more than one file
are printed, each with the references inside it, so the reasons for a circle can be read off.

Exit status: 0 with no circle, 1 with one or more, 2 on a usage error. Python 3, no dependencies.
"""

import argparse
import os
import re
import signal
import sys
from collections import defaultdict

KEYWORDS_DEF = {"fn", "struct", "enum", "trait", "type", "const", "static", "union"}
# Tokens that may stand between an item's attributes and its keyword.
VISIBILITY = {"pub", "(", ")", "crate", "super", "in", "self", "::"}


# --- lexing ---------------------------------------------------------------------------------


def lex(text):
    """Tokens of Rust source as (kind, text, line): kind is 'id', 'p' (punctuation, `::` one
    token) or 's' (a string literal, its text after a `"`). Comments, char and number literals
    and lifetimes are dropped."""
    toks = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif text.startswith("//", i):
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
                    line += text[i] == "\n"
                    i += 1
        elif c == '"' or (c in "br" and re.match(r'(b?r#*"|b")', text[i:i + 260])):
            start, first = i, line
            i, line = skip_string(text, i, line)
            # Kept (quote first, so that no string reads as punctuation) for #[path = "..."].
            toks.append(("s", '"' + text[start:i].lstrip("br#").strip('"#'), first))
        elif c == "'":
            m = re.match(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]*\}|.)|[^\\\n])'", text[i:i + 16])
            if m:
                i += m.end()
            else:  # a lifetime or a label
                m = re.match(r"'[A-Za-z_][A-Za-z0-9_]*", text[i:])
                i += m.end() if m else 1
        elif c.isalpha() or c == "_":
            m = re.match(r"(r#)?[A-Za-z_][A-Za-z0-9_]*", text[i:])
            word = m.group(0)
            toks.append(("id", word[2:] if word.startswith("r#") else word, line))
            i += m.end()
        elif c.isdigit():
            m = re.match(r"[0-9][0-9A-Za-z_]*(\.[0-9][0-9A-Za-z_]*)?", text[i:])
            i += m.end()
        elif text.startswith("::", i):
            toks.append(("p", "::", line))
            i += 2
        else:
            toks.append(("p", c, line))
            i += 1
    return toks


def skip_string(text, i, line):
    """Index past the string literal starting at i, and the line it ends on."""
    m = re.match(r'b?r(#*)"', text[i:])
    if m:  # raw: no escapes, ends at `"` and the same number of `#`
        end = text.find('"' + m.group(1), i + m.end())
        end = len(text) if end < 0 else end + 1 + len(m.group(1))
        return end, line + text.count("\n", i, end)
    i += 2 if text[i] == "b" else 1
    start = i
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1, line + text.count("\n", start, i)


# --- one file's modules, definitions, imports and paths -----------------------------------------


class Module:
    def __init__(self, path, file, test):
        self.path = path  # tuple of names from the crate root
        self.file = file
        self.test = test
        self.children = set()
        self.defs = set()
        self.imports = {}  # local name -> (absolute path or None, path as written)
        self.globs = []  # absolute paths of `use x::*`
        self.file_children = {}  # name -> (file path, is test) for `mod x;`


def parse_use_tree(toks, i):
    """Leaves of the use tree starting at toks[i], as (segments, alias); alias '*' for a glob,
    None for `self`/the last segment. Returns (leaves, index after the tree)."""
    leaves = []

    def tree(i, prefix):
        segs = list(prefix)
        while i < len(toks):
            kind, t, _ = toks[i]
            if t == "{":
                i += 1
                while toks[i][1] != "}":
                    i = tree(i, segs)
                    if toks[i][1] == ",":
                        i += 1
                return i + 1
            if t == "*":
                leaves.append((segs, "*"))
                return i + 1
            if kind == "id":
                if t == "self" and segs and segs[-1] not in ("super", "self"):
                    i += 1  # `a::{self}` names a itself
                else:
                    segs.append(t)
                    i += 1
                if i < len(toks) and toks[i][1] == "::":
                    i += 1
                    continue
                alias = None
                if i < len(toks) and toks[i][1] == "as":
                    alias = toks[i + 1][1]
                    i += 2
                leaves.append((segs, alias))
                return i
            if t == "::":  # a leading `::`
                i += 1
                continue
            return i
        return i

    i = tree(i, [])
    return leaves, i


def scan_file(root, rel, modpath, test, modules, refs):
    """Reads one file: its modules (inline ones too), what they define and import, and every
    path that may name something in the crate (as refs: file, module, segments, line, whether only tests see it)."""
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        toks = lex(f.read())
    base = os.path.dirname(rel)
    stem = os.path.splitext(os.path.basename(rel))[0]
    # Where `mod x;` looks for x: beside mod.rs/lib.rs/main.rs, else in a folder named after us.
    own_dir = base if stem in ("mod", "lib", "main") else os.path.join(base, stem)

    top = modules.setdefault(modpath, Module(modpath, rel, test))
    top.file, top.test = rel, test
    stack = [(top, -1)]  # (module, brace depth its items live at - 1)
    depth = 0
    attrs = []  # attributes seen since the last item
    i = 0
    while i < len(toks):
        kind, t, line = toks[i]
        cur = stack[-1][0]
        item_level = depth == stack[-1][1] + 1
        if t == "#" and i + 1 < len(toks) and toks[i + 1][1] in ("[", "!"):
            j = i + 1 + (toks[i + 1][1] == "!")
            k, nest = j, 0
            while k < len(toks):
                nest += toks[k][1] == "["
                nest -= toks[k][1] == "]"
                k += 1
                if nest == 0:
                    break
            attrs.append(toks[j + 1:k - 1])
            i = k
            continue
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
            if len(stack) > 1 and depth == stack[-1][1]:
                stack.pop()
        if kind == "id" and t == "mod" and item_level and i + 2 < len(toks):
            name, after = toks[i + 1][1], toks[i + 2][1]
            is_test = cur.test or any(cfg_test(a) for a in attrs)
            child_path = cur.path + (name,)
            cur.children.add(name)
            if after == "{":
                m = modules.setdefault(child_path, Module(child_path, rel, is_test))
                m.file, m.test = rel, is_test
                stack.append((m, depth))
                depth += 1
                i += 3
                attrs = []
                continue
            if after == ";":
                explicit = [path_attr(a) for a in attrs if path_attr(a)]
                if explicit:
                    child = os.path.normpath(os.path.join(base, explicit[0]))
                else:
                    child = os.path.join(own_dir, name + ".rs")
                    if not os.path.exists(os.path.join(root, child)):
                        child = os.path.join(own_dir, name, "mod.rs")
                cur.file_children[name] = (child, is_test)
        if kind == "id" and t == "use" and (i == 0 or toks[i - 1][1] != "::"):
            leaves, j = parse_use_tree(toks, i + 1)
            test_only = cur.test or any(cfg_test(a) for a in attrs)
            for segs, alias in leaves:
                if not segs:
                    continue
                if alias == "*":
                    cur.globs.append(segs)
                    refs.append((rel, cur.path, segs + ["*"], line, test_only))
                    continue
                local = alias or segs[-1]
                if local in ("self", "super", "crate"):
                    local = None
                if local and local != "_":
                    cur.imports[local] = segs
                refs.append((rel, cur.path, segs, line, test_only))
            i = j
            attrs = []
            continue
        if kind == "id" and item_level and t in KEYWORDS_DEF | {"macro_rules"}:
            j = i + 1
            while j < len(toks) and toks[j][1] in ("!", "unsafe", "extern", "async", "fn"):
                if t == "const" and toks[j][1] == "fn":
                    t = "fn"
                j += 1
            if j < len(toks) and toks[j][0] == "id":
                cur.defs.add(toks[j][1])
        if kind == "id" and i + 2 < len(toks) and toks[i + 1][1] == "::" and toks[i + 2][0] == "id":
            prev = toks[i - 1][1] if i else ""
            if prev not in ("::", "$", "in", ".") and t[0].islower():
                segs, j = [t], i + 1
                while j + 1 < len(toks) and toks[j][1] == "::" and toks[j + 1][0] == "id":
                    segs.append(toks[j + 1][1])
                    j += 2
                refs.append((rel, cur.path, segs, line, cur.test))
                i = j
                continue
        if t not in VISIBILITY:
            attrs = []
        i += 1


def cfg_test(attr):
    words = [t for _, t, _ in attr]
    return bool(words) and words[0] == "cfg" and "test" in words and "not" not in words


def path_attr(attr):
    """The file a `#[path = "..."]` attribute names, else None."""
    if len(attr) == 3 and attr[0][1] == "path" and attr[1][1] == "=" and attr[2][0] == "s":
        return attr[2][1][1:]
    return None


# --- resolving paths to the files that define their names ----------------------------------------


class Crate:
    def __init__(self, modules):
        self.modules = modules

    def absolute(self, modpath, segs):
        """segs (as written in module modpath) from the crate root, or None for another crate."""
        first = segs[0]
        if first == "crate":
            return tuple(segs[1:])
        if first in ("self", "super"):
            base = list(modpath)
            k = 0
            while k < len(segs) and segs[k] in ("self", "super"):
                if segs[k] == "super":
                    if not base:
                        return None
                    base.pop()
                k += 1
            return tuple(base) + tuple(segs[k:])
        m = self.modules.get(modpath)
        if m is None:
            return None
        if first in m.children:
            return tuple(modpath) + tuple(segs)
        via = m.imports.get(first)
        if via and via[0] != first:  # `use crate::ep; ... ep::Endpoint` (not `use libc;`)
            target = self.absolute(modpath, via)
            return None if target is None else target + tuple(segs[1:])
        return None  # std, another crate, a local variable's enum, ...

    def resolve(self, path, seen=None):
        """(file, found) for an absolute path: the file whose module defines the named item,
        following imports; found is False when the name was not located (the file is then the
        deepest module the path reaches)."""
        seen = seen or set()
        if path in seen:
            return None, False
        seen.add(path)
        mod, k = (), 0
        while k < len(path) and mod + (path[k],) in self.modules:
            mod += (path[k],)
            k += 1
        m = self.modules[mod]
        if k == len(path):
            return m.file, True
        name = path[k]
        if name in m.defs:
            return m.file, True
        if name in m.imports:
            target = self.absolute(mod, m.imports[name])
            if target is not None:
                f, found = self.resolve(target + path[k + 1:], seen)
                if f:
                    return f, found
            return None, True  # an import from another crate
        for g in m.globs:
            target = self.absolute(mod, g)
            if target is None:
                continue
            f, found = self.resolve(target + path[k:], seen)
            if found and f:
                return f, True
        return m.file, False


def module_path_of(rel):
    parts = os.path.splitext(rel)[0].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def build(root, keep_tests):
    modules, refs = {}, []
    roots = [r for r in ("lib.rs", "main.rs") if os.path.exists(os.path.join(root, r))]
    if not roots:
        sys.exit(f"{root}: no lib.rs or main.rs")
    todo = [(roots[0], (), False)]
    files = {}
    while todo:
        rel, modpath, test = todo.pop()
        if rel in files or not os.path.exists(os.path.join(root, rel)):
            continue
        files[rel] = (modpath, test)
        before = set(modules)
        scan_file(root, rel, modpath, test, modules, refs)
        for mp in set(modules) - before | {modpath}:
            m = modules[mp]
            if m.file != rel:
                continue
            for name, (child, ctest) in m.file_children.items():
                todo.append((child, mp + (name,), ctest))
                modules.setdefault(mp + (name,), Module(mp + (name,), child, ctest))
    crate = Crate(modules)
    test_files = {rel for rel, (_, t) in files.items() if t}
    edges = defaultdict(list)  # (from, to) -> [(line, path as written)]
    for rel, modpath, segs, line, test_only in refs:
        if test_only and not keep_tests:
            continue
        glob = segs[-1] == "*"  # `use x::*` names x's file
        path = crate.absolute(modpath, segs[:-1] if glob else segs)
        if path is None:
            continue
        target, _ = crate.resolve(path)
        if target is None or target == rel:
            continue
        if not keep_tests and target in test_files:
            continue
        edges[(rel, target)].append((line, "::".join(segs)))
    return files, edges


def sccs(nodes, succ):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(succ[w])))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="a crate's source folder (holding lib.rs or main.rs)")
    ap.add_argument("--no-tests", action="store_true",
                    help="leave out #[cfg(test)] modules and use items")
    ap.add_argument("--edges", action="store_true", help="print every reference first")
    args = ap.parse_args()
    if not os.path.isdir(args.src):
        ap.print_usage(sys.stderr)
        print(f"{args.src}: not a folder", file=sys.stderr)
        return 2
    files, edges = build(args.src, not args.no_tests)
    succ = defaultdict(set)
    for a, b in edges:
        succ[a].add(b)
    if args.edges:
        for (a, b), where in sorted(edges.items()):
            print(f"{a} -> {b}  ({', '.join(f'{p}:{ln}' for ln, p in where[:3])})")
        print()
    comps = [c for c in sccs(sorted(files), succ) if len(c) > 1]
    comps.sort(key=lambda c: (-len(c), c))
    print(f"{args.src}: {len(files)} files, {len(edges)} references between files, "
          f"{len(comps)} circle(s)")
    for n, comp in enumerate(comps, 1):
        members = set(comp)
        print(f"\ncircle {n}: {len(comp)} files: {' '.join(comp)}")
        for (a, b), where in sorted(edges.items()):
            if a in members and b in members:
                shown = ", ".join(f"{p} (line {ln})" for ln, p in where[:3])
                more = f", +{len(where) - 3}" if len(where) > 3 else ""
                print(f"  {a} -> {b}: {shown}{more}")
    return 1 if comps else 0


if __name__ == "__main__":
    sys.exit(main())
