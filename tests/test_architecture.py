"""The package's shape, checked statically from the source (docs/architecture.md draws it).

* layers: a module imports only from its own layer or the layers below it (every import counts, module-level or
  inside a function; only `if TYPE_CHECKING:` blocks are skipped);
* no import cycle among the modules of `esft`;
* no private name imported from another module, nor read as an attribute of an imported esft module;
* module names say what they do: no two modules share a file name (`__init__` aside);
* size: no module over 500 lines, no function over 80 lines, no source line over 120 characters.

Run: . .venv/bin/activate && pytest -q tests/test_architecture.py   (~1 s)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Layer of each module, by the longest matching dotted prefix. Lower layers never import higher ones.
LAYERS: dict[str, int] = {
    # 0 ground floor: configs, models, tasks, run directories, tables, kernels, pure helpers
    "esft.version": 0, "esft.config": 0, "esft.config_rules": 0, "esft.models": 0, "esft.tasks": 0, "esft.data": 0,
    "esft.rundir": 0, "esft.run_undo": 0, "esft.sample_rows": 0, "esft.sigterm": 0, "esft.config_flags": 0,
    "esft.kernels": 0, "esft.passk": 0, "esft.tables": 0, "esft.paper": 0, "esft.tracking": 0, "esft.validation": 0,
    "esft.names": 0, "esft.saved_config": 0, "esft.passk_figure": 0, "esft.figure_marks": 0, "esft.yaml_keys": 0,
    # 1 generation (one decode loop) and evaluation on top of it
    "esft.generation": 1, "esft.evaluation": 1, "esft.eval_config": 1,
    # 2 ES core (noise, strategy, fitness rules, local executor, trainer loop) and GRPO (on TRL)
    "esft.es": 2, "esft.grpo": 2,
    # 3 distributed ES: executor factory, replicas, Ray, vLLM
    "esft.es.distributed": 3,
    # 4 one-call entry points, experiments, the benchmark
    "esft.api": 4, "esft.experiments": 4, "esft.bench": 4, "esft.export": 4,
    # 5 analyses and the report
    "esft.analysis": 5,
    # 6 command line, environment report and the package facade
    "esft.cli": 6, "esft.cli_parser": 6, "esft.environment": 6, "esft": 6,
}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_LINE_CHARS = 120


def module_files() -> dict[str, Path]:
    mods = {}
    for path in sorted((SRC / "esft").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def layer_of(module: str) -> int | None:
    best = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return None if best is None else best[1]


def _skip_type_checking(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` except those under `if TYPE_CHECKING:` (imports for annotations only)."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def imports(module: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """(imported esft module, names taken from it, line) for every import statement of `module`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in _skip_type_checking(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("esft"):
                continue
            names = [a.name for a in node.names]
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods]
            if submodules:  # `from esft.es import noise`: the submodule is what is imported
                found += [(m, [], node.lineno) for m in submodules]
                names = [n for n in names if f"{target}.{n}" not in mods]
                if not names:
                    continue
            found.append((target, names, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("esft")]
    return found


def graph() -> tuple[dict[str, Path], dict[str, list[tuple[str, list[str], int]]]]:
    mods = module_files()
    return mods, {m: imports(m, p, mods) for m, p in mods.items()}


def test_every_module_has_a_layer():
    missing = [m for m in module_files() if layer_of(m) is None]
    assert not missing, f"modules with no layer in LAYERS (add them, and to docs/architecture.md): {missing}"


def test_architecture_page_names_the_modules():
    """docs/architecture.md's layer diagram names every top-level module and package of esft, and every module of
    the ES core, GRPO and distributed packages, whose lists it spells out (by dotted name or last component)."""
    import re

    diagram = (SRC.parent / "docs" / "architecture.md").read_text().split("```")[1]
    words = {w.rstrip(".") for w in re.findall(r"[A-Za-z_][\w.]*", diagram)}
    names = words | {w.split(".")[-1] for w in words}
    missing = [m for m in module_files() if m.count(".") == 1 or m.startswith(("esft.es.", "esft.grpo."))
               if m.split(".")[-1] not in names and m not in names and not m.endswith("__main__")]
    assert not missing, f"modules docs/architecture.md's layer diagram does not name: {missing}"


def test_no_import_goes_up_a_layer():
    mods, edges = graph()
    bad = []
    for module, found in edges.items():
        for target, _, line in found:
            if target in mods and layer_of(target) is not None and layer_of(module) is not None \
                    and layer_of(target) > layer_of(module):
                bad.append(f"{mods[module].relative_to(SRC)}:{line} {module} (layer {layer_of(module)}) imports "
                           f"{target} (layer {layer_of(target)})")
    assert not bad, "imports that cross a layer upward:\n" + "\n".join(bad)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    mods, edges = graph()
    simple = {m: {t for t, _, _ in found if t in mods and t != m} for m, found in edges.items()}
    assert cycles(simple) == []


def test_no_private_name_is_imported_from_another_module():
    mods, edges = graph()
    bad = [f"{mods[m].relative_to(SRC)}:{line} imports {n} from {t}"
           for m, found in edges.items() for t, names, line in found
           for n in names if n.startswith("_") and not n.startswith("__") and t != m]
    assert not bad, "\n".join(bad)


def module_aliases(module: str, path: Path, mods: dict[str, Path], tree: ast.AST) -> dict[str, str]:
    """Local names bound to other esft modules by `from esft.a import b` or `import esft.a.b as c`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = {}
    for node in _skip_type_checking(tree):
        if isinstance(node, ast.ImportFrom):
            base = (package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else [])
            target = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                if f"{target}.{a.name}" in mods:
                    out[a.asname or a.name] = f"{target}.{a.name}"
        elif isinstance(node, ast.Import):
            out.update({a.asname: a.name for a in node.names if a.asname and a.name in mods})
    return {name: target for name, target in out.items() if target != module}


def test_no_private_name_is_read_from_another_module():
    mods = module_files()
    bad = []
    for module, path in mods.items():
        tree = ast.parse(path.read_text())
        aliases = module_aliases(module, path, mods, tree)
        for node in _skip_type_checking(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                bad.append(f"{path.relative_to(SRC)}:{node.lineno} reads {aliases[node.value.id]}.{node.attr}")
    assert not bad, "\n".join(bad)


def test_private_attribute_finder_sees_an_aliased_module(tmp_path):
    pkg = tmp_path / "esft"
    pkg.mkdir()
    source = "from esft import other\nimport esft.other as o\nx = other._hidden + o._also + other.public\n"
    (pkg / "user.py").write_text(source)
    (pkg / "other.py").write_text("_hidden = _also = public = 1\n")
    mods = {"esft.user": pkg / "user.py", "esft.other": pkg / "other.py"}
    tree = ast.parse(source)
    aliases = module_aliases("esft.user", pkg / "user.py", mods, tree)
    assert aliases == {"other": "esft.other", "o": "esft.other"}
    read = sorted(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_"))
    assert read == ["_also", "_hidden"]


def test_module_names_do_not_repeat():
    seen: dict[str, list[str]] = {}
    for module, path in module_files().items():
        if path.name != "__init__.py":
            seen.setdefault(path.stem, []).append(module)
    repeated = {name: ms for name, ms in seen.items() if len(ms) > 1}
    assert not repeated, f"module names used more than once: {repeated}"


@pytest.mark.parametrize("module", sorted(module_files()))
def test_module_and_function_sizes(module):
    path = module_files()[module]
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE_LINES, f"{path.relative_to(SRC)} has {text.count(chr(10))} lines"
    long = [(f.name, f.lineno, f.end_lineno - f.lineno + 1) for f in ast.walk(ast.parse(text))
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.relative_to(SRC)}: functions over {MAX_FUNCTION_LINES} lines: {long}"
    wide = [n for n, line in enumerate(text.splitlines(), 1) if len(line) > MAX_LINE_CHARS]
    assert not wide, f"{path.relative_to(SRC)}: lines over {MAX_LINE_CHARS} characters: {wide}"
