"""py-spy for an SSH host that has none, so a stalled run's stack dump shows its Python frames.

The binary comes from py-spy's wheel for the host's architecture (the launcher says `uname -m`), pinned to
one release: the one installed beside this console when it is that release and that architecture, else a
copy cached in ~/.cache/eagle3-console/, fetched when first needed. The fetch needs no pip (a console
installed by pipx, `uv tool` or a venv without pip has none): httpx asks the package index that the user's
pip is set to (PIP_INDEX_URL, else index-url in pip's config files, read as `pip download` reads them, else
PyPI) through its simple API, JSON or HTML, for the pinned wheel's file. Every wheel and every binary is
checked against the SHA-256 pinned here (the wheels' are those PyPI publishes), so nothing else is ever run
on the host as py-spy. It goes to WORKDIR/agent/bin/py-spy (0700, written under another name and renamed),
where the agent looks after PATH and its interpreter's folder.
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import hashlib
import importlib.metadata
import json
import locale
import os
import posixpath
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

import asyncssh

from backends.shipped import BIN, PARTIAL, PY_SPY

if TYPE_CHECKING:
    import httpx

VERSION = "0.4.3"
PYPI = "https://pypi.org/simple/"
FETCH_TIMEOUT_S = 15  # to connect, or between two reads: pip's default --timeout
# PEP 691's JSON, else PEP 503's HTML from an index that serves only that, as pip asks.
SIMPLE_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.1, text/html;q=0.01"
PIP_SECTIONS = ("global", "download")  # what `pip download` reads of a config file, the later winning
ON_THE_HOST = "install py-spy on the host (pip install py-spy)"
ELSEWHERE = f"{ON_THE_HOST}, or set PIP_INDEX_URL to an index this machine can reach"


@dataclass(frozen=True)
class Wheel:
    platform: str  # pip's platform tag, naming the cached copy
    filename: str
    sha256: str  # of the wheel, as PyPI publishes it
    binary_sha256: str  # of py-spy inside it


WHEELS = {
    "x86_64": Wheel(
        "manylinux2014_x86_64",
        f"py_spy-{VERSION}-py2.py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl",
        "8a4277225f470d394a85cca0cdd944bef87f0097b6f20150a6dd3ac2e92806b8",
        "a41205d4925beafd108e1ace85e66c0a1a7adbfcbebcd4441f07848b608886c0",
    ),
    "aarch64": Wheel(
        "manylinux2014_aarch64",
        f"py_spy-{VERSION}-py2.py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
        "bbcec46930d464b3bfc142d6d02ade4dd8ad5627823263b3eff0280e80c7c132",
        "ad6e22882e8dcaced4f0a76fef10d372645cc7b94c48a289ebe1bedb754774ed",
    ),
}
ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


class NoPySpy(Exception):
    """No py-spy can be had for the host; the message says why, in a few words."""


def wheel_for(machine: str) -> Wheel | None:
    """The pinned wheel for a host of this `uname -m`, if py-spy publishes one."""
    return WHEELS.get(ALIASES.get(machine, machine))


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle3-console"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# What each architecture got in this process: a checked binary, or why there is none (the index is asked once).
_found: dict[str, Path | NoPySpy] = {}


def where(top: str) -> str:
    """Where the uploaded py-spy lives on the host, given the version folder WORKDIR/agent/<version>."""
    return f"{posixpath.dirname(top)}/{BIN}/{PY_SPY}"


async def binary(machine: str) -> tuple[Path, str]:
    """A checked py-spy for a host of `machine`, and its SHA-256; NoPySpy when there is none."""
    wheel = wheel_for(machine)
    if wheel is None:
        raise NoPySpy(f"py-spy publishes no build for {machine!r} hosts")
    if wheel.platform not in _found:
        try:
            _found[wheel.platform] = await asyncio.to_thread(_checked, wheel)
        except NoPySpy as exc:
            _found[wheel.platform] = exc
    found = _found[wheel.platform]
    if isinstance(found, NoPySpy):
        raise found
    return found, wheel.binary_sha256


def _checked(wheel: Wheel) -> Path:
    """The installed or cached binary when it is the pinned one, else one fetched now."""
    for candidate in (_installed(), _cached(wheel)):
        if candidate is not None and candidate.is_file() and sha256_of(candidate) == wheel.binary_sha256:
            return candidate
    return _fetch(wheel)


def _installed() -> Path | None:
    """py-spy as installed beside this console (the agent extra), when it is there."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(PY_SPY)
        for path in dist.files or []:
            if path.name == PY_SPY:
                return Path(str(dist.locate_file(path))).resolve()
    return None


def _cached(wheel: Wheel) -> Path:
    return cache_dir() / f"py-spy-{VERSION}-{wheel.platform}"


def _fetch(wheel: Wheel) -> Path:
    """The wheel from the package index (into a private scratch folder), checked, and its binary cached, checked."""
    index = index_url()
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        path = Path(scratch) / wheel.filename
        _download(index, wheel.filename, path)
        if sha256_of(path) != wheel.sha256:
            raise NoPySpy(f"{wheel.filename} from {masked(index)} is not the one pinned (SHA-256 differs); {ELSEWHERE}")
        partial = Path(scratch) / PY_SPY
        with zipfile.ZipFile(path) as archive:
            partial.write_bytes(archive.read(f"py_spy-{VERSION}.data/scripts/{PY_SPY}"))
        if sha256_of(partial) != wheel.binary_sha256:
            raise NoPySpy(f"py-spy inside {wheel.filename} is not the one pinned (SHA-256 differs)")
        partial.chmod(0o700)
        partial.replace(_cached(wheel))
    return _cached(wheel)


class _Unlisted(Exception):
    """The index answered, but without the wheel; the message says what it gave."""


@dataclass(frozen=True)
class _Index:
    url: httpx.URL  # without its credentials
    auth: httpx.BasicAuth | None  # from its user:password@

    def auth_for(self, url: httpx.URL) -> httpx.BasicAuth | None:
        """The credentials for a request to the index's own host, as pip sends them; none to another host."""
        same_origin = (url.scheme, url.host, url.port) == (self.url.scheme, self.url.host, self.url.port)
        return self.auth if same_origin else None


def _download(index: str, filename: str, path: Path) -> None:
    """`filename`, as the index lists it for py-spy, saved at `path`; NoPySpy, in one line, when it cannot be."""
    import httpx  # here alone: most connections find py-spy installed or cached and need not import it

    try:
        url = httpx.URL(index)
    except httpx.InvalidURL:  # its words may quote the URL, credentials and all
        raise NoPySpy(f"cannot fetch py-spy {VERSION}: {masked(index)} is not a valid URL; {ELSEWHERE}") from None
    found = _Index(url.copy_with(userinfo=b""), httpx.BasicAuth(url.username, url.password) if url.userinfo else None)
    try:
        with httpx.Client(follow_redirects=True, timeout=FETCH_TIMEOUT_S) as client:
            _save(client, found, _listed(client, found, filename), path)
    except (httpx.HTTPError, httpx.InvalidURL, OSError, _Unlisted) as exc:
        raise NoPySpy(f"cannot fetch py-spy {VERSION} from {masked(index)} ({_said(exc)}); {ELSEWHERE}") from None


def _listed(client: httpx.Client, index: _Index, filename: str) -> httpx.URL:
    """Where the index's page for py-spy says `filename` is."""
    page = index.url.copy_with(path=index.url.path.rstrip("/") + "/py-spy/")
    if page.scheme == "file":
        links = _folder_links(Path(page.path))
    else:
        response = client.get(page, headers={"Accept": SIMPLE_ACCEPT}, auth=index.auth_for(page))
        response.raise_for_status()
        page = response.url  # after redirects: links are relative to where the page was found
        json_page = "json" in response.headers.get("content-type", "")
        links = _json_links(response.text) if json_page else _html_links(response.text)
    for name, href in links:
        if filename in (name, posixpath.basename(unquote(urlsplit(href).path))):
            return page.join(href)
    raise _Unlisted(f"the index lists no {filename}")


def _json_links(text: str) -> list[tuple[str, str]]:
    """Each file's name and URL on a PEP 691 project page."""
    try:
        return [(str(file["filename"]), str(file["url"])) for file in json.loads(text)["files"]]
    except (ValueError, KeyError, TypeError):
        raise _Unlisted("the index's JSON page is not PEP 691's") from None


class _Anchors(HTMLParser):
    """The links of a PEP 503 page: each anchor's text (the file's name) and its href."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None  # of the anchor being read
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href is not None:
            self._href, self._text = href, []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append(("".join(self._text).strip(), self._href))
            self._href = None


def _html_links(text: str) -> list[tuple[str, str]]:
    anchors = _Anchors()
    anchors.feed(text)
    anchors.close()
    return anchors.links


def _folder_links(folder: Path) -> list[tuple[str, str]]:
    """A file:// index's page for py-spy: its index.html, as pip reads one, else the files in its folder."""
    page = folder / "index.html"
    if page.is_file():
        return _html_links(page.read_text(encoding="utf-8"))
    return [(entry.name, quote(entry.name)) for entry in folder.iterdir()]


def _save(client: httpx.Client, index: _Index, url: httpx.URL, path: Path) -> None:
    if url.scheme == "file" and index.url.scheme == "file":  # an index on the network never names a local file
        shutil.copyfile(url.path, path)
        return
    with client.stream("GET", url, auth=index.auth_for(url)) as response:
        response.raise_for_status()
        with path.open("wb") as file:
            for chunk in response.iter_bytes():
                file.write(chunk)


def _said(exc: Exception) -> str:
    """What went wrong, in one line: the HTTP status the index answered, else the error's own words."""
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code} {exc.response.reason_phrase}".strip()
    return " ".join(str(exc).split()) or type(exc).__name__


# Up to the last @: a password with a / or # unencoded in it is still masked whole.
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)?.*@", re.DOTALL)


def masked(url: str) -> str:
    """`url` with its user:password@, if any, shown as ****@, for a message."""
    return _USERINFO.sub(r"\1****@", url, count=1)


def index_url() -> str:
    """The index `pip download` would ask: PIP_INDEX_URL, else the index-url of pip's config files, else PyPI."""
    return os.environ.get("PIP_INDEX_URL") or configured_index(map(_config_settings, pip_config_files())) or PYPI


def pip_config_files() -> list[Path]:
    """pip's config files in the order it reads them, a later one's settings winning: the global ones, the user's
    (unless PIP_CONFIG_FILE names a file there is), the site's (beside this interpreter), PIP_CONFIG_FILE's; none
    when PIP_CONFIG_FILE is os.devnull."""
    named = os.environ.get("PIP_CONFIG_FILE")
    if named == os.devnull:
        return []
    files = [folder / "pip.conf" for folder in _global_config_folders()]
    if not (named and os.path.exists(named)):
        files += [Path.home() / ".pip" / "pip.conf", _user_config_folder() / "pip.conf"]
    files.append(Path(sys.prefix) / "pip.conf")
    if named:
        files.append(Path(named))
    return files


def _global_config_folders() -> list[Path]:
    if sys.platform == "darwin":
        return [Path("/Library/Application Support/pip")]
    return [Path(folder, "pip") for folder in _absolute_paths("XDG_CONFIG_DIRS") or ["/etc/xdg"]] + [Path("/etc")]


def _user_config_folder() -> Path:
    if sys.platform == "darwin":  # pip takes Application Support only when the folder is there
        app_support = Path.home() / "Library" / "Application Support" / "pip"
        return app_support if app_support.is_dir() else Path.home() / ".config" / "pip"
    home = os.environ.get("XDG_CONFIG_HOME", "").strip()
    return Path(home if os.path.isabs(home) else Path.home() / ".config", "pip")


def _absolute_paths(variable: str) -> list[str]:
    """The absolute paths an XDG variable lists: relative ones are ignored, as the XDG spec says (and pip)."""
    return [path.strip() for path in os.environ.get(variable, "").split(os.pathsep) if os.path.isabs(path.strip())]


def _config_settings(path: Path) -> dict[str, str]:
    """The index-url of each section of `path` that `pip download` reads; none when it cannot be opened (pip
    passes over it too), NoPySpy when it is not a config file pip can read (pip would stop there)."""
    encoding = "utf-8" if sys.flags.utf8_mode else locale.getpreferredencoding(False)
    try:
        text = path.read_text(encoding=encoding)
    except OSError:
        return {}
    try:
        return index_settings(text)
    except (configparser.Error, UnicodeDecodeError) as exc:
        raise NoPySpy(
            f"pip cannot read its config file {path} ({type(exc).__name__}): fix it, or {ON_THE_HOST}"
        ) from None


class _PipConfigParser(configparser.RawConfigParser):
    def optionxform(self, optionstr: str) -> str:
        """An option's name as pip matches it: INDEX_URL, --index-url and index-url are one."""
        return optionstr.lower().replace("_", "-").removeprefix("--")


def index_settings(text: str) -> dict[str, str]:
    """The index-url that each section `pip download` reads sets in one config file's text."""
    parser = _PipConfigParser()
    parser.read_string(text)
    return {
        section: parser.get(section, "index-url") for section in PIP_SECTIONS if parser.has_option(section, "index-url")
    }


def configured_index(files: Iterable[Mapping[str, str]]) -> str | None:
    """The index-url `pip download` takes from its config files' settings (index_settings, in pip's order): in
    each section a later file's over an earlier one's, then [download]'s over [global]'s; an empty one unsets."""
    latest: dict[str, str] = {}
    for settings in files:
        latest.update(settings)
    return latest.get("download") or latest.get("global") or None


async def upload(sftp: asyncssh.SFTPClient, agent: str, source: Path, found: str) -> None:
    """`source` to AGENT/bin/py-spy, mode 0700, under another name first and renamed over what `found` was."""
    folder = f"{agent}/{BIN}"
    with contextlib.suppress(asyncssh.SFTPFailure):  # there already
        await sftp.mkdir(folder, asyncssh.SFTPAttrs(permissions=0o700))
    target = f"{folder}/{PY_SPY}"
    if found in ("dir", "unlistable"):
        await sftp.rmtree(target)
    partial = f"{folder}/{PARTIAL}{PY_SPY}.{os.urandom(4).hex()}"
    await sftp.put(str(source), partial)
    await sftp.chmod(partial, 0o700)
    try:
        await sftp.posix_rename(partial, target)
    except asyncssh.SFTPOpUnsupported:  # a server without OpenSSH's extension
        with contextlib.suppress(asyncssh.SFTPNoSuchFile):
            await sftp.remove(target)
        await sftp.rename(partial, target)
