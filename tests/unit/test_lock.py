"""The lock (requirements/lock.txt) pins what ``make`` installs: it must satisfy the ranges
``pyproject.toml`` declares, cover every dependency it names, and ``scripts/check-lock`` must
tell an environment that differs from it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "lock.txt"
CHECK = ROOT / "scripts" / "check-lock"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)")


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        found = _PIN.match(line)
        if found:
            pins[canonicalize_name(found.group(1))] = found.group(2)
    return pins


def _declared() -> list[Requirement]:
    """Every requirement of histlog, its extras test, bench (and what they name of histlog's
    own extras), and its build: what ``make install`` installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = project["project"]["optional-dependencies"]
    out = [Requirement(r) for r in project["project"]["dependencies"]]
    out += [Requirement(r) for r in project["build-system"]["requires"]]
    todo, seen = ["test", "bench"], set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for raw in extras[extra]:
            req = Requirement(raw)
            if canonicalize_name(req.name) == "histlog":
                todo.extend(req.extras)
            else:
                out.append(req)
    return out


def test_the_lock_pins_every_declared_dependency_within_its_range() -> None:
    pins = _pins()
    for req in _declared():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is declared but not locked: run make lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is locked, outside {req}: run make lock")


def test_the_lock_pins_one_version_of_each_package() -> None:
    names = [canonicalize_name(m.group(1)) for line in LOCK.read_text(encoding="utf-8").splitlines()
             if (m := _PIN.match(line))]
    assert len(names) == len(set(names)) and len(names) > 20


def test_check_lock_accepts_the_installed_versions_and_names_each_one_that_differs(tmp_path: Path) -> None:
    pydantic = metadata.version("pydantic")
    good = tmp_path / "good.txt"
    good.write_text(f"pydantic=={pydantic}\n    # via histlog\nnot-a-package==1.0 ; sys_platform == 'nowhere'\n")
    ok = subprocess.run([sys.executable, str(CHECK), str(good)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and f"pydantic {pydantic}" in ok.stdout, ok.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text(f"pydantic==0.0.1\nnot-a-package==1.0\norjson=={metadata.version('orjson')}\n")
    refused = subprocess.run([sys.executable, str(CHECK), str(bad)], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert f"pydantic==0.0.1 is locked, but {pydantic} is installed" in refused.stderr
    assert "not-a-package==1.0 is locked, but nothing is installed" in refused.stderr
    assert "orjson" not in refused.stderr and "new virtual environment" in refused.stderr
    drift = subprocess.run([sys.executable, str(CHECK), "--drift", str(bad)], capture_output=True, text=True,
                           timeout=60)
    assert drift.returncode == 1 and "2 packages differ" in drift.stdout
    assert f"pydantic: 0.0.1 locked, {pydantic} now" in drift.stdout
