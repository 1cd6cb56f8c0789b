"""The package's modules import one another without a cycle, every import counted: those
inside functions and under TYPE_CHECKING too, which is where a cycle would hide. (The
layers and wings themselves are import-linter's contracts, in pyproject.toml.)"""

import ast
from pathlib import Path

import grimp

import delayqueue_django


def cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or not (Tarjan's strongly
    connected components of more than one module, or of one importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(imports[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1 or module in imports[module]:
                found.append(sorted(group))

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return found


def test_cycles_are_found() -> None:
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(imports) == [["a", "b", "c"], ["e"]]


def test_the_package_has_no_import_cycle() -> None:
    graph = grimp.build_graph("delayqueue_django", cache_dir=None)
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    assert len(imports) > 80  # the whole package was read
    assert cycles(imports) == []


def test_no_cycle_runs_through_a_package_init() -> None:
    """Importing a package's submodule runs the package's ``__init__`` first: a module
    outside it that imports one of its submodules, and is imported by that ``__init__``,
    would find itself half-imported (a cycle through the package, which the test above
    does not count)."""
    graph = grimp.build_graph("delayqueue_django", cache_dir=None)
    imports: dict[str, set[str]] = {}
    for module in graph.modules:
        # (A module's own packages are already running when it is imported.)
        own = {module.rsplit(".", depth)[0] for depth in range(1, module.count(".") + 1)}
        imports[module] = set()
        for imported in graph.find_modules_directly_imported_by(module):
            parts = imported.split(".")
            packages = {".".join(parts[:end]) for end in range(2, len(parts))}
            imports[module] |= {imported, *(packages - own - {module})}
    assert cycles(imports) == []


def test_no_package_init_binds_the_name_of_one_of_its_submodules() -> None:
    """A package's submodules are its attributes: importing ``consumer.verdicts`` would
    rebind the name ``verdicts`` that ``consumer/__init__.py`` imported from elsewhere."""
    root = Path(delayqueue_django.__file__).parent
    clashes = []
    for init in root.rglob("__init__.py"):
        package = ".".join(init.parent.relative_to(root.parent).parts)
        submodules = {path.stem for path in init.parent.glob("*.py")} | {
            path.parent.name for path in init.parent.glob("*/__init__.py")
        }
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                bound = {
                    alias.asname or alias.name.split(".")[0]
                    for alias in node.names
                    # (A submodule bound by its own name is that submodule.)
                    if not (isinstance(node, ast.ImportFrom) and node.module == package)
                    or alias.asname
                }
            elif isinstance(node, ast.FunctionDef | ast.ClassDef):
                bound = {node.name}
            elif isinstance(node, ast.Assign):
                bound = {target.id for target in node.targets if isinstance(target, ast.Name)}
            else:
                continue
            clashes += [f"{package}: {name}" for name in sorted(bound & submodules)]
    assert clashes == []
