#!/usr/bin/env python3
"""Fail if the library's modules, or its folders, include each other in a
circle.

A module is a .c file and its .h (src/heap.c and src/heap.h are the module
src/heap); module A depends on B when a file of A includes B's header, and
folder F on G when a file of F includes one of G. Any strongly connected
group of more than one module, or of more than one folder, is a circle:
printed, and the exit status is 1. The folders follow the data flow:
base/ (types, configuration, messages, the kernel calls) <- numa/ (where
memory lives: arenas, slice states, huge mappings) <- reclaim/ (giving it
back) <- src/ (the allocator). Run from the repository root (or give it as
the argument); ctest runs it as module_cycles."""
import collections
import glob
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
folders = ("base", "numa", "reclaim", "src")
files = [f for d in folders for f in glob.glob(os.path.join(root, d, "*.[ch]"))]
include = re.compile(r'#include "((?:%s)/[A-Za-z0-9_]+)\.h"' % "|".join(folders))


def module(path):
    return os.path.relpath(path, root)[:-2]


deps = collections.defaultdict(set)
for f in files:
    with open(f) as text:
        for dep in include.findall(text.read()):
            if dep != module(f):
                deps[module(f)].add(dep)

def circles_of(nodes, deps):
    """Tarjan's strongly connected components, iteratively: the groups of
    more than one node."""
    index, low, on_stack, stack, circles = {}, {}, set(), [], []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(deps[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(deps[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


modules = {module(f) for f in files}
folder_deps = collections.defaultdict(set)
for m, ds in list(deps.items()):
    for d in ds:
        if d.split("/")[0] != m.split("/")[0]:
            folder_deps[m.split("/")[0]].add(d.split("/")[0])
circles = circles_of(modules, deps)
folder_circles = circles_of(set(folders), folder_deps)

for group in circles:
    print("module circle: " + " -> ".join(group))
for group in folder_circles:
    print("folder circle: " + " -> ".join(group))
print("%d modules, %d circles; %d folders, %d circles"
      % (len(modules), len(circles), len(folders), len(folder_circles)))
sys.exit(1 if circles or folder_circles else 0)
