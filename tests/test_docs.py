"""docs/options.md against the code (no MPI job): every constructor argument of every public
compressor (and of ``hvdcomp.AdamSettings``) and every ``HVDCOMP_*`` environment variable the
package reads is documented there, and the page names no argument or variable the code lacks."""
import inspect
import pathlib
import re

import hvdcomp
from hvdcomp import registry
from hvdcomp.facade import BatchedCompressor

ROOT = pathlib.Path(__file__).resolve().parent.parent
OPTIONS = ROOT / "docs" / "options.md"
ENV_NAME = re.compile(r"HVDCOMP_[A-Z][A-Z0-9_]*[A-Z0-9]")
COMMON = "Common arguments"


def _keywords(func, skip=("self", "algorithm")):
    """The named parameters of ``func`` (no ``*args``/``**kwargs``)."""
    return {name for name, p in inspect.signature(func).parameters.items()
            if name not in skip and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _sections():
    """``{heading: [first-column names of its table rows]}`` of docs/options.md's ``##``
    sections (the heading's text without backticks and the ``hvdcomp.`` prefix)."""
    sections, current = {}, None
    for line in OPTIONS.read_text().splitlines():
        if line.startswith("## "):
            current = line[3:].strip().strip("`").replace("hvdcomp.", "")
            sections[current] = []
        elif current is not None:
            row = re.match(r"\|\s*`([^`]+)`\s*\|", line)
            if row:
                sections[current].append(row.group(1))
    return sections


def _public_compressors():
    classes = [getattr(hvdcomp, name) for name in registry.METHODS]
    assert {c.__name__ for c in classes} >= {
        "Marsit", "BinSGDM", "TopK", "SketchFusion", "EFSignSGD", "PowerSGD"}
    return classes


def test_every_constructor_argument_is_documented_and_none_is_stale():
    sections = _sections()
    common = _keywords(BatchedCompressor.__init__)
    documented_common = set(next(v for k, v in sections.items() if k.startswith(COMMON)))
    assert documented_common == common, (
        f"common arguments missing from docs/options.md: {sorted(common - documented_common)}; "
        f"listed but not in the code: {sorted(documented_common - common)}")
    for cls in _public_compressors():
        own = _keywords(cls.Method.__init__)
        taken = own | (common - set(cls.Method.refused))
        assert cls.__name__ in sections, f"docs/options.md has no section for {cls.__name__}"
        listed = set(sections[cls.__name__])
        assert listed == own, (
            f"{cls.__name__}: arguments missing from docs/options.md: {sorted(own - listed)}; "
            f"listed but not in the code: {sorted(listed - own)}")
        assert taken <= documented_common | listed, (cls.__name__, sorted(taken))
    settings = _keywords(hvdcomp.AdamSettings)
    assert set(sections["AdamSettings"]) == settings, sorted(settings)


def test_refused_arguments_are_said_so():
    text = OPTIONS.read_text()
    for cls in _public_compressors():
        body = text.split(f"## `hvdcomp.{cls.__name__}`", 1)[1].split("\n## ", 1)[0]
        for name in cls.Method.refused:
            assert f"`{name}`" in body, (cls.__name__, name)


def test_every_environment_variable_is_documented_and_none_is_stale():
    package = {m.group(0) for path in (ROOT / "hvdcomp").rglob("*.py")
               for m in ENV_NAME.finditer(path.read_text())}
    assert package, "no HVDCOMP_* variable found in hvdcomp/"
    documented = set(ENV_NAME.findall(OPTIONS.read_text()))
    assert package <= documented, f"undocumented: {sorted(package - documented)}"
    code = package | {m.group(0) for path in (ROOT / "scripts").rglob("*") if path.is_file()
                      for m in ENV_NAME.finditer(path.read_text(errors="replace"))}
    assert documented <= code, f"documented but read nowhere: {sorted(documented - code)}"
    table = set(_sections()["Environment variables"])
    assert package <= table, f"not in the variables' table: {sorted(package - table)}"


def test_every_error_class_is_in_troubleshooting():
    """Each exception and warning class of hvdcomp/errors.py has its row in
    docs/troubleshooting.md (what causes it, what to do)."""
    import hvdcomp.errors as errors
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    classes = [name for name, obj in vars(errors).items()
               if isinstance(obj, type) and issubclass(obj, (Exception, Warning))
               and obj.__module__ == errors.__name__]
    assert len(classes) >= 10, classes
    missing = [name for name in classes if f"| `{name}`" not in text]
    assert not missing, f"not in docs/troubleshooting.md: {missing}"
