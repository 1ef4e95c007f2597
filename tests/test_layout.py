"""The code layout the project keeps (docs/how-it-works.md, docs/extending.md): no class in
hvdcomp/ over 250 lines, no function over 60; every public method is a folder of
hvdcomp/methods/ that implements the method contract and imports nothing above it; no import
cycle between hvdcomp's modules (function-local imports included); the registry imports nothing
of the tests or the benchmarks, and the tests import no benchmark script (they may run one; the
scripts' own tests are in benchmarks/tests/)."""
import ast
import pathlib

import hvdcomp

PACKAGE = pathlib.Path(hvdcomp.__file__).parent


def _sizes():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(PACKAGE.parent), node, node.end_lineno - node.lineno + 1


def test_no_class_over_250_lines_and_no_function_over_60():
    too_long = [f"{path}:{node.lineno} {node.name} ({n} lines)" for path, node, n in _sizes()
                if n > (250 if isinstance(node, ast.ClassDef) else 60)]
    assert not too_long, too_long


def test_every_public_method_implements_the_contract_and_knows_nothing_of_horovod():
    """Each public compressor runs a ``hvdcomp.methods.contract.Method`` subclass that provides the
    contract's hooks, and no method module imports the facade, the engine or Horovod."""
    from hvdcomp.facade import BatchedCompressor
    from hvdcomp.methods.contract import Method
    methods = [getattr(hvdcomp, n) for n in hvdcomp.__all__
               if isinstance(getattr(hvdcomp, n), type)
               and issubclass(getattr(hvdcomp, n), BatchedCompressor)
               and getattr(hvdcomp, n) is not BatchedCompressor]
    assert len(methods) >= 6
    for cls in methods:
        assert issubclass(cls.Method, Method) and cls.Method is not Method
        for hook in ("prepare", "reduce"):
            assert getattr(cls.Method, hook) is not getattr(Method, hook), (cls, hook)
        assert isinstance(cls.method, str) and cls.method == cls.Method.name != "base"
        assert cls.Method.__module__.startswith("hvdcomp.methods."), cls.Method.__module__


# What a method, or the sign message that methods share, may not import: Horovod, the
# frameworks' front ends, the facade, the engine and what drives it, the registry.
# The front ends: Horovod's facade, the frameworks' adapters, the registry, the DDP hook.
FRONT = ("hvdcomp.facade", "hvdcomp.registry", "hvdcomp.ddp")
ABOVE_A_METHOD = ("horovod", *FRONT, "hvdcomp.engine", "hvdcomp.decision", "hvdcomp.bucketing",
                  "hvdcomp.hierarchical")


def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path):
    """Every module ``path`` imports, at the top or inside a function: ``from a import b``
    counts as ``a.b`` where that is one of hvdcomp's modules, else as ``a``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_no_method_module_imports_anything_above_it():
    methods = [p for name, p in MODULES.items()
               if name.startswith(("hvdcomp.methods", "hvdcomp.signs"))]
    assert len(methods) >= 20
    upward = {f"{_module_name(p)} imports {m}" for p in methods for m in _imports(p)
              if m == "horovod" or m.startswith(tuple(f"{a}." for a in ABOVE_A_METHOD))
              or m in ABOVE_A_METHOD}
    assert not upward, sorted(upward)


def test_no_import_cycle_between_hvdcomps_modules():
    graph = {name: {m for m in _imports(p) if m in MODULES and m != name}
             for name, p in MODULES.items()}
    done, path, cycles = set(), [], []

    def visit(name):
        if name in path:
            cycles.append(path[path.index(name):] + [name])
            return
        if name in done:
            return
        path.append(name)
        for other in sorted(graph[name]):
            visit(other)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
    assert not cycles, [" -> ".join(c) for c in cycles]


def test_the_registry_imports_nothing_of_the_tests_or_the_benchmarks():
    imported = _imports(MODULES["hvdcomp.registry"])
    assert not {m for m in imported if m.split(".")[0] in ("tests", "benchmarks", "conftest")}


def test_the_tests_import_no_benchmark_script():
    """No module under tests/ puts benchmarks/ on its import path or imports from it."""
    tests = pathlib.Path(__file__).parent
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            reaches = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                       and ast.unparse(node.func.value) == "sys.path"
                       and "benchmarks" in ast.unparse(node))
            imports = (isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "benchmarks")) or (isinstance(node, ast.Import) and any(
                    a.name.startswith("benchmarks") for a in node.names))
            if reaches or imports:
                found.append(f"{path.relative_to(tests.parent)}:{node.lineno}")
    assert not found, found


def test_the_runtime_imports_nothing_of_the_front_ends():
    """The engine, the decision, the state, the node stages, the methods, the collectives: none
    of them imports Horovod's facade, the front ends (Horovod's or DDP's) or the registry."""
    runtime = {name: p for name, p in MODULES.items()
               if name != "hvdcomp" and not name.startswith(FRONT)}
    assert {"hvdcomp.engine", "hvdcomp.decision", "hvdcomp.hierarchical"} <= set(runtime)
    upward = {f"{name} imports {m}" for name, p in runtime.items() for m in _imports(p)
              if m.startswith(FRONT) or m.split(".")[0] == "horovod"}
    assert not upward, sorted(upward)


def test_horovod_is_reached_from_the_facade_package_alone():
    """The Horovod facade is one package: the compressor, the front ends and their naming,
    ownership and the version check live in hvdcomp/facade/, and no module outside it imports
    Horovod."""
    facade = {name for name in MODULES if name.startswith("hvdcomp.facade")}
    assert {"hvdcomp.facade.compressor", "hvdcomp.facade.ownership",
            "hvdcomp.facade.horovod_version", "hvdcomp.facade.frontends.torch",
            "hvdcomp.facade.frontends.tensorflow", "hvdcomp.facade.frontends.naming"} <= facade
    outside = {f"{name} imports {m}" for name, p in MODULES.items() if name not in facade
               for m in _imports(p) if m.split(".")[0] == "horovod"}
    assert not outside, sorted(outside)
