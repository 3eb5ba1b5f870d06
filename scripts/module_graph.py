#!/usr/bin/env python3
"""The import graph of a Rust crate's files, and its circles.

  python3 scripts/module_graph.py SRC_DIR [--top] [--edges]

A file imports another when it names it by a `crate::`, `super::` or `self::` path (in a `use`
or inline; a module's own submodules and its ancestors are not counted, tests are left out).
Prints every import circle (files that import each other, directly or around a loop) and
exits 1 when there is one; `--top` first lists the imports between top-level modules,
`--edges` the imports inside each circle."""
import os, re, sys, collections

def modules(src):
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if not n.endswith('.rs'):
                continue
            p = os.path.join(root, n)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel[-1] in ('mod', 'lib', 'main'):
                rel = rel[:-1]
            files[tuple(rel)] = p
    return files

def resolve(path, files):
    # longest prefix of path that is a module file
    for k in range(len(path), -1, -1):
        if tuple(path[:k]) in files:
            return tuple(path[:k])
    return None

def strip_comments(text):
    text = re.sub(r'//[^\n]*', '', text)
    return text

def refs(mod, text, files):
    out = set()
    text = strip_comments(text)
    # cut cfg(test) mod blocks roughly: ignore `mod tests {` ... at end
    m = re.search(r'#\[cfg\(test\)\]\s*mod \w+\s*\{', text)
    if m:
        text = text[:m.start()]
    # expand use groups: crate::a::{b, c::d}
    for m in re.finditer(r'\b(crate|super|self)((?:::\w+)+)(::\{[^;]*?\})?', text):
        head, rest, group = m.group(1), m.group(2), m.group(3)
        segs = [s for s in rest.split('::') if s]
        if head == 'crate':
            base = []
        elif head == 'self':
            base = list(mod)
        else:
            base = list(mod)[:-1]
            while segs and segs[0] == 'super':
                base = base[:-1]; segs = segs[1:]
        paths = [base + segs]
        if group:
            inner = group[3:-1]
            for item in re.split(r',(?![^{]*\})', inner):
                item = item.strip()
                if not item: continue
                item = re.sub(r'\s+as\s+\w+', '', item)
                sub = [s for s in re.split(r'::', item.split('{')[0]) if s and s != 'self' and s != '*']
                paths.append(base + segs + sub)
        for p in paths:
            r = resolve(p, files)
            if r is not None and r != mod and not (len(r) < len(mod) and tuple(mod[:len(r)]) == r):
                out.add(r)
    return out

def sccs(graph):
    index, low, stack, on, res = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: res.append(sorted(comp))
    for v in graph:
        if v not in index: visit(v)
    return res

def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    src = sys.argv[1]
    files = modules(src)
    graph = {m: refs(m, open(p).read(), files) for m, p in files.items()}
    name = lambda m: '::'.join(m) or 'crate'
    cyc = sccs(graph)
    if '--top' in sys.argv:
        top = collections.defaultdict(set)
        for m, rs in graph.items():
            for r in rs:
                a, b = (m[:1] or ('crate',)), (r[:1] or ('crate',))
                if a != b: top[a[0]].add(b[0])
        for a in sorted(top): print(f'{a} -> {", ".join(sorted(top[a]))}')
    for c in cyc:
        print('circle:', ' '.join(name(m) for m in c))
    if '--edges' in sys.argv:
        for c in cyc:
            s = set(c)
            for m in c:
                for r in sorted(graph[m]):
                    if r in s: print(f'  {name(m)} -> {name(r)}')
    sys.exit(1 if cyc else 0)
main()
