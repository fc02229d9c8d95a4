"""No import cycle between fastattn's modules, lazy imports inside functions included.

Every module under fastattn/ is parsed (nothing is imported or run); each ``import`` and
``from ... import`` anywhere in it (module level, functions, methods, ``try`` blocks) is an
edge to the fastattn module it names, relative imports resolved as Python resolves them.
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg`` (a
name it defines, or a compiled module in it: either runs the package's ``__init__``).
A package's ``__init__`` is the package's own module. The graph must be acyclic: a cycle is
reported with the modules on it, in import order.
"""
import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "fastattn")


def _modules():
    """fastattn module name -> (path, is_package) for every .py file under fastattn/."""
    out = {}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, os.path.dirname(ROOT))
        package = rel.replace(os.sep, ".")
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            if f == "__init__.py":
                out[package] = (os.path.join(folder, f), True)
            else:
                out[f"{package}.{f[:-3]}"] = (os.path.join(folder, f), False)
    return out


def _targets(node, name, is_package, modules):
    """The fastattn modules an Import / ImportFrom node of module `name` imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        pkg = ".".join(base + ([node.module] if node.module else []))
    else:
        pkg = node.module or ""
    found = []
    for alias in node.names:
        sub = f"{pkg}.{alias.name}"
        if sub in modules:
            found.append(sub)                # a module of the package
        elif pkg in modules:
            found.append(pkg)                # a name the package defines (or a compiled module
                                             # in it: importing it runs the package first)
        # else a module that is not Python source here (fastattn._build_info, written by the
        # build): it imports nothing of ours
    return found


def import_graph():
    """module -> sorted list of the fastattn modules it imports (itself excluded)."""
    modules = _modules()
    graph = {}
    for name, (path, is_package) in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, name, is_package, modules):
                    # `import fastattn.a.b` imports fastattn.a.b (and its packages, which
                    # import what they import: their own edges)
                    while target and target not in modules:
                        target = target.rpartition(".")[0]
                    if target and target != name and target.split(".")[0] == "fastattn":
                        edges.add(target)
        graph[name] = sorted(edges)
    return graph


def find_cycle(graph):
    """A list of modules [a, b, ..., a] forming a cycle, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_every_module_and_the_lazy_imports():
    graph = import_graph()
    assert "fastattn.models.seq2seq" in graph and "fastattn.nn.transformer" in graph
    # a function-level import is an edge too (fastattn.__main__ imports these in functions)
    assert "fastattn.models.convert" in graph["fastattn.__main__"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    if cycle:
        pytest.fail("import cycle between fastattn modules: " + " -> ".join(cycle))


def test_a_cycle_is_reported_with_its_modules():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": []}) is None
