"""The four layers import one way (pipelines -> transforms -> encoders -> artifacts) and without cycles, and inside
transforms/ a stage's folder imports only itself and transforms/common/ (which imports no stage's folder).

Imports are read with ``ast`` at any depth (function-local and ``TYPE_CHECKING`` imports count too), and so are
"package.module:ATTR" strings, which the CLI resolves with ``importlib``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Higher layers first; a module may import its own layer or a later one.
LAYERS = ("pipelines", "transforms", "encoders", "artifacts")
DYNAMIC = re.compile(rf"^((?:{'|'.join(LAYERS)})(?:\.\w+)+)(?::\w+)?$")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for layer in LAYERS for path in sorted((REPO / layer).rglob("*.py"))}


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies inside (``pkg.mod.attr`` -> ``pkg.mod``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def targets(importer: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every project module that ``importer`` imports, wherever the import statement sits."""
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(resolve(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node, importer, path.name == "__init__.py")
            found.update(resolve(f"{base}.{alias.name}", modules) for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DYNAMIC.match(node.value):
            found.add(resolve(DYNAMIC.match(node.value).group(1), modules))
    return {name for name in found if name and name != importer}


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: targets(name, path, modules) for name, path in modules.items()}


def rank(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{source} -> {target}" for source, found in graph.items() for target in found
                  if rank(target) < rank(source))


def transforms_folder(module: str) -> str | None:
    """The folder of transforms/ that ``module`` lies in (``transforms.parse.graph`` -> ``parse``), else None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "transforms" and len(parts) > 2 else None


def cross_stage_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from one stage's folder of transforms/ into another's, or from common/ into a stage's."""
    return sorted(f"{source} -> {target}" for source, found in graph.items() for target in found
                  if (folder := transforms_folder(source))
                  and transforms_folder(target) not in (None, folder, "common"))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def test_the_checks_see_what_they_should() -> None:
    graph = {"pipelines.a": {"transforms.b"}, "transforms.b": {"artifacts.c", "pipelines.a"},
             "artifacts.c": {"encoders.d"}, "encoders.d": {"artifacts.c"}, "artifacts.e": set()}
    assert upward_imports(graph) == ["artifacts.c -> encoders.d", "transforms.b -> pipelines.a"]
    assert cycles(graph) == [["artifacts.c", "encoders.d"], ["pipelines.a", "transforms.b"]]
    folders = {"transforms.parse.graph": {"transforms.parse.wikitext", "transforms.common.spill", "artifacts.fs"},
               "transforms.index.corpus": {"transforms.parse.dump_reader", "transforms.common.spill"},
               "transforms.common.spill": {"transforms.dictionary.tables"},
               "pipelines.parse": {"transforms.parse.graph"}}
    assert cross_stage_imports(folders) == ["transforms.common.spill -> transforms.dictionary.tables",
                                            "transforms.index.corpus -> transforms.parse.dump_reader"]


def test_imports_are_read_at_any_depth() -> None:
    graph = import_graph()
    # A package's own import, a function-local import and a "module:ATTR" string are all seen.
    assert "artifacts.run.validation.check" in graph["artifacts.run.validation"]
    assert "encoders.mask_encoder" in graph["pipelines.run_all"]
    assert "pipelines.parse" in graph["pipelines.launcher.commands"]
    assert len(graph) >= 50


def test_no_upward_imports() -> None:
    violations = upward_imports(import_graph())
    print("\n".join(violations))
    assert violations == []


def test_a_stage_folder_imports_only_itself_and_common() -> None:
    violations = cross_stage_imports(import_graph())
    print("\n".join(violations))
    assert violations == []


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    print("\n".join(" <-> ".join(component) for component in found))
    assert found == []
