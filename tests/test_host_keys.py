"""New host keys met by a command over several hosts at once: one question on the terminal at a time (never two
prompts garbled into one), and every trusted key kept in known_hosts (never one rewrite losing another's)."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from console.link import host_keys
from console.link.host_keys import OfferedKey


def offered(host: str, known_hosts: Path) -> OfferedKey:
    return OfferedKey(
        spec=host,
        name=host,
        algorithm="ssh-ed25519",
        fingerprint=f"SHA256:{host}",
        line=f"{host} ssh-ed25519 AAAA{host}\n",
        known_hosts=known_hosts,
        changed=False,
        trusted_algorithms=(),
        address=host,
        port=22,
    )


def test_two_hosts_new_keys_are_asked_one_after_the_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    said = io.StringIO()
    monkeypatch.setattr(sys, "stdin", os.fdopen(read))
    monkeypatch.setattr(sys, "stderr", said)

    def prompts() -> int:
        return said.getvalue().count("can't be established")

    async def both() -> list[bool]:
        keys = [offered(host, tmp_path / "known_hosts") for host in ("gpu1", "gpu2")]
        asked = [asyncio.create_task(host_keys.ask_on_terminal(key)) for key in keys]
        try:
            await asyncio.sleep(0.5)
            assert prompts() == 1  # the second waits for the first answer
            os.write(write, b"yes\n")
            deadline = time.monotonic() + 10
            while prompts() < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            os.write(write, b"no\n")
            return list(await asyncio.gather(*asked))
        finally:
            os.close(write)  # a failed check must not leave a question waiting for input forever

    answers = asyncio.run(both())
    assert sorted(answers) == [False, True]
    first, second = said.getvalue().split("(yes/no/[fingerprint])? ")[:2]
    assert first.count("\n") == 2 and second.count("\n") == 2  # each prompt whole, none inside another


def test_keys_recorded_at_once_are_all_kept(tmp_path: Path) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    hosts = [f"gpu{i}" for i in range(12)]
    threads = [threading.Thread(target=host_keys.record, args=(offered(h, known),)) for h in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(known.read_text().splitlines()) == sorted(f"{h} ssh-ed25519 AAAA{h}" for h in hosts)
    assert known.stat().st_mode & 0o777 == 0o600
