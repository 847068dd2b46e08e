"""A large render's passwords hashed in another interpreter (passwd.Hashing): same hashes.

From 2,000 passwords on, `vox broker render` hands the PBKDF2 work to a child interpreter
so it runs beside the rendering thread (docs/performance.md, figure 7). What it answers
must be what hash_passwords would: fresh `$7$` hashes that verify, kept ones kept while
they match, and the same result when the child cannot start or answers nonsense.
"""

from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kits.brokerkit import tree_fleet
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.passwd import (
    ITERATIONS,
    Hashing,
    PasswordHash,
    hash_password,
    new_secret,
    parse_passwd,
)
from vox_mqtt.broker.render import render_broker_dir

MANY = 2100  # above the size from which a child interpreter hashes


def _check(passwords: dict[int, str], hashes: dict[int, PasswordHash]) -> None:
    assert hashes.keys() == passwords.keys()
    salts = set()
    for key, password in passwords.items():
        hashed = hashes[key]
        assert hashed.verify(password), key
        assert hashed.iterations == ITERATIONS
        salts.add(hashed.salt)
    assert len(salts) == len(passwords)  # a fresh salt each


def test_a_child_hashes_keeps_what_matches_and_replaces_what_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[object] = []
    popen = subprocess.Popen

    def spied(*args: Any, **kwargs: Any) -> Any:
        started.append(args[0])
        return popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", spied)
    passwords = {key: new_secret() for key in range(MANY)}
    matching, wrong = hash_password(passwords[0]), hash_password("not the secret")
    kept = {0: matching, 1: wrong, 2: None}
    with Hashing(passwords, kept) as hashing:
        hashes = hashing.result()
        assert hashing.result() is hashes  # answered once
    assert len(started) == 1  # the child interpreter did the work
    _check(passwords, dict(hashes))
    assert hashes[0] is matching  # still matches: the very hash kept (unchanged files)
    assert hashes[1].salt != wrong.salt  # no longer matches: hashed anew


@pytest.mark.parametrize("python", ["/nonexistent/python3", "/bin/true", "/bin/false"])
def test_a_child_that_cannot_answer_changes_nothing(
    python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cannot start, answers nothing with success, fails: hashed here all the same.
    monkeypatch.setattr(sys, "executable", python)
    passwords = {key: new_secret() for key in range(MANY)}
    with Hashing(passwords, {}) as hashing:
        hashes = hashing.result()
    _check(passwords, dict(hashes))


def test_a_render_of_many_writes_hashes_of_the_stored_secrets(tmp_path: Path) -> None:
    fleet = tree_fleet({f"n{i}": None if i == 0 else f"n{(i - 1) // 10}" for i in range(MANY)})
    out = tmp_path / "b"
    render_broker_dir(fleet, out, port=18830, run_as_user=getpass.getuser())
    entries, problems = parse_passwd((out / "passwd").read_text())
    assert not problems
    secrets = CredentialStore(out).passwords()
    assert len(entries) == MANY + 5  # the agents, the operator, its 3 looks, the canary
    assert all(entries[user].verify(secrets[user]) for user in entries)
    before = (out / "passwd").read_bytes()
    render_broker_dir(fleet, out, port=18830, run_as_user=getpass.getuser())
    assert (out / "passwd").read_bytes() == before  # secrets kept: every hash kept
