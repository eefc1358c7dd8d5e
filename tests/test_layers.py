"""The package's layers: every kdlab module's imports (parsed with ``ast``, function-level ones
included) follow the layer order, with no circle.

Layers, bottom to top (a package may import itself and the packages listed for it):

    core        kl, mixture, metrics, schema, dtypes, atomic, faults: nothing from kdlab
    tasks       tasks, verifiers, graders
    models      toy presets, tokenizer, codec, hf, smol, the model store's addressing
    engine      sampler, batching, data, distillation / SFT / GRPO, the gradient experiment
    evaluation  evaluate, style metrics
    study       profiles, materials, building models, runs, records, results, report, runner
    analysis    statistics and figures of finished runs: never the engine nor models
    widgets     the notebooks' widgets (analysis)
    cli         the command line, on top
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "kdlab"

ALLOWED = {
    "core": {"core"},
    "tasks": {"core", "tasks"},
    "models": {"core", "tasks", "models"},
    "engine": {"core", "tasks", "models", "engine"},
    "evaluation": {"core", "tasks", "models", "engine", "evaluation"},
    "study": {"core", "tasks", "models", "engine", "evaluation", "study"},
    "analysis": {"core", "tasks", "analysis"},
    "widgets": {"core", "tasks", "analysis", "widgets"},
    "cli": {"core", "tasks", "models", "engine", "evaluation", "study", "analysis", "widgets", "cli"},
    "__main__": {"cli"},
    "": set(),  # kdlab/__init__.py
}
RUNNER = {"kdlab.study.runner", "kdlab.study.plan", "kdlab.study.kernels"}  # the study runner's modules


def _module_of(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


MODULES = {_module_of(p)[0]: p for p in sorted(SRC.rglob("*.py"))}


def _imports(source: str, module: str | None, is_package: bool) -> list[tuple[str, int, bool]]:
    """(kdlab module imported, line, at top level) for every import in ``source``; ``from X import
    name`` counts as importing ``X.name`` when that is a module."""
    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    package = (module if is_package else module.rsplit(".", 1)[0]) if module else ""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base_mod = ".".join(base + ([node.module] if node.module else []))
            else:
                base_mod = node.module or ""
            names = [f"{base_mod}.{a.name}" if f"{base_mod}.{a.name}" in MODULES else base_mod for a in node.names]
        else:
            continue
        for name in names:
            if name == "kdlab" or name.startswith("kdlab."):
                while name not in MODULES and "." in name:
                    name = name.rsplit(".", 1)[0]
                out.append((name, node.lineno, id(node) in top))
    return out


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        deps = {m for m, _, _ in _imports(path.read_text(), module, path.name == "__init__.py")}
        graph[module] = deps - {module}
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_every_module_is_in_a_layer():
    assert {_layer(m) for m in MODULES} <= set(ALLOWED), sorted({_layer(m) for m in MODULES} - set(ALLOWED))
    flat = [m for m in MODULES if m.count(".") == 1 and _layer(m) not in ("cli", "widgets", "__main__")
            and MODULES[m].name != "__init__.py"]
    assert not flat, f"modules outside the layer packages: {flat}"


def test_no_import_circle_between_modules():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_no_import_circle_between_layers():
    layers: dict[str, set[str]] = {}
    for module, deps in _graph().items():
        layers.setdefault(_layer(module), set()).update(_layer(d) for d in deps if _layer(d) != _layer(module))
    cycle = _cycle(layers)
    assert cycle is None, " -> ".join(cycle)


def test_layers_import_only_the_ones_below():
    bad = []
    for module, deps in _graph().items():
        for dep in deps:
            if dep != "kdlab" and _layer(dep) not in ALLOWED[_layer(module)]:
                bad.append(f"{module} imports {dep}")
    assert not bad, "\n".join(sorted(bad))


def test_analysis_never_imports_the_engine_or_models():
    bad = [(m, d) for m, deps in _graph().items() if _layer(m) == "analysis" for d in deps
           if _layer(d) in ("engine", "models")]
    assert not bad


def test_core_imports_nothing_from_kdlab_outside_core():
    bad = [(m, d) for m, deps in _graph().items() if _layer(m) == "core" for d in deps if _layer(d) != "core"]
    assert not bad


def test_no_function_level_kdlab_import():
    """A kdlab import inside a function is how a circle hides: all of them sit at the top."""
    bad = []
    for module, path in MODULES.items():
        for dep, line, top in _imports(path.read_text(), module, path.name == "__init__.py"):
            if not top:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {dep}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.py")), ids=lambda p: p.name)
def test_notebooks_never_import_the_study_runner(notebook):
    source = "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line
                       for line in notebook.read_text().splitlines())
    imported = {m for m, _, _ in _imports(source, None, False)}
    assert not imported & RUNNER, sorted(imported & RUNNER)


def test_the_checker_sees_a_circle_and_a_function_level_import():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    src = "from .kl import token_kl\ndef f():\n    from ..engine.distill import distill\n"
    assert _imports(src, "kdlab.core.metrics", False) == [("kdlab.core.kl", 1, True),
                                                          ("kdlab.engine.distill", 3, False)]
