"""Mosquitto `$7$` password hashes and the per-identity credentials files clients read."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import subprocess
import sys
import tomllib
from collections.abc import Hashable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from vox_mqtt.protocol.errors import ConfigError

if TYPE_CHECKING:
    from vox_mqtt.protocol.settings import BrokerSettings

__all__ = [
    "ITERATIONS",
    "Credentials",
    "Hashing",
    "LookLogin",
    "PasswordHash",
    "atomic_write",
    "credentials_from",
    "credentials_table",
    "decode_hash",
    "hash_password",
    "hash_passwords",
    "load_credentials",
    "new_secret",
    "parse_passwd",
    "render_credentials",
    "render_passwd",
]

K = TypeVar("K", bound=Hashable)

# Mosquitto 2.0's default for `$7$`. The secrets are 256-bit random tokens, so
# brute force is hopeless whatever the count, and each CONNECT stays cheap.
ITERATIONS: Final = 101
_SALT_BYTES: Final = 12  # Mosquitto drops an entry whose salt is not 12 bytes
_DIGEST_BYTES: Final = 64  # ... or whose digest is not a whole SHA-512


@dataclass(frozen=True, kw_only=True)
class PasswordHash:
    """A PBKDF2-SHA512 hash as Mosquitto's password file and dynsec plugin store it."""

    salt: bytes
    digest: bytes
    iterations: int = ITERATIONS

    @property
    def salt_b64(self) -> str:
        """Return the salt as standard base64."""
        return base64.b64encode(self.salt).decode("ascii")

    @property
    def digest_b64(self) -> str:
        """Return the digest as standard base64."""
        return base64.b64encode(self.digest).decode("ascii")

    def passwd_field(self) -> str:
        """Return the `$7$iterations$salt$digest` field of a password-file line."""
        return f"$7${self.iterations}${self.salt_b64}${self.digest_b64}"

    def verify(self, password: str) -> bool:
        """Return whether the password matches, in constant time."""
        other = _pbkdf2(password, self.salt, self.iterations)
        return hmac.compare_digest(other, self.digest)


def _pbkdf2(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations, _DIGEST_BYTES)


def hash_password(
    password: str, *, salt: bytes | None = None, iterations: int = ITERATIONS
) -> PasswordHash:
    """Hash a password the way `mosquitto_passwd` does (`$7$`, PBKDF2-SHA512)."""
    salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
    if len(salt) != _SALT_BYTES:
        raise ValueError(f"Mosquitto needs a {_SALT_BYTES}-byte salt, got {len(salt)}")
    return PasswordHash(
        salt=salt, digest=_pbkdf2(password, salt, iterations), iterations=iterations
    )


def hash_passwords(
    passwords: Mapping[K, str], kept: Mapping[K, PasswordHash | None]
) -> dict[K, PasswordHash]:
    """Hash each password, keeping a kept hash that still matches; on every core at once."""

    def one(key: K) -> PasswordHash:
        old = kept.get(key)
        # Keep a hash that still matches, so an unchanged fleet renders unchanged files.
        return (
            old if old is not None and old.verify(passwords[key]) else hash_password(passwords[key])
        )

    def some(part: list[K]) -> list[PasswordHash]:
        return [one(key) for key in part]

    keys = list(passwords)
    if len(keys) < 256:
        return {key: one(key) for key in keys}
    # PBKDF2 runs in OpenSSL without the GIL: 10,000 identities hash in parallel, one
    # slice per worker (a future per key cost more than the hashing saved).
    workers = os.cpu_count() or 1
    step = -(-len(keys) // (workers * 4))
    parts = [keys[i : i + step] for i in range(0, len(keys), step)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        hashed = [pw for done in pool.map(some, parts) for pw in done]
    return dict(zip(keys, hashed, strict=True))


# A separate interpreter hashes a large render's passwords: threads of this one got the
# GIL back only when the rendering thread's switch interval (5 ms) forced it off, so
# hashing "in the background" in threads went on only once the rest was done
# (docs/performance.md, figure 7). Lines in: `iterations salt-hex password-hex`; out: the
# digests in hex, one a line, in the same order, written once all are made.
_HASHER: Final = """
import hashlib, sys
jobs = [line.split() for line in sys.stdin.buffer.read().decode().splitlines()]
size = int(sys.argv[1])
done = [
    hashlib.pbkdf2_hmac("sha512", bytes.fromhex(pw), bytes.fromhex(salt), int(n), size).hex()
    for n, salt, pw in jobs
]
sys.stdout.write("".join(line + "\\n" for line in done))
"""
_HASHER_FROM: Final = 2000  # below this many, threads here (no process to start)


class Hashing:
    """hash_passwords' work going on beside this thread; `result()` waits for it.

    Many passwords go to another interpreter (its own GIL, its own core), so they hash
    while this thread renders; if it cannot start or answer, they are hashed here. As a
    context manager it stops an interpreter whose answer nobody took (a failed render).
    """

    def __init__(self, passwords: Mapping[K, str], kept: Mapping[K, PasswordHash | None]) -> None:
        self._passwords: Mapping[Any, str] = passwords
        self._kept: Mapping[Any, PasswordHash | None] = kept
        self._keys = list(passwords)
        self._done: dict[Any, PasswordHash] | None = None
        self._child: subprocess.Popen[bytes] | None = None
        # A kept hash is checked with its own salt; the others get a fresh one, drawn here.
        self._jobs = (
            [
                PasswordHash(salt=secrets.token_bytes(_SALT_BYTES), digest=b"")
                if (old := kept.get(key)) is None
                else replace(old, digest=b"")
                for key in self._keys
            ]
            if len(self._keys) >= _HASHER_FROM and sys.executable
            else []
        )
        if self._jobs:
            self._start()

    def _start(self) -> None:
        try:
            child = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _HASHER, str(_DIGEST_BYTES)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError:
            return  # hashed here, in result()
        self._child = child
        assert child.stdin is not None
        lines = (
            f"{job.iterations} {job.salt.hex()} {self._passwords[key].encode().hex()}\n"
            for key, job in zip(self._keys, self._jobs, strict=True)
        )
        try:
            with child.stdin:
                child.stdin.write("".join(lines).encode("ascii"))
        except OSError:
            pass  # the child is gone: its answer falls short, and result() hashes here

    def _answer(self) -> list[bytes]:
        """Return the child's digests in order; [] if it failed."""
        child, self._child = self._child, None
        if child is None or child.stdout is None:
            return []
        with child.stdout:
            answer = child.stdout.read().decode("ascii", errors="replace").split()
        try:
            digests = [bytes.fromhex(text) for text in answer]
        except ValueError:
            digests = []
        return digests if child.wait() == 0 and len(digests) == len(self._keys) else []

    def result(self) -> dict[Any, PasswordHash]:
        """Return each key's hash (the kept one where it still matches); the same each call."""
        if self._done is not None:
            return self._done
        digests = self._answer()
        if not digests:
            self._done = hash_passwords(self._passwords, self._kept)
            return self._done
        done: dict[Any, PasswordHash] = {}
        for key, job, digest in zip(self._keys, self._jobs, digests, strict=True):
            old = self._kept.get(key)
            if old is None:
                done[key] = replace(job, digest=digest)
            elif hmac.compare_digest(digest, old.digest):
                done[key] = old  # it still matches: an unchanged fleet renders unchanged files
            else:
                done[key] = hash_password(self._passwords[key])
        self._done = done
        return done

    def __enter__(self) -> Hashing:
        return self

    def __exit__(self, *exc: object) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()


def decode_hash(*, salt_b64: str, digest_b64: str, iterations: int) -> PasswordHash | None:
    """Return the hash from its base64 parts, or None where Mosquitto would drop it."""
    try:
        salt = base64.b64decode(salt_b64, validate=True)
        digest = base64.b64decode(digest_b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(salt) != _SALT_BYTES or len(digest) != _DIGEST_BYTES or iterations < 1:
        return None
    return PasswordHash(salt=salt, digest=digest, iterations=iterations)


def new_secret() -> str:
    """Return a fresh random password (256 bits, URL-safe characters)."""
    return secrets.token_urlsafe(32)


def render_passwd(entries: Mapping[str, PasswordHash]) -> str:
    """Return a Mosquitto password file, one `username:$7$...` line per entry."""
    for username in entries:
        if not username or any(c in username for c in ":\n\r") or username != username.strip():
            raise ValueError(f"username {username!r} cannot be written to a password file")
    return "".join(f"{user}:{pw.passwd_field()}\n" for user, pw in entries.items())


def parse_passwd(text: str) -> tuple[dict[str, PasswordHash], list[str]]:
    """Parse a password file; return the usable `$7$` entries and a line per problem."""
    entries: dict[str, PasswordHash] = {}
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        username, sep, field = line.partition(":")
        parts = field.strip().split("$")
        parsed = None
        if sep and len(parts) == 5 and parts[0] == "" and parts[1] == "7" and parts[2].isdigit():
            parsed = decode_hash(salt_b64=parts[3], digest_b64=parts[4], iterations=int(parts[2]))
        if parsed is None:
            problems.append(f"line {number}: not a `user:$7$iterations$salt$hash` entry")
            continue
        entries[username.strip()] = parsed
    return entries, problems


@dataclass(frozen=True, kw_only=True)
class LookLogin:
    """A read-only identity of the operator's for one kind of look (`watch`, `status`)."""

    purpose: str
    username: str
    password: str
    cert_file: Path | None = None
    key_file: Path | None = None


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """How one identity reaches the broker: MQTT username (= client id), secret, address, TLS."""

    username: str
    password: str
    host: str
    port: int
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    # Whether the broker forces client id = username (then one identity, one connection).
    client_id_locked: bool = False
    looks: tuple[LookLogin, ...] = ()

    @property
    def client_id(self) -> str:
        """Return the MQTT client id, which must equal the username."""
        return self.username

    @property
    def tls(self) -> bool:
        """Return whether this identity connects over TLS with a client certificate."""
        return self.ca_file is not None

    def broker_settings(self, **rest: Any) -> BrokerSettings:
        """Return how a session logs in as this identity; rest sets the others (client id,
        timeouts, session expiry) as BrokerSettings names them."""
        # Imported here: the settings bring pydantic, which the quick verbs that read
        # credentials never load (tests/integration/test_cli_quick.py).
        from vox_mqtt.protocol.settings import BrokerSettings

        login: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "username": self.username,
            "password": self.password,
            "client_id": self.client_id,
            "ca_file": self.ca_file,
            "cert_file": self.cert_file,
            "key_file": self.key_file,
        }
        return BrokerSettings(**(login | rest))

    def look(self, purpose: str) -> LookLogin | None:
        """Return the login for one kind of look, if these credentials carry it."""
        return next((look for look in self.looks if look.purpose == purpose), None)


def _toml_str(value: str) -> str:
    # A JSON string literal is a valid TOML basic string (same escapes).
    return json.dumps(value)


def render_credentials(creds: Credentials, *, comment_lines: Iterable[str] = ()) -> str:
    """Return the TOML text of a credentials file."""
    lines = [f"# {line}" for line in comment_lines]
    lines += [
        f"username = {_toml_str(creds.username)}",
        f"password = {_toml_str(creds.password)}",
        f"host = {_toml_str(creds.host)}",
        f"port = {creds.port}",
    ]
    if creds.client_id_locked:
        lines.append("client_id_locked = true")
    if creds.tls:
        lines += [
            "",
            "[tls]",
            f"ca = {_toml_str(str(creds.ca_file))}",
            f"cert = {_toml_str(str(creds.cert_file))}",
            f"key = {_toml_str(str(creds.key_file))}",
        ]
    for look in creds.looks:
        lines += [
            "",
            f"[looks.{look.purpose}]",
            f"username = {_toml_str(look.username)}",
            f"password = {_toml_str(look.password)}",
        ]
        if look.cert_file is not None and look.key_file is not None:
            lines.append(f"cert = {_toml_str(str(look.cert_file))}")
            lines.append(f"key = {_toml_str(str(look.key_file))}")
    return "\n".join(lines) + "\n"


def credentials_table(creds: Credentials) -> dict[str, Any]:
    """Return the credentials as the table `credentials_from` reads back."""
    table: dict[str, Any] = {
        "username": creds.username,
        "password": creds.password,
        "host": creds.host,
        "port": creds.port,
    }
    if creds.client_id_locked:
        table["client_id_locked"] = True
    if creds.tls:
        table["tls"] = {
            "ca": str(creds.ca_file),
            "cert": str(creds.cert_file),
            "key": str(creds.key_file),
        }
    if creds.looks:
        looks: dict[str, Any] = {}
        for look in creds.looks:
            entry = {"username": look.username, "password": look.password}
            if look.cert_file is not None and look.key_file is not None:
                entry |= {"cert": str(look.cert_file), "key": str(look.key_file)}
            looks[look.purpose] = entry
        table["looks"] = looks
    return table


def _need_str(data: Mapping[str, Any], key: str, where: str, problems: list[str]) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        problems.append(f"{where}: `{key}` must be a non-empty string")
        return ""
    return value


def _load_looks(data: Any, where: str, problems: list[str]) -> tuple[LookLogin, ...]:
    if not isinstance(data, dict):
        problems.append(f"{where}: [looks] must hold one table per look")
        return ()
    looks = []
    for purpose, table in sorted(data.items()):
        at = f"{where}: [looks.{purpose}]"
        if not isinstance(table, dict) or set(table) - {"username", "password", "cert", "key"}:
            problems.append(f"{at} must hold username, password and optional cert and key")
            continue
        cert, key = table.get("cert"), table.get("key")
        looks.append(
            LookLogin(
                purpose=purpose,
                username=_need_str(table, "username", at, problems),
                password=_need_str(table, "password", at, problems),
                cert_file=Path(cert) if isinstance(cert, str) else None,
                key_file=Path(key) if isinstance(key, str) else None,
            )
        )
    return tuple(looks)


def load_credentials(path: str | Path) -> Credentials:
    """Read a credentials file; raise ConfigError with one line per problem."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            [f"{path}: no such credentials file (write it with `vox broker render`)"]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read the credentials file: {exc}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    return credentials_from(data, where=str(path))


def credentials_from(data: Mapping[str, Any], *, where: str) -> Credentials:
    """Return the credentials a parsed table holds; raise ConfigError with one line per problem."""
    problems: list[str] = []
    keys = {"username", "password", "host", "port", "tls", "client_id_locked", "looks"}
    unknown = sorted(set(data) - keys)
    if unknown:
        problems.append(f"{where}: unknown key(s) {', '.join(unknown)}")
    username = _need_str(data, "username", where, problems)
    password = _need_str(data, "password", where, problems)
    host = _need_str(data, "host", where, problems)
    port = data.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        problems.append(f"{where}: `port` must be an integer from 1 to 65535")
        port = 0
    tls_files: list[Path | None] = [None, None, None]
    tls = data.get("tls")
    if tls is not None:
        if not isinstance(tls, dict):
            problems.append(f"{where}: [tls] must be a table with ca, cert and key")
        else:
            extra = sorted(set(tls) - {"ca", "cert", "key"})
            if extra:
                problems.append(f"{where}: [tls] has unknown key(s) {', '.join(extra)}")
            for index, key in enumerate(("ca", "cert", "key")):
                value = _need_str(tls, key, f"{where}: [tls]", problems)
                tls_files[index] = Path(value) if value else None
    locked = data.get("client_id_locked", False)
    if not isinstance(locked, bool):
        problems.append(f"{where}: `client_id_locked` must be true or false")
    looks = _load_looks(data.get("looks", {}), where, problems)
    if problems:
        raise ConfigError(problems)
    return Credentials(
        client_id_locked=bool(locked),
        looks=looks,
        username=username,
        password=password,
        host=host,
        port=port,
        ca_file=tls_files[0],
        cert_file=tls_files[1],
        key_file=tls_files[2],
    )


def _write_temp(
    path: Path, payload: bytes, mode: int, owner: tuple[int, int] | None, *, sync: bool
) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed or the file pre-existed
        if owner is not None:
            os.chown(tmp, *owner)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _sync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write(
    path: Path, data: str | bytes, *, mode: int = 0o600, owner: tuple[int, int] | None = None
) -> None:
    """Replace path with data all at once (temp file, fsync, rename): readers see old or new."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = _write_temp(path, payload, mode, owner, sync=True)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_dir(path.parent)
