"""The code layout the project keeps (docs/how-it-works.md, docs/extending.md): no class in
hvdcomp/ over 250 lines, no function over 60, and every public method module implements the
method interface."""
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
    """Each public compressor runs a ``hvdcomp.method.Method`` subclass that provides the
    contract's hooks, and no method module imports the facade, the engine or Horovod."""
    from hvdcomp.facade import BatchedCompressor
    from hvdcomp.method import Method
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
        module = pathlib.Path(__import__(cls.Method.__module__, fromlist=["_"]).__file__)
        imported = set()
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom):
                imported |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
        upward = sorted(m for m in imported if m and (
            m.split(".")[0] == "horovod" or m.startswith(("hvdcomp.facade", "hvdcomp.engine",
                                                          "hvdcomp.frontends", "hvdcomp.registry"))))
        assert not upward, (module.name, upward)
