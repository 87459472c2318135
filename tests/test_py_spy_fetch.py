"""py-spy's pinned wheel fetched without pip, from the package index the user's pip is set to.

Real: package indexes on 127.0.0.1 (http.server in threads) answering PEP 691 JSON or PEP 503 HTML, a wheel
zip built here in py-spy's layout with the pins swapped for its hashes (so both SHA-256 checks are real),
pip's config files under a temporary HOME, pip itself as the judge of which index `pip download` would ask,
and a venv without pip (as pipx or `uv tool` make one) running the fetch in its own process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pip._internal.commands import create_command

from console.link import py_spy

MACHINE = "aarch64"  # not this machine's: py-spy installed beside the console can never stand in for the fetch
PLATFORM = py_spy.WHEELS[MACHINE].platform
FILENAME = py_spy.WHEELS[MACHINE].filename
OLDER = FILENAME.replace(py_spy.VERSION, "0.4.2")
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wheel_zip(binary: bytes) -> bytes:
    """A wheel as py-spy's are laid out: the binary as a script of its .data folder."""
    name = f"py_spy-{py_spy.VERSION}"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(
            f"{name}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: py-spy\nVersion: {py_spy.VERSION}\n"
        )
        archive.writestr(f"{name}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n")
        archive.writestr(f"{name}.data/scripts/py-spy", binary)
    return buffer.getvalue()


@dataclass(frozen=True)
class Pinned:
    wheel: bytes
    binary: bytes
    pin: py_spy.Wheel


@pytest.fixture
def pinned(monkeypatch: pytest.MonkeyPatch) -> Pinned:
    """A real wheel made here, pinned as py-spy's aarch64 one (its filename, our hashes); no proxy, no pip config
    and no index in the environment, and nothing fetched yet in this process."""
    binary = b"\x7fELF a stand-in for py-spy\n" * 64
    wheel = wheel_zip(binary)
    pin = py_spy.Wheel(PLATFORM, FILENAME, sha256(wheel), sha256(binary))
    monkeypatch.setattr(py_spy, "WHEELS", {MACHINE: pin})
    monkeypatch.setattr(py_spy, "_found", {})
    for name in (*PROXIES, "PIP_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return Pinned(wheel, binary, pin)


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str = "application/octet-stream"
    body: bytes = b""
    location: str = ""  # where a redirect sends


Route = Callable[[dict[str, str]], Answer]  # given the request's headers (lower-cased names)


@dataclass(frozen=True)
class Seen:
    path: str
    headers: dict[str, str]


class IndexServer(ThreadingHTTPServer):
    routes: dict[str, Route]
    seen: list[Seen]
    authorization: str | None  # the Authorization header it requires, if any


class Handler(BaseHTTPRequestHandler):
    server: IndexServer

    def do_GET(self) -> None:
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.server.seen.append(Seen(self.path, headers))
        answer = self._answer(headers)
        self.send_response(answer.status)
        if answer.location:
            self.send_header("Location", answer.location)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

    def _answer(self, headers: dict[str, str]) -> Answer:
        required = self.server.authorization
        if required is not None and headers.get("authorization") != required:
            return Answer(401, "text/plain", b"who are you?")
        route = self.server.routes.get(self.path)
        return Answer(404, "text/plain", b"no such page") if route is None else route(headers)

    def log_message(self, format: str, *args: object) -> None:  # the test's output stays the test's
        pass


class Index:
    """A package index on 127.0.0.1, in a thread: each path's route, and every request it got."""

    def __init__(self, server: IndexServer) -> None:
        self.server = server
        self.port: int = server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def serve(self, path: str, route: Route) -> None:
        self.server.routes[path] = route

    def require(self, user: str, password: str) -> None:
        """Basic auth, as an index of a company asks for it."""
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.server.authorization = f"Basic {token}"

    @property
    def seen(self) -> list[Seen]:
        return self.server.seen

    def paths(self) -> list[str]:
        return [seen.path for seen in self.server.seen]


@contextlib.contextmanager
def running_index() -> Iterator[Index]:
    server = IndexServer(("127.0.0.1", 0), Handler)
    server.routes, server.seen, server.authorization = {}, [], None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Index(server)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def index() -> Iterator[Index]:
    with running_index() as running:
        yield running


def closed_port() -> int:
    """A port of 127.0.0.1 where nothing listens: connections to it are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def serves(data: bytes) -> Route:
    return lambda headers: Answer(200, "application/octet-stream", data)


def redirects(to: str) -> Route:
    return lambda headers: Answer(302, "text/plain", location=to)


def pep503(links: list[tuple[str, str]]) -> Route:
    """A project page in PEP 503's HTML, whatever was asked: each (file name, href)."""
    anchors = "".join(f'<a href="{href}">{name}</a><br/>\n' for name, href in links)
    body = f"<!DOCTYPE html><html><body><h1>Links for py-spy</h1>\n{anchors}</body></html>".encode()
    return lambda headers: Answer(200, "text/html; charset=utf-8", body)


def pep691(files: list[tuple[str, str]]) -> Route:
    """A project page in PEP 691's JSON to a client asking for it, as PyPI does; to one that does not, an HTML
    page that lists nothing (so only a client that reads the JSON finds the wheel)."""
    listed = [{"filename": name, "url": url, "hashes": {}} for name, url in files]
    body = json.dumps({"meta": {"api-version": "1.1"}, "name": "py-spy", "files": listed}).encode()
    empty = pep503([])

    def answer(headers: dict[str, str]) -> Answer:
        return Answer(200, JSON_TYPE, body) if JSON_TYPE in headers.get("accept", "") else empty(headers)

    return answer


def fetched() -> Path:
    """The binary as the console gets it for an aarch64 host, checked against the digest it says."""
    path, digest = asyncio.run(py_spy.binary(MACHINE))
    assert sha256(path.read_bytes()) == digest
    return path


def refusal() -> str:
    """Why the console gets no py-spy for an aarch64 host: one line, no traceback."""
    with pytest.raises(py_spy.NoPySpy) as refused:
        asyncio.run(py_spy.binary(MACHINE))
    message = str(refused.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def cache_folder(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "eagle3-console"  # XDG_CACHE_HOME is tmp_path/cache (tests/conftest.py)


def assert_cached(tmp_path: Path, path: Path, pinned: Pinned) -> None:
    """The binary is the pinned one, 0700, the only thing in the console's cache (no scratch left)."""
    assert path == cache_folder(tmp_path) / f"py-spy-{py_spy.VERSION}-{PLATFORM}"
    assert path.read_bytes() == pinned.binary
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert list(cache_folder(tmp_path).iterdir()) == [path]


def test_a_json_index_gives_the_pinned_binary_through_a_redirect(
    index: Index, pinned: Pinned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index.serve(
        "/simple/py-spy/",
        pep691([(OLDER, f"{index.url}/files/{OLDER}"), (FILENAME, f"{index.url}/files/{FILENAME}")]),
    )
    index.serve(f"/files/{FILENAME}", redirects(f"/blobs/ab/{FILENAME}"))
    index.serve(f"/blobs/ab/{FILENAME}", serves(pinned.wheel))
    monkeypatch.setenv("PIP_INDEX_URL", f"{index.url}/simple/")
    assert_cached(tmp_path, fetched(), pinned)
    assert index.paths() == ["/simple/py-spy/", f"/files/{FILENAME}", f"/blobs/ab/{FILENAME}"]
    assert JSON_TYPE in index.seen[0].headers["accept"]


def test_an_html_index_with_relative_links_gives_the_pinned_binary(
    index: Index, pinned: Pinned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Links relative to the project page (/org/simple/py-spy/), not to the index's URL."""
    links = [
        (OLDER, f"../../packages/00/{OLDER}"),
        (FILENAME, f"../../packages/cd/{FILENAME}#sha256={pinned.pin.sha256}"),
    ]
    index.serve("/org/simple/py-spy/", pep503(links))
    index.serve(f"/org/packages/cd/{FILENAME}", serves(pinned.wheel))
    monkeypatch.setenv("PIP_INDEX_URL", f"{index.url}/org/simple")  # no slash at the end, as pip takes it too
    assert_cached(tmp_path, fetched(), pinned)
    assert index.paths() == ["/org/simple/py-spy/", f"/org/packages/cd/{FILENAME}"]


def test_an_index_without_the_pinned_wheel_says_so(
    index: Index, pinned: Pinned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index.serve("/simple/py-spy/", pep503([(OLDER, f"/packages/{OLDER}")]))
    monkeypatch.setenv("PIP_INDEX_URL", f"{index.url}/simple/")
    message = refusal()
    assert message.startswith(f"cannot fetch py-spy {py_spy.VERSION} from {index.url}/simple/ (")
    assert f"lists no {FILENAME}" in message and "pip install py-spy" in message
    assert list(cache_folder(tmp_path).iterdir()) == []


def test_the_file_pip_config_file_names_is_read_and_the_users_is_not(
    index: Index, pinned: Pinned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As pip does: the user's own file is passed over when PIP_CONFIG_FILE names one, and [install] is not
    `pip download`'s section (each of those names a dead index: asking it fails the fetch)."""
    dead = f"http://127.0.0.1:{closed_port()}"
    index.serve("/simple/py-spy/", pep503([(FILENAME, f"/packages/{FILENAME}")]))
    index.serve(f"/packages/{FILENAME}", serves(pinned.wheel))
    named = tmp_path / "ci-pip.conf"
    named.write_text(f"[global]\nindex_url = {index.url}/simple/\n\n[install]\nindex-url = {dead}/install/\n")
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(f"[download]\nindex-url = {dead}/user/\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(named))
    assert_cached(tmp_path, fetched(), pinned)
    assert index.paths() == ["/simple/py-spy/", f"/packages/{FILENAME}"]


def test_the_users_own_pip_conf_is_read(
    index: Index, pinned: Pinned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's file under XDG_CONFIG_HOME over the legacy ~/.pip/pip.conf and the global one, and its
    [download] over its [global] (each other setting names a dead index: asking it fails the fetch)."""
    dead = f"http://127.0.0.1:{closed_port()}"
    index.serve("/simple/py-spy/", pep503([(FILENAME, f"/packages/{FILENAME}")]))
    index.serve(f"/packages/{FILENAME}", serves(pinned.wheel))
    home, config, system = tmp_path / "home", tmp_path / "config", tmp_path / "etc-xdg"
    files = {
        system / "pip": f"[global]\nindex-url = {dead}/system/\n",
        home / ".pip": f"[download]\nindex-url = {dead}/legacy/\n",
        config / "pip": f"[global]\nindex-url = {dead}/global/\n[download]\nindex-url = {index.url}/simple/\n",
    }
    for folder, text in files.items():
        folder.mkdir(parents=True)
        (folder / "pip.conf").write_text(text)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(system))
    monkeypatch.delenv("PIP_CONFIG_FILE")
    assert_cached(tmp_path, fetched(), pinned)


def test_a_pip_config_pip_cannot_read_is_named_without_its_contents(
    pinned: Pinned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip stops at such a file, and so does the fetch: no index is asked; the file's line (a URL with its
    password) is not quoted back."""
    named = tmp_path / "pip.conf"
    named.write_text("index-url = https://ci:hunter2@index.example/simple/\n")  # no [section]
    monkeypatch.setenv("PIP_CONFIG_FILE", str(named))
    message = refusal()
    assert message.startswith(f"pip cannot read its config file {named} (")
    assert "hunter2" not in message and "pip install py-spy" in message
    assert not any(cache_folder(tmp_path).glob("*"))


URLS = st.sampled_from(["", "https://a.example/simple/", "https://b.example/pypi", "http://u:p@c.example/s/"])
SECTIONS = st.sampled_from(["global", "download", "install"])
SPELLINGS = st.sampled_from(["index-url", "index_url", "INDEX-URL", "--index-url"])
CONFIG = st.lists(st.tuples(SECTIONS, SPELLINGS, URLS), max_size=4)
FILES = ("xdg-dirs/pip/pip.conf", "home/.pip/pip.conf", "config/pip/pip.conf", "named.conf")


def config_text(settings: list[tuple[str, str, str]]) -> str:
    """A file pip can read: each section once, with one spelling of index-url (the last drawn for it)."""
    sections = {section: (key, url) for section, key, url in settings}
    return "".join(f"[{section}]\n{key} = {url}\n" for section, (key, url) in sections.items())


@settings(max_examples=150, deadline=None)
@given(
    files=st.tuples(*[st.none() | CONFIG for _ in FILES]),
    named=st.sampled_from(["unset", "file", "missing", "devnull"]),
    environment=st.none() | URLS,
)
@example(  # a later file's empty value unsets an earlier one's: PyPI again
    files=(None, [("global", "index-url", "https://a.example/simple/")], [("global", "index-url", "")], None),
    named="unset",
    environment=None,
)
def test_the_index_is_the_one_pip_download_would_ask(
    files: tuple[list[tuple[str, str, str]] | None, ...], named: str, environment: str | None
) -> None:
    """pip itself (its option parser for `pip download`, as installed here) is the judge, over the global,
    legacy, user and PIP_CONFIG_FILE files, sections, spellings, empty values and PIP_INDEX_URL."""
    with tempfile.TemporaryDirectory() as scratch, pytest.MonkeyPatch.context() as monkeypatch:
        top = Path(scratch)
        for relative, lines in zip(FILES, files, strict=True):
            if lines is not None:
                (top / relative).parent.mkdir(parents=True, exist_ok=True)
                (top / relative).write_text(config_text(lines))
        monkeypatch.setenv("XDG_CONFIG_DIRS", str(top / "xdg-dirs"))
        monkeypatch.setenv("HOME", str(top / "home"))
        monkeypatch.setenv("XDG_CONFIG_HOME", str(top / "config"))
        chosen = {
            "unset": None,
            "file": str(top / "named.conf"),
            "missing": str(top / "no.conf"),
            "devnull": os.devnull,
        }
        for name, value in (("PIP_CONFIG_FILE", chosen[named]), ("PIP_INDEX_URL", environment)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        options, _ = create_command("download").parse_args([])
        assert py_spy.index_url().rstrip("/") == options.index_url.rstrip("/")


def test_credentials_in_the_index_url_are_sent_to_it_alone_and_never_said(
    index: Index, pinned: Pinned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index asks for basic auth; its page sends the wheel to another host (another origin), which must not
    get the credentials; then a wrong password: refused, and the message keeps the credentials to itself."""
    user, password = "ci bot", "p@ss:w/rd%é"
    index.require(user, password)
    with running_index() as files:
        index.serve("/simple/py-spy/", pep691([(FILENAME, f"{files.url}/wheels/{FILENAME}")]))
        files.serve(f"/wheels/{FILENAME}", serves(pinned.wheel))
        credentials = f"{quote(user, safe='')}:{quote(password, safe='')}"
        monkeypatch.setenv("PIP_INDEX_URL", f"http://{credentials}@127.0.0.1:{index.port}/simple/")
        assert_cached(tmp_path, fetched(), pinned)
        assert "authorization" not in files.seen[0].headers
    assert index.seen[0].headers["host"] == f"127.0.0.1:{index.port}"

    monkeypatch.setattr(py_spy, "_found", {})
    (cache_folder(tmp_path) / f"py-spy-{py_spy.VERSION}-{PLATFORM}").unlink()
    wrong = f"{quote(user, safe='')}:{quote('not-' + password, safe='')}"
    monkeypatch.setenv("PIP_INDEX_URL", f"http://{wrong}@127.0.0.1:{index.port}/simple/")
    message = refusal()
    assert message.startswith(f"cannot fetch py-spy {py_spy.VERSION} from http://****@127.0.0.1:{index.port}/simple/")
    assert "HTTP 401 Unauthorized" in message
    for secret in (user, password, quote(user, safe=""), quote(password, safe="")):
        assert secret not in message


def test_a_wheel_whose_hash_differs_is_refused_and_nothing_is_cached(
    index: Index, pinned: Pinned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = wheel_zip(pinned.binary + b"and a little more")
    index.serve("/simple/py-spy/", pep503([(FILENAME, f"/packages/{FILENAME}")]))
    index.serve(f"/packages/{FILENAME}", serves(other))
    monkeypatch.setenv("PIP_INDEX_URL", f"{index.url}/simple/")
    message = refusal()
    assert f"{FILENAME} from {index.url}/simple/ is not the one pinned (SHA-256 differs)" in message
    assert "pip install py-spy" in message
    assert list(cache_folder(tmp_path).iterdir()) == []


def test_an_index_that_is_down_is_named_without_its_credentials(
    pinned: Pinned, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = closed_port()
    monkeypatch.setenv("PIP_INDEX_URL", f"http://ci:hunter2@127.0.0.1:{port}/simple/")
    message = refusal()
    assert message.startswith(f"cannot fetch py-spy {py_spy.VERSION} from http://****@127.0.0.1:{port}/simple/ (")
    assert "refused" in message.lower()
    assert message.endswith(
        "install py-spy on the host (pip install py-spy), or set PIP_INDEX_URL to an index this machine can reach"
    )
    assert "hunter2" not in message and "ci:" not in message
    assert refusal() == message  # the console's next connection hears the same, without asking again
    monkeypatch.setattr(py_spy, "_found", {})
    monkeypatch.setenv("PIP_INDEX_URL", f"http://ci:pw/secret@127.0.0.1:{port}/simple/")  # a / left unencoded
    message = refusal()
    assert f"http://****@127.0.0.1:{port}/simple/ is not a valid URL" in message
    assert "secret" not in message and "pw" not in message


@settings(max_examples=40, deadline=None)
@given(user=st.text(min_size=1, max_size=12), password=st.text(max_size=12))
def test_any_credentials_are_masked_in_what_is_said(user: str, password: str) -> None:
    """Whatever the credentials, the message is the one said without them, with ****@ for them."""
    port = closed_port()
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(py_spy, "_found", {})
        monkeypatch.setattr(py_spy, "WHEELS", {MACHINE: py_spy.Wheel(PLATFORM, FILENAME, "0" * 64, "0" * 64)})
        for name in PROXIES:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple/")
        plain = refusal()
        monkeypatch.setattr(py_spy, "_found", {})
        userinfo = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "")
        monkeypatch.setenv("PIP_INDEX_URL", f"http://{userinfo}@127.0.0.1:{port}/simple/")
        assert refusal() == plain.replace("from http://", "from http://****@", 1)


def test_the_cache_is_reused_without_asking_the_index(
    index: Index, pinned: Pinned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index.serve("/simple/py-spy/", pep503([(FILENAME, f"/packages/{FILENAME}")]))
    index.serve(f"/packages/{FILENAME}", serves(pinned.wheel))
    monkeypatch.setenv("PIP_INDEX_URL", f"{index.url}/simple/")
    first = fetched()
    asked = len(index.seen)
    monkeypatch.setattr(py_spy, "_found", {})  # as the console's next process
    assert fetched() == first
    assert len(index.seen) == asked == 2


@pytest.mark.parametrize("layout", ["index.html", "wheels in the folder"])
def test_a_file_index_gives_the_pinned_binary(
    layout: str, pinned: Pinned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "local index"  # a space: the file URL is quoted and must be read back unquoted
    (folder / "py-spy").mkdir(parents=True)
    if layout == "index.html":
        (folder / "wheels").mkdir()
        (folder / "wheels" / FILENAME).write_bytes(pinned.wheel)
        (folder / "py-spy" / "index.html").write_text(f'<a href="../wheels/{FILENAME}">{FILENAME}</a>\n')
    else:
        (folder / "py-spy" / FILENAME).write_bytes(pinned.wheel)
    monkeypatch.setenv("PIP_INDEX_URL", folder.as_uri())
    assert_cached(tmp_path, fetched(), pinned)


FETCH_IN_A_FRESH_PROCESS = """
import asyncio, sys
from console.link import py_spy
platform, filename, wheel_sha, binary_sha = sys.argv[1:]
py_spy.WHEELS = {"aarch64": py_spy.Wheel(platform, filename, wheel_sha, binary_sha)}
path, digest = asyncio.run(py_spy.binary("aarch64"))
print(path)
"""


def pipless_venv(folder: Path) -> Path:
    """A venv without pip, as pipx or `uv tool` make one, holding what this console's own venv holds but pip
    (each entry of its site-packages linked in, the console's editable install too). Its python.
    (--system-site-packages would not do: it gives the base interpreter's packages, which hold pip and no httpx.)"""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    where = [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    theirs = Path(subprocess.run(where, capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name != "pip" and not entry.name.startswith("pip-"):
            (theirs / entry.name).symlink_to(entry)
    return python


def test_a_console_in_a_venv_without_pip_fetches_py_spy(index: Index, pinned: Pinned, tmp_path: Path) -> None:
    """As a console installed by pipx runs: its own interpreter, no pip to be had, py-spy fetched and cached."""
    python = pipless_venv(tmp_path / "pipx-venv")
    lacking = subprocess.run([str(python), "-c", "import pip"], capture_output=True, text=True, timeout=60, check=False)
    assert lacking.returncode != 0 and "No module named 'pip'" in lacking.stderr  # the premise
    index.serve("/simple/py-spy/", pep691([(FILENAME, f"/packages/{FILENAME}")]))
    index.serve(f"/packages/{FILENAME}", serves(pinned.wheel))
    environment = {name: value for name, value in os.environ.items() if name not in PROXIES}
    environment |= {"PIP_INDEX_URL": f"{index.url}/simple/", "HOME": str(tmp_path / "home")}
    pin = pinned.pin
    done = subprocess.run(
        [str(python), "-c", FETCH_IN_A_FRESH_PROCESS, pin.platform, pin.filename, pin.sha256, pin.binary_sha256],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=environment,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    arrived = Path(done.stdout.strip())
    assert_cached(tmp_path, arrived, pinned)
    assert sha256(arrived.read_bytes()) == pin.binary_sha256
    assert index.paths() == ["/simple/py-spy/", f"/packages/{FILENAME}"]
