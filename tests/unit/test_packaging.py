"""A built wheel holds every package of the source tree (a hand-kept package list once left
``engine.client`` out, so a non-editable install had no HTTP clients), and the benchmarks, which
import from the installed files alone (``histlog bench`` once refused outside a checkout)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_every_package_and_its_type_marker(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy: setuptools would reuse a stale build/ of the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for layer in ("engine", "projections", "schemas", "bench"):
        shutil.copytree(ROOT / layer, src / layer, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(src)], check=True, timeout=300)
    (wheel,) = tmp_path.glob("histlog-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {str(init.relative_to(ROOT).as_posix())
                for layer in ("engine", "projections", "schemas") for init in (ROOT / layer).rglob("__init__.py")}
    assert expected and expected <= names, sorted(expected - names)
    assert {"engine/py.typed", "projections/py.typed", "schemas/py.typed"} <= names
    assert any(n.startswith("schemas/") and n.endswith(".avsc") for n in names)
    console = {f"engine/service/console/{p.name}" for p in (ROOT / "engine" / "service" / "console").iterdir()}
    assert "engine/service/console/index.html" in console and console <= names, sorted(console - names)
    benches = {f"bench/{p.name}" for p in (ROOT / "bench").glob("*.py")}
    assert "bench/bench_engine.py" in benches and benches <= names, sorted(benches - names)
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    here = str(installed)
    probe = ("import bench, engine, importlib; from engine.cli.tools import cmd_bench\n"
             f"assert bench.__file__.startswith({here!r}) and engine.__file__.startswith({here!r})\n"
             "for name in bench.NAMES: importlib.import_module('bench.bench_' + name)\n")
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=120, cwd=tmp_path,
                   env={"PYTHONPATH": str(installed), "PATH": "/usr/bin:/bin"})
