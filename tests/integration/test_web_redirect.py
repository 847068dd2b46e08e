"""The token URL's redirect stays on the console (docs/security.md, "Costs ...", redirect).

`GET //evil.example/x?token=T` answered 303 to `//evil.example/x`: a browser reads a
path that starts with two slashes (or a slash and a backslash) as another site.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.kits.fleetproc import FleetProcesses, fleet_text, run_fleet
from tests.kits.webkit import WebConsole, run_web


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WebConsole, str]]:
    root = tmp_path_factory.mktemp("redirect")
    procs: FleetProcesses
    with (
        run_fleet(root / "fleet", fleet_text({"root": None}), start=False) as procs,
        run_web(procs.operator_config, root / "web.log", "--generate-token") as console,
    ):
        assert console.token_url is not None
        yield console, console.token_url.split("?token=")[1]


def redirect_of(console: WebConsole, target: str) -> tuple[int, str | None]:
    """Send one raw GET (no client-side path cleaning); return (status, Location)."""
    where = urlsplit(console.url)
    assert where.hostname is not None
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    try:
        conn.request("GET", target)
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("location")
    finally:
        conn.close()


@pytest.mark.parametrize(
    "path",
    ["//evil.example/x", "///evil.example/x", "/\\evil.example/x", "/\\/evil.example/x"],
)
def test_the_token_redirect_never_leaves_the_console(
    web: tuple[WebConsole, str], path: str
) -> None:
    console, token = web
    status, location = redirect_of(console, f"{path}?token={token}")
    assert status == 303
    assert location is not None
    assert location.startswith("/")
    assert not location.startswith(("//", "/\\"))
    assert "evil.example" not in urlsplit(location).netloc


def test_a_local_path_keeps_its_redirect(web: tuple[WebConsole, str]) -> None:
    console, token = web
    assert redirect_of(console, f"/?token={token}") == (303, "/")
    assert redirect_of(console, f"/api/snapshot?token={token}") == (303, "/api/snapshot")
