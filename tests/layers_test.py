#!/usr/bin/env python3
"""Checks every `#include "server/<layer>/..."` under server/ against server/layers.txt.

Usage: layers_test.py SOURCE_DIR. Fails (exit 1, one line per finding) on an include of a layer
the including layer may not use, a folder under server/ that layers.txt does not place, or a cycle
in layers.txt. Before scanning it checks itself on a made-up tree that breaks each rule once, so
a checker that stopped finding anything fails too.
"""
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"server/([^/"]+)/', re.M)
SOURCES = ('.h', '.cc', '.cu', '.cuh')


def read_layers(path):
    """layers.txt -> {layer: set of layers it may include}."""
    allowed = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split('#', 1)[0].strip()
            if not line:
                continue
            name, sep, rest = line.partition(':')
            if not sep:
                raise SystemExit(f'{path}:{n}: want "layer: allowed ..."')
            allowed[name.strip()] = set(rest.split())
    return allowed


def find_cycle(allowed):
    """A list of layers forming a cycle, or None."""
    state = {}  # 1: on the path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(allowed.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt] if nxt in path else path + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for layer in sorted(allowed):
        if layer not in state:
            found = visit(layer, [layer])
            if found:
                return found
    return None


def check(source_dir):
    """Every finding, as 'where: what'."""
    server = os.path.join(source_dir, 'server')
    allowed = read_layers(os.path.join(server, 'layers.txt'))
    findings = []
    cycle = find_cycle(allowed)
    if cycle:
        findings.append('server/layers.txt: cycle ' + ' -> '.join(cycle))
    for layer, deps in sorted(allowed.items()):
        for d in sorted(deps - set(allowed)):
            findings.append(f'server/layers.txt: {layer} names {d}, which is not a layer')
    for layer in sorted(os.listdir(server)):
        folder = os.path.join(server, layer)
        if not os.path.isdir(folder):
            continue
        if layer not in allowed:
            findings.append(f'server/{layer}/: not placed in server/layers.txt')
            continue
        for root, _, files in os.walk(folder):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(root, name)
                with open(path, errors='replace') as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    target = m.group(1)
                    if target != layer and target not in allowed[layer]:
                        line = text.count('\n', 0, m.start()) + 1
                        findings.append(f'{os.path.relpath(path, source_dir)}:{line}: {layer} may not '
                                        f'include server/{target}/ (server/layers.txt)')
    return findings


def self_test():
    """The checker finds an upward include, an unplaced folder and a cycle in a made-up tree."""
    with tempfile.TemporaryDirectory() as d:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            with open(os.path.join(d, rel), 'w') as f:
                f.write(text)
        write('server/layers.txt', 'top: low\nlow:\n')
        write('server/top/a.h', '#include "server/low/b.h"\n#include "server/top/c.h"\n')
        write('server/low/b.h', '#include <vector>\n#include "server/top/a.h"\n')
        write('server/stray/s.cc', '')
        found = check(d)
        want = ['server/low/b.h:2: low may not include server/top/',
                'server/stray/: not placed']
        missing = [w for w in want if not any(f.startswith(w) for f in found)]
        if missing or len(found) != 2:
            return [f'self-test: wanted {want}, got {found}']
        write('server/layers.txt', 'top: low\nlow: top\nstray:\n')
        found = check(d)
        if not any('cycle' in f for f in found):
            return [f'self-test: a cycle went unreported: {found}']
    return []


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    findings = self_test() + check(sys.argv[1])
    for f in findings:
        print(f)
    if not findings:
        print('layers: every server/ include points down (server/layers.txt)')
    return 1 if findings else 0


if __name__ == '__main__':
    sys.exit(main())
