"""The code layout the project keeps (README, "Layout"): no class in hvdcomp/ over 250 lines, no
function over 60, and every public method module implements the method interface."""
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


def test_every_public_method_implements_the_interface():
    from hvdcomp.protocol import BatchedCompressor
    methods = [getattr(hvdcomp, n) for n in hvdcomp.__all__
               if isinstance(getattr(hvdcomp, n), type)
               and issubclass(getattr(hvdcomp, n), BatchedCompressor)
               and getattr(hvdcomp, n) is not BatchedCompressor]
    assert len(methods) >= 5
    for cls in methods:
        for hook in ("prepare", "reduce"):
            assert getattr(cls, hook) is not getattr(BatchedCompressor, hook), (cls, hook)
        assert isinstance(cls.method, str) and cls.method != "base"
