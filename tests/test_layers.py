"""The library's layers: imports go strictly downward, and no module or function is
too long to read.

Every import in `pinet_eqx` is read from the source (`ast`), wherever it stands: at
the top, under `TYPE_CHECKING`, or inside a function. A module belongs to the
layer of its subpackage; the top-level modules (and `problems/`) form the top
layer. A module may import from its own layer or from one listed before it in
`LAYERS`, and the modules' import graph has no cycle.
"""

import ast
import pathlib

import pytest

import pinet_eqx

# Bottom to top: each subpackage's `__init__` docstring says what it may import.
LAYERS = (
    "_linalg",
    "_problem",
    "_sets",
    "_solver",
    "_active_set",
    "_adjoint",
    "_projector",
    "_cvxpy",
    "",  # the top level: `pinet_eqx/*.py` and `problems/`
)
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

_ROOT = pathlib.Path(pinet_eqx.__file__).parent
_PACKAGE = _ROOT.name


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


_FILES = {_module_name(p): p for p in sorted(_ROOT.rglob("*.py"))}
_TREES = {name: ast.parse(path.read_text()) for name, path in _FILES.items()}


def _imports(name: str) -> set[str]:
    """The `pinet_eqx` modules that module `name` imports, anywhere in it."""
    path = _FILES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(_TREES[name]):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == _PACKAGE}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != _PACKAGE:
                continue
            # `from package import name` imports the submodule `name` if it is one.
            subs = {f"{module}.{a.name}" for a in node.names}
            found |= (subs & _FILES.keys()) or {module}
            if subs - _FILES.keys():
                found.add(module)
    return found - {name}


_GRAPH = {name: _imports(name) for name in _FILES}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return LAYERS.index(top if top in LAYERS else "")


def test_every_subpackage_has_a_layer():
    packages = {p.parent.name for p in _ROOT.glob("*/__init__.py")}
    assert packages - set(LAYERS) == {"problems"}
    for package in set(LAYERS) - {""}:
        init = _TREES[f"{_PACKAGE}.{package}"]
        assert ast.get_docstring(init), f"{package}/__init__.py has no docstring"
        # An `__init__` only re-exports.
        assert all(isinstance(node, ast.ImportFrom) for node in init.body[1:]), (
            f"{package}/__init__.py does more than re-export"
        )


@pytest.mark.parametrize("module", sorted(_FILES))
def test_imports_go_downward(module):
    upward = {m for m in _GRAPH[module] if _layer(m) > _layer(module)}
    assert not upward, f"{module} imports from a layer above it: {sorted(upward)}"


def test_no_import_cycle():
    done, active = set(), []

    def visit(module):
        if module in active:
            cycle = active[active.index(module) :] + [module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        active.append(module)
        for imported in sorted(_GRAPH[module]):
            visit(imported)
        active.pop()
        done.add(module)

    for module in sorted(_GRAPH):
        visit(module)


def test_module_and_function_lengths():
    too_long = []
    for name, path in _FILES.items():
        n = len(path.read_text().splitlines())
        if n > MAX_MODULE_LINES:
            too_long.append(f"{name}: {n} lines")
        for node in ast.walk(_TREES[name]):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert not too_long, too_long
