"""No import cycle between fastattn's modules, lazy imports inside functions included.

Every module under fastattn/ is parsed (nothing is imported or run); each ``import`` and
``from ... import`` anywhere in it (module level, functions, methods, ``try`` blocks) is an
edge to the fastattn module it names, relative imports resolved as Python resolves them.
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg`` (a
name it defines, or a compiled module in it: either runs the package's ``__init__``).
A package's ``__init__`` is the package's own module. The graph must be acyclic: a cycle is
reported with the modules on it, in import order.

The packages import downward only (docs/design.md, "Layout"): every module belongs to one
layer of LAYERS, and may import the modules of its own package and those of lower layers, none
of a higher layer nor of another package of its own layer (the top-level private modules are
one package here). A module no layer names fails the test until it is given one.
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


# lowest first: (the layer's name, the fastattn packages / top-level modules in it)
LAYERS = [
    ("the top-level private modules", {"_kernels", "_ops", "_threads", "_validation", "_quant",
                                       "_config", "_deps", "_memory", "_version", "_cli",
                                       "_build_info", "functional"}),
    ("io", {"io"}),
    ("nn", {"nn"}),
    ("generation", {"generation"}),
    ("models", {"models"}),
    ("text", {"text"}),
    ("audio", {"audio"}),
    ("the applications", {"serve", "dask", "benchmark", "compat"}),
    ("the package", {"__init__", "__main__"}),
]
MAX_LINES = 800


def _unit(module):
    """(layer index, package) of a fastattn module; the top-level private modules are one
    package. None when no layer names it."""
    part = module.split(".")[1] if "." in module else "__init__"
    for i, (_, members) in enumerate(LAYERS):
        if part in members:
            return i, ("<private>" if i == 0 else part)
    return None


def upward_edges(graph, unit=_unit):
    """(module, target, why) for every edge of `graph` that does not run downward, and for every
    module no layer names."""
    bad = []
    for module in sorted(graph):
        here = unit(module)
        if here is None:
            bad.append((module, None, "is in no layer"))
            continue
        for target in graph[module]:
            there = unit(target)
            if there is None or there[1] == here[1] or there[0] < here[0]:
                continue                         # (an unnamed target is reported as a module)
            why = "upward" if there[0] > here[0] else "sideways"
            bad.append((module, target, why))
    return bad


def test_packages_import_downward_only():
    bad = upward_edges(import_graph())
    if bad:
        pytest.fail("imports against the layers (docs/design.md, Layout):\n" + "\n".join(
            f"  {m} {why}" if t is None else f"  {m} -> {t} ({why})" for m, t, why in bad))


def test_the_layer_checker_finds_upward_and_sideways_edges():
    layers = {"low": 0, "mid": 1, "side": 1, "top": 2}

    def unit(m):
        pkg = m.split(".")[0]
        return (layers[pkg], pkg) if pkg in layers else None

    graph = {"low.a": ["low.b"], "low.b": ["mid.x"],          # up
             "mid.x": ["low.a", "mid.y", "side.z"],          # down, own package, sideways
             "mid.y": [], "side.z": [], "top.t": ["mid.x", "side.z"], "odd.q": []}
    assert upward_edges(graph, unit) == [("low.b", "mid.x", "upward"),
                                         ("mid.x", "side.z", "sideways"),
                                         ("odd.q", None, "is in no layer")]
    assert upward_edges({"low.a": ["low.b"], "top.t": ["low.a"]}, unit) == []


def test_every_fastattn_module_is_in_a_layer():
    """The real modules map where docs/design.md puts them (what the layer test relies on)."""
    assert _unit("fastattn") == (len(LAYERS) - 1, "__init__")
    assert _unit("fastattn.__main__")[0] == len(LAYERS) - 1
    assert _unit("fastattn._ops") == _unit("fastattn._kernels") == (0, "<private>")
    assert _unit("fastattn.generation.continuous")[0] < _unit("fastattn.models.seq2seq")[0]
    assert _unit("fastattn.text.cli")[0] < _unit("fastattn.benchmark._cli")[0]
    assert _unit("fastattn.dask")[0] == _unit("fastattn.serve._app")[0]
    assert _unit("fastattn.dask")[1] != _unit("fastattn.serve._app")[1]
    assert _unit("fastattn.compat.sentence_transformers")[0] == _unit("fastattn.dask")[0]
    assert _unit("fastattn.compat.faster_whisper") == \
        _unit("fastattn.compat.sentence_transformers")


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def long_modules(limit=MAX_LINES):
    """(path under the repository, lines) of every module over `limit` lines."""
    out = []
    for path, _ in sorted(_modules().values()):
        n = _lines(path)
        if n > limit:
            out.append((os.path.relpath(path, os.path.dirname(ROOT)), n))
    return out


def test_no_module_over_800_lines():
    long = long_modules()
    if long:
        pytest.fail(f"modules over {MAX_LINES} lines: " +
                    ", ".join(f"{p} ({n})" for p, n in long))


def test_the_line_count_sees_the_largest_module():
    largest = max(_lines(p) for p, _ in _modules().values())
    found = long_modules(largest - 1)
    assert found and all(n == largest for _, n in found)
    assert long_modules(largest) == []
