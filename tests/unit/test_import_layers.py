"""Imports flow one way: no module in scorekit/ imports one from a layer above it (DESIGN.md §1).

The layers are read from the "Layers" table in docs/architecture.md, never written here, so the docs and
this test cannot drift. Every module is parsed with ``ast`` (nothing is imported), relative imports are
resolved, and imports inside functions count too: a lazy import upward is still an arrow pointing up.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scorekit"
TABLE_DOC = ROOT / "docs" / "architecture.md"


@dataclass(frozen=True)
class Layer:
    rank: int
    name: str
    modules: tuple[str, ...]  # paths relative to scorekit/; a trailing "/" is a package
    never: tuple[str, ...]  # scorekit paths as above, or third-party top-level names ("torch")


def read_layers(doc: Path) -> list[Layer]:
    """The rows of the table under the "## Layers" heading; its columns are found by their headers."""
    text = doc.read_text()
    match = re.search(r"^## Layers\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert match, f"{doc.name} has no '## Layers' section"
    rows = [line for line in match.group(1).splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    column = {name: header.index(name) for name in ("Rank", "Layer", "Modules", "Never imports")}
    layers = []
    for row in rows[2:]:  # after the header and its |---| line
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        layers.append(
            Layer(
                rank=int(cells[column["Rank"]]),
                name=cells[column["Layer"]],
                modules=tuple(re.findall(r"`([^`]+)`", cells[column["Modules"]])),
                never=tuple(re.findall(r"`([^`]+)`", cells[column["Never imports"]])),
            )
        )
    return layers


def layer_of(module: str, layers: list[Layer]) -> Layer | None:
    """A module's own row if it is listed by name, else the row of its innermost listed package."""
    best: tuple[int, Layer] | None = None
    for layer in layers:
        for entry in layer.modules:
            if entry == module:
                return layer
            if entry.endswith("/") and module.startswith(entry) and (best is None or len(entry) > best[0]):
                best = (len(entry), layer)
    return best[1] if best else None


def module_path(dotted: str, package: Path) -> str | None:
    """``scorekit.models.base`` -> ``models/base.py``; None when no such file or package is in the tree."""
    parts = dotted.split(".")[1:]
    base = package.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py").relative_to(package).as_posix()
    if (base / "__init__.py").is_file():
        return (base / "__init__.py").relative_to(package).as_posix()
    return None


def imports_of(path: Path, package: Path) -> set[str]:
    """What the module at ``path`` imports: scorekit modules as paths relative to the package, and other
    libraries by their top-level name. ``from X import name`` counts ``X.name`` when that is a module."""
    relative = path.relative_to(package)
    own = [package.name, *relative.with_suffix("").parts]
    here = own[:-1]  # the package the module lives in (for an __init__.py, the package itself)
    found: set[str] = set()

    def add(dotted: str) -> None:
        if dotted.split(".")[0] != package.name:
            found.add(dotted.split(".")[0])
        elif (resolved := module_path(dotted, package)) is not None:
            found.add(resolved)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = here[: len(here) - (node.level - 1)]
                source = ".".join(anchor + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if source.split(".")[0] == package.name and module_path(submodule, package) is not None:
                    add(submodule)
                else:
                    add(source)
    return found


def violations(package: Path, layers: list[Layer]) -> dict[str, str]:
    """Every arrow that points up, or at what a row never imports: "importer -> imported" -> the message."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        layer = layer_of(module, layers)
        assert layer is not None, f"{module} is in no row of the Layers table in {TABLE_DOC.name}"
        for imported in sorted(imports_of(path, package)):
            key = f"{module} -> {imported}"
            if any(imported == never or (never.endswith("/") and imported.startswith(never)) for never in layer.never):
                found[key] = f"{module} imports {imported}, which the {layer.name} layer never imports"
                continue
            target = layer_of(imported, layers) if imported.endswith(".py") else None
            if target is not None and target.rank < layer.rank:
                found[key] = (
                    f"{module} imports {imported}, which sits above it "
                    f"({target.name}, rank {target.rank}, over {layer.name}, rank {layer.rank})"
                )
    return found


def test_no_module_imports_one_above_it() -> None:
    found = violations(PACKAGE, read_layers(TABLE_DOC))
    assert not found, "\n".join(found.values())


def test_the_table_ranks_each_layer_once() -> None:
    layers = read_layers(TABLE_DOC)
    ranks = [layer.rank for layer in layers]
    assert ranks == list(range(1, len(layers) + 1)), ranks
    entries = [entry for layer in layers for entry in layer.modules]
    assert len(entries) == len(set(entries)), "a module is in two rows"


# -- the checker itself, on a made-up package ----------------------------------------------------------


def write_tree(root: Path, files: dict[str, str]) -> Path:
    package = root / "scorekit"
    for name, source in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    return package


TOY_LAYERS = [
    Layer(1, "top", ("top.py",), ()),
    Layer(2, "middle", ("mid/", "mid/special.py"), ()),
    Layer(3, "bottom", ("low.py", "__init__.py"), ("torch", "mid/")),
]


def test_the_checker_names_an_import_from_above_and_resolves_relative_imports(tmp_path: Path) -> None:
    package = write_tree(
        tmp_path,
        {
            "__init__.py": "",
            "top.py": "from scorekit.mid import core\nimport scorekit.low\n",
            "low.py": "def later():\n    from scorekit import top\n",
            "mid/__init__.py": "",
            "mid/core.py": "from . import special\nfrom ..low import thing\nfrom .. import top as t\n",
            "mid/special.py": "import torch.nn\n",
        },
    )
    assert imports_of(package / "mid" / "core.py", package) == {"mid/special.py", "low.py", "top.py"}
    assert violations(package, TOY_LAYERS) == {
        "low.py -> top.py": "low.py imports top.py, which sits above it (top, rank 1, over bottom, rank 3)",
        "mid/core.py -> top.py": "mid/core.py imports top.py, which sits above it (top, rank 1, over middle, rank 2)",
    }


def test_the_checker_enforces_what_a_layer_never_imports(tmp_path: Path) -> None:
    package = write_tree(
        tmp_path,
        {"__init__.py": "", "low.py": "import torch\nfrom scorekit.mid.special import x\n", "mid/special.py": ""},
    )
    assert set(violations(package, TOY_LAYERS)) == {"low.py -> torch", "low.py -> mid/special.py"}


def test_a_module_in_no_layer_is_an_error(tmp_path: Path) -> None:
    package = write_tree(tmp_path, {"__init__.py": "", "stray.py": ""})
    with pytest.raises(AssertionError, match=r"stray\.py is in no row"):
        violations(package, TOY_LAYERS)


# -- what the leaves promise: importing them loads no torch ---------------------------------------------


def modules_of(package: str) -> list[str]:
    """A package's dotted name and those of the modules in it."""
    folder = PACKAGE.joinpath(*package.split(".")[1:])
    return [package, *sorted(f"{package}.{path.stem}" for path in folder.glob("*.py") if path.stem != "__init__")]


# What sits above the engine: the static check above sees only direct imports, and these must not reach torch
# through anything they import either (an endpoint through the registry, a middleware through an endpoint).
ABOVE_THE_ENGINE = [
    *modules_of("scorekit.middleware"),
    "scorekit.lifecycle",
    "scorekit.routing",
    *modules_of("scorekit.api"),
]


@pytest.mark.parametrize(
    "module",
    [
        "scorekit.settings",
        "scorekit.cli",
        "scorekit.jobs",
        "scorekit.batching",
        "scorekit.deploy.options",
        *ABOVE_THE_ENGINE,
    ],
)
def test_importing_loads_no_torch(module: str) -> None:
    """In a fresh interpreter, so that whatever the module imports, however indirectly, is counted."""
    check = f"import sys, {module}; assert 'torch' not in sys.modules, 'torch was imported'"
    probe = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
