"""An install that a neighbour broke (issue 26): another distribution's package named `console` written over ours in
the same environment. `--version`, `status` and `doctor` say so in one line on stderr; an intact install and an
editable one say nothing.

Real: the wheel of this tree installed into a fresh venv (tests/test_installed_wheel.py's fixture), its own
`console/__init__.py` overwritten as pip would overwrite it for another package, and an editable install of the
tree into a venv of its own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

import backends
from tests.test_installed_wheel import LOCAL_ONLY, REPO, clean_env, console, installed

__all__ = ["installed"]  # the fixture, imported for the tests here

FIX = (
    "reinstall eagle3-console into its own environment: pipx install eagle3-console, or uv tool install eagle3-console"
)


def site_packages(bin_dir: Path) -> Path:
    [site] = (bin_dir.parent / "lib").glob("python3*/site-packages")
    return site


@pytest.fixture
def overwritten(installed: Path) -> Iterator[Path]:
    """The installed venv with another package's `console/__init__.py` in place of ours (put back afterwards)."""
    init = site_packages(installed) / "console" / "__init__.py"
    ours = init.read_bytes()
    init.write_text('"""console: another project\'s package of the same name."""\n__version__ = "9.9"\n')
    try:
        yield installed
    finally:
        init.write_bytes(ours)


def test_an_intact_install_says_nothing(installed: Path, tmp_path: Path) -> None:
    version = console(installed, tmp_path, "--version")
    assert (version.returncode, version.stdout.strip(), version.stderr) == (
        0,
        f"eagle3-console {backends.__version__}",
        "",
    )
    status = console(installed, tmp_path, "--workdir", str(tmp_path / "work"), "local", "status")
    assert status.returncode == 0 and "not eagle3-console's" not in status.stderr, status.stderr


def test_a_package_written_over_ours_is_named_with_the_fix_by_version_status_and_doctor(
    overwritten: Path, tmp_path: Path
) -> None:
    where = site_packages(overwritten) / "console" / "__init__.py"
    said = f"eagle3-console: the package 'console' at {where} is not eagle3-console's"
    version = console(overwritten, tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"eagle3-console {backends.__version__}"
    [line] = version.stderr.splitlines()
    assert line.startswith(said) and line.endswith(FIX)
    status = console(overwritten, tmp_path, "--workdir", str(tmp_path / "work"), "local", "status")
    assert status.returncode == 0, status.stderr
    assert status.stderr.splitlines()[0] == line
    # A command that is none of the three stays quiet: the warning is theirs.
    listing = console(overwritten, tmp_path, "hosts")
    assert "not eagle3-console's" not in listing.stderr


def test_doctor_names_the_foreign_package_and_keeps_its_exit_code(overwritten: Path, tmp_path: Path) -> None:
    doctor = console(overwritten, tmp_path, "--workdir", str(tmp_path / "work"), "local", "doctor", str(tmp_path))
    assert doctor.stderr.splitlines()[0].endswith(FIX)
    assert doctor.returncode != 0  # no draft in that folder: doctor's own verdict, as without the warning


def test_an_editable_install_says_nothing(tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*LOCAL_ONLY))
    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    pip = [str(bin_dir / "python"), "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps"]
    subprocess.run([*pip, "-e", str(source)], check=True, env=clean_env(tmp_path), cwd=tmp_path, timeout=600)
    version = console(bin_dir, tmp_path, "--version")
    assert (version.returncode, version.stderr) == (0, "")
    assert version.stdout.strip() == f"eagle3-console {backends.__version__}"


def test_the_check_that_runs_on_every_status_imports_nothing_heavy(overwritten: Path, tmp_path: Path) -> None:
    """The check reads our RECORD itself: importlib.metadata (email, zipfile, csv: ~25 ms) on every status is what it
    avoids. What it costs in time is benchmarks.cli_start's to say, not a timed assertion here."""
    probe = "import json, sys; from console.cli import integrity; before = set(sys.modules); "
    probe += "line = integrity.foreign_package(); print(json.dumps(sorted(set(sys.modules) - before)))"
    probe += "; print(line is not None)"
    done = subprocess.run(
        [str(overwritten / "python"), "-c", probe],
        capture_output=True,
        text=True,
        env=clean_env(tmp_path),
        cwd=tmp_path,
        check=True,
    )
    imported, found = done.stdout.splitlines()
    assert found == "True"  # it did the whole check: the package written over ours was found
    assert not {"importlib.metadata", "email", "zipfile", "csv"} & set(json.loads(imported)), imported
