#!/usr/bin/python3
"""include-cycles.py DIR — fail when the modules of DIR include each other
in a circle.  A module is X.c with X.h; X depends on Y when X.c or X.h
includes "DIR/Y.h".  Prints every cycle found (one per strongly connected
component) and exits 1, else prints the module count and exits 0."""
import os
import re
import sys

d = sys.argv[1] if len(sys.argv) > 1 else "agent"
inc = re.compile(r'^\s*#\s*include\s+"' + re.escape(d.rstrip("/")) + r'/([A-Za-z0-9_]+)\.h"', re.M)
deps = {}
for f in sorted(os.listdir(d)):
    m, ext = os.path.splitext(f)
    if ext not in (".c", ".h"):
        continue
    with open(os.path.join(d, f), encoding="utf-8", errors="replace") as fh:
        deps.setdefault(m, set()).update(y for y in inc.findall(fh.read()) if y != m)

# Tarjan's strongly connected components, iteratively.
index, low, on, stack, sccs, n = {}, {}, set(), [], [], [0]
for root in deps:
    if root in index:
        continue
    work = [(root, iter(sorted(deps.get(root, ()))))]
    index[root] = low[root] = n[0]; n[0] += 1; stack.append(root); on.add(root)
    while work:
        v, it = work[-1]
        w = next(it, None)
        if w is None:
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop(); on.discard(x); comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))
        elif w not in index:
            index[w] = low[w] = n[0]; n[0] += 1; stack.append(w); on.add(w)
            work.append((w, iter(sorted(deps.get(w, ())))))
        elif w in on:
            low[v] = min(low[v], index[w])

for comp in sccs:
    edges = ", ".join(f"{a} -> {b}" for a in comp for b in sorted(deps[a]) if b in comp)
    print(f"include cycle in {d}/: {' '.join(comp)} ({edges})")
if sccs:
    sys.exit(1)
print(f"{d}/: {len(deps)} modules, no include cycle")
