"""Architecture rules: no import cycle in the source folders, TensorFlow's privates behind one seam, TF 2.15 only."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from typing import Dict, Iterator, List, Optional, Sequence, Set

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "collective"
SEAM = REPO / PACKAGE / "tf_internals"
SOURCE_TREES = ("collective", "modelzoo", "benchmarks", "datasets")
CHECKED_TREES = SOURCE_TREES + ("tests",)
PRIVATE_PREFIXES = ("tensorflow.python", "keras.src", "tensorflow_estimator.python")


def _python_files(root: pathlib.Path) -> Iterator[pathlib.Path]:
    return (p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name of the module ``node`` (in ``module``) imports from."""
    base = node.module or ""
    if not node.level:
        return base
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[:len(package) - node.level + 1]
    return ".".join(package + ([base] if base else []))


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every module name ``tree`` imports (anywhere, functions included), relative ones made absolute.

    ``from pkg import name`` yields ``pkg.name`` (whether or not it is a module) and ``pkg``.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module, is_package)
            yield base
            for alias in node.names:
                yield f"{base}.{alias.name}"


def _module_graph(folders: Sequence[str]) -> Dict[str, Set[str]]:
    """Module -> the modules it imports, for every module in the top-level ``folders`` (edges between all of
    them; each edge to the most specific existing module)."""
    paths = {_module_name(p): p for folder in folders for p in _python_files(REPO / folder)}
    roots = {folder.split("/")[0] for folder in folders}

    def resolve(name: str) -> Optional[str]:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: Dict[str, Set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        deps: Set[Optional[str]] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(resolve(a.name) for a in node.names if a.name.split(".")[0] in roots)
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(node, module, path.name == "__init__.py")
                if base.split(".")[0] not in roots:
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    deps.add(full if full in paths else resolve(base))
        deps.discard(None)
        deps.discard(module)
        graph[module] = deps
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle (a path ``a -> ... -> a``) through each strongly connected component of ``graph``."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[Set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)

    cycles = []
    for component in components:
        start = min(component)
        # Breadth-first search for the shortest way back to ``start`` inside the component.
        previous: Dict[str, str] = {}
        frontier, end = [start], None
        while end is None:
            following = []
            for v in frontier:
                if start in graph[v]:
                    end = v
                    break
                for w in sorted(graph[v] & component):
                    if w != start and w not in previous:
                        previous[w] = v
                        following.append(w)
            frontier = following
        path = [end]
        while path[-1] != start:
            path.append(previous[path[-1]])
        cycles.append(path[::-1] + [start])
    return cycles


def test_module_graph_has_no_cycle():
    graph = _module_graph(SOURCE_TREES)
    assert "collective.tf_internals" in graph and "collective.strategy" in graph
    assert {"modelzoo.features", "benchmarks.report", "datasets.schema"} <= set(graph)
    assert any(dep.split(".")[0] != module.split(".")[0] for module, deps in graph.items() for dep in deps), \
        "the graph has no edge between two folders"
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cycle_finder_reports_a_cycle():
    cycle = _cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()})
    assert cycle == [["a", "b", "c", "a"]]


def _private_imports(path: pathlib.Path) -> List[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    module = _module_name(path) if REPO in path.parents else path.stem
    for name in _imports(tree, module, path.name == "__init__.py"):
        if any(name == p or name.startswith(p + ".") for p in PRIVATE_PREFIXES):
            found.append(name)
    return sorted(set(found))


def test_private_tensorflow_imports_only_in_the_seam():
    offenders = {}
    for tree in CHECKED_TREES:
        for path in _python_files(REPO / tree):
            if SEAM in path.parents:
                continue
            names = _private_imports(path)
            if names:
                offenders[str(path.relative_to(REPO))] = names
    assert not offenders, ("import these from collective.tf_internals instead:\n"
                           + "\n".join(f"{path}: {', '.join(names)}" for path, names in offenders.items()))


def test_private_import_detection(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text('"""tensorflow.python in a docstring is not an import."""\n'
                      "def f():\n    from tensorflow.python.ops import io_ops\n"
                      "from keras import src\nimport tensorflow_estimator.python.estimator\n")
    assert _private_imports(source) == ["keras.src", "tensorflow.python.ops", "tensorflow.python.ops.io_ops",
                                        "tensorflow_estimator.python.estimator"]


def test_import_refuses_other_tensorflow():
    code = "import tensorflow as tf; tf.__version__ = '2.16.1'; import collective"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "2.16.1" in result.stderr and "2.15" in result.stderr


def test_check_versions():
    from collective.tf_internals import check_versions

    check_versions("2.15.1", "2.15.0")
    with pytest.raises(ImportError, match=r"found tensorflow 2\.16\.1 .*tensorflow-cpu==2\.15\.1"):
        check_versions("2.16.1", "2.15.0")
    with pytest.raises(ImportError, match=r"tensorflow-estimator 2\.14\.0"):
        check_versions("2.15.1", "2.14.0")


def _resolve(dotted: str):
    """The module or class named ``dotted`` (``package.module.Class.Inner``)."""
    module, rest = dotted, []
    while module not in sys.modules:
        module, _, attribute = module.rpartition(".")
        assert module, f"{dotted} names no imported module"
        rest.insert(0, attribute)
    owner = sys.modules[module]
    for attribute in rest:
        owner = getattr(owner, attribute)
    return owner


def _stored(owner, attribute: str):
    return owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)


ON_DEMAND = {("tensorflow_estimator.python.estimator.estimator", name) for name in (
    "_verify_and_create_loss_metric", "_write_dict_to_summary", "_write_checkpoint_path_to_summary")}


def test_patched_restores_every_registered_attribute():
    import collective.integration.estimator  # noqa: F401  (registers its on-demand patches)
    import collective.strategy  # noqa: F401  (imports every module registering for patched())
    from collective.tf_internals import patches

    entries = patches.registered()
    listed = {(entry.owner.rpartition(".")[2], entry.attribute) for entry in entries}
    assert {("embedding_ops", "embedding_lookup"), ("nn", "embedding_lookup"),
            ("embedding_ops", "embedding_lookup_sparse_impl"), ("variable_v1", "default_variable_creator"),
            ("variables", "default_variable_creator_v2"), ("Optimizer", "apply_gradients"),
            ("monitored_session", "MonitoredTrainingSession"), ("train", "MonitoredTrainingSession"),
            ("saver", "_get_saver_or_default"), ("feature_column", "_internal_input_layer"),
            ("DenseFeatures", "call"), ("_SharedEmbeddingColumn", "_get_dense_tensor_internal"),
            ("estimator", "_verify_and_create_loss_metric"), ("estimator", "_write_dict_to_summary"),
            ("estimator", "_write_checkpoint_path_to_summary")} <= listed
    owners = [(_resolve(entry.owner), entry.attribute) for entry in entries]
    before = [_stored(owner, attribute) for owner, attribute in owners]
    assert not patches.active()
    with patches.patched():
        with patches.patched():
            assert patches.active()
        inside = [_stored(owner, attribute) for owner, attribute in owners]
        for (owner, attribute), value in zip(owners, before):
            assert patches.original(owner, attribute) is value
    after = [_stored(owner, attribute) for owner, attribute in owners]
    assert not patches.active()
    for entry, old, new in zip(entries, before, inside):
        if (entry.owner, entry.attribute) in ON_DEMAND:
            assert new is old, f"{entry} is applied on demand, not by patched()"
        else:
            assert new is not old, f"{entry} was not installed by patched()"
    for entry, old, new in zip(entries, before, after):
        assert new is old, f"{entry} was not restored"


# Layers, lowest first: a module may import from its own layer and the ones below, never from a higher one.
# The longest matching entry wins; "=name" matches that module only, not the modules below it.
LAYERS = (
    ("collective.tf_internals", 0), ("collective.kernels", 0),
    ("collective.runtime", 1), ("collective.cli", 1), ("collective._moved", 1), ("collective.byte_model", 1),
    ("collective.context", 2), ("collective.comm", 2),
    ("=collective.embedding.exchanges", 2),  # the backend registry, which context checks COLLECTIVE_STRATEGY against
    ("collective.embedding", 3), ("collective.sharding", 3),  # tables ask the planner; shards are made of plans
    ("collective.checkpoint", 4),
    ("collective.integration", 5),
    ("collective", 6),  # the public faces: strategy, hb, sok, data, group_embedding, ...
    ("datasets", 7),
    ("modelzoo", 8),
    ("collective.demo", 9),  # an application of the model zoo
    ("benchmarks", 9),
)


def layer_of(module: str) -> int:
    """The layer of ``module`` in :data:`LAYERS`."""
    best = None
    for pattern, layer in LAYERS:
        name = pattern.lstrip("=")
        if module == name or (not pattern.startswith("=") and module.startswith(name + ".")):
            if best is None or len(name) > best[0]:
                best = (len(name), layer)
    if best is None:
        raise KeyError(f"{module} is in no layer of tests/test_architecture.py's LAYERS: add it")
    return best[1]


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
    """Every import of a module from a higher layer, as ``a (layer) -> b (layer)``."""
    return [f"{module} ({layer_of(module)}) -> {dep} ({layer_of(dep)})"
            for module in sorted(graph) for dep in sorted(graph[module]) if layer_of(dep) > layer_of(module)]


def test_no_module_imports_from_a_higher_layer():
    graph = _module_graph(SOURCE_TREES)
    upward = upward_imports(graph)
    assert not upward, "imports from a higher layer (see LAYERS):\n" + "\n".join(upward)


def test_upward_import_detection():
    assert upward_imports({"collective.comm": {"collective.strategy"}, "collective.strategy": {"collective.comm"}}) \
        == ["collective.comm (2) -> collective.strategy (6)"]
    assert layer_of("collective.embedding.exchanges") == 2 and layer_of("collective.embedding.exchanges.hb") == 3


_INSTALLS_NOTHING = """
import importlib, pkgutil, sys
from collective.tf_internals import patches
register, registrants = patches.register, set()

def recording(*args, **kwargs):
    registrants.add(sys._getframe(1).f_globals["__name__"])
    return register(*args, **kwargs)

patches.register = recording
import collective
names = [info.name for info in pkgutil.walk_packages(collective.__path__, "collective.")]
for name in names:
    if not name.startswith("collective.kernels.cupy") and not name.endswith("__main__"):
        importlib.import_module(name)
assert registrants == {"collective.integration.replacements"}, registrants
listed = [(p.owner, p.attribute, p.replacement) for p in patches._registry.values()]
assert len(listed) > 20
assert not any(patches._current(owner, name) is replacement for owner, name, replacement in listed), \\
    "importing installed a replacement"
import collective.integration.replacements as replacements
with patches.patched():
    assert all(patches._current(p.owner, p.attribute) is p.replacement for p in replacements.INSTALLED)
assert not any(patches._current(owner, name) is replacement for owner, name, replacement in listed), \\
    "leaving the scope left a replacement installed"
print(len(names), "modules imported;", len(listed), "replacements, all registered by", *registrants)
"""


def test_only_the_list_registers_patches_and_importing_installs_nothing():
    """Every module of collective imported: only the list registers replacements, and none is installed."""
    result = subprocess.run([sys.executable, "-c", _INSTALLS_NOTHING], cwd=REPO, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "all registered by collective.integration.replacements" in result.stdout, result.stdout


# The room that decides placements (issue 43): nothing else makes a ShardInfo or a TablePlan or applies a rule.
SHARDING = REPO / PACKAGE / "sharding"
_PLACEMENT_WORDS = ("replicated", "row_wise", "table_wise", "column_wise")


def placement_decisions(source: str) -> List[str]:
    """Where ``source`` decides a placement: it makes a ``ShardInfo``/``TablePlan``, passes ``replicated=``,
    or compares something with ``replicate_below_bytes`` or a placement's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if func in ("ShardInfo", "TablePlan"):
                found.append(f"line {node.lineno}: {func}(...)")
            found += [f"line {node.lineno}: replicated=" for k in node.keywords if k.arg == "replicated"]
        elif isinstance(node, ast.Compare):
            operands = [node.left] + list(node.comparators)
            if any(isinstance(n, ast.Constant) and n.value in _PLACEMENT_WORDS for n in operands) or (
                    any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops)
                    and any(getattr(n, "id", getattr(n, "attr", None)) == "replicate_below_bytes" for n in operands)):
                found.append(f"line {node.lineno}: a placement rule")
    return found


def test_only_the_sharding_package_decides_placements():
    offenders = []
    for path in _python_files(REPO / PACKAGE):
        if SHARDING in path.parents:
            continue
        offenders += [f"{path.relative_to(REPO)} {where}" for where in placement_decisions(path.read_text())]
    assert not offenders, ("placements are decided in collective/sharding/ only (planner.py; ShardInfo from "
                           "shards.py):\n" + "\n".join(offenders))


def test_placement_decision_detection():
    assert placement_decisions("info = ShardInfo(name='t', vocab=3, dim=2, rank=0, world_size=1)")
    assert placement_decisions("x = table_info.ShardInfo(**kw)")
    assert placement_decisions("f(replicated=True)")
    assert placement_decisions("r = backend == 'replicated' or size < replicate_below_bytes")
    assert placement_decisions("r = nbytes < ctx.replicate_below_bytes")
    assert not placement_decisions("info = shards.place(spec)\nr = info.replicated\nname = 'replicated'\n"
                                   "t = x if replicate_below_bytes is None else y")
