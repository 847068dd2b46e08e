"""A real `vox web` process and a real headless Chromium driving it (docs/web.md).

Chromium and its driver are Debian's (`scripts/ensure-chromium.sh`): selenium is pointed
at /usr/bin/chromedriver and downloads nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import (
    ElementNotInteractableException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.kits.fleetproc import REPO, serving_vox

CHROMEDRIVER = "/usr/bin/chromedriver"
DOCS = REPO / "docs"
SHOTS = REPO / "build" / "screenshots"
# `VOX_DOC_SCREENSHOTS=1 make test` also writes them into docs/ for docs/web.md; otherwise a
# test run leaves the checkout as it found it.
DOC_SCREENSHOTS = os.environ.get("VOX_DOC_SCREENSHOTS") == "1"
T = TypeVar("T")


@dataclass
class WebConsole:
    """`vox web` as a child process: where it serves and what it printed."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    token_url: str | None = None
    tls: ssl.SSLContext | None = None  # what a client trusts when it serves HTTPS

    def log(self) -> str:
        """Return what the console printed."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """GET a path over plain HTTP; return (status, body) whatever the status."""
        return self.request("GET", path, headers=headers)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """Send one request; return (status, body) whatever the status."""
        request = urllib.request.Request(
            self.url + path.lstrip("/"), data=body, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.tls) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()


@contextlib.contextmanager
def run_web(config: Path, log_path: Path, *extra: str) -> Iterator[WebConsole]:
    """Start `vox web --listen 127.0.0.1:0` and learn its URL from its first lines."""

    def ready(log: str) -> str | None:
        found = re.search(r"serving (https?://\S+/) ", log)
        if found is None or ("--generate-token" in extra and "?token=" not in log):
            return None
        return found.group(1)

    args = ["web", "--config", str(config), "--listen", "127.0.0.1:0", *extra]
    with serving_vox(args, log_path, ready, "vox web") as (process, url):
        token = re.search(r"open (https?://\S+\?token=\S+)", log_path.read_text())
        yield WebConsole(
            process=process,
            url=url,
            log_path=log_path,
            token_url=None if token is None else token.group(1),
        )


@contextlib.contextmanager
def browser(width: int = 1280, height: int = 900) -> Iterator[WebDriver]:
    """Start a headless Chromium through Debian's chromedriver; quit it afterwards."""
    options = webdriver.ChromeOptions()
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: WebDriver, predicate: Callable[[WebDriver], T], timeout: float, what: str) -> T:
    """Wait (bounded) until predicate(driver) is truthy and return it; fail saying what."""
    try:
        return WebDriverWait(
            driver,
            timeout,
            poll_frequency=0.05,
            # The live pages redraw from each poll (console/static/*.js): an element found
            # a moment ago may be gone (stale) or, drawn anew, not yet laid out to type into
            # or click (not interactable). Both are tried again, as a person would.
            ignored_exceptions=[StaleElementReferenceException, ElementNotInteractableException],
        ).until(predicate)
    except TimeoutException:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None


def click_found(driver: WebDriver, find: Callable[[WebDriver], Any], what: str) -> None:
    """Find an element and click it, finding it again if the page redrew it in between.

    The live pages redraw their tables from each poll (console/static/app.js), so an
    element found a moment ago may be gone by the click: a person's click lands on the
    row drawn now, and so does this one (bounded, like `wait`).
    """

    def found_and_clicked(d: WebDriver) -> bool:
        element = find(d)
        if element is None:
            return False
        element.click()  # a stale element raises, and `wait` finds it again
        return True

    wait(driver, found_and_clicked, 15, what)


def row_of(driver: WebDriver, name: str) -> Any:
    """Return the tree row whose agent link reads name, or None."""
    for row in driver.find_elements(By.CSS_SELECTOR, "#tree tr.agent"):
        link = row.find_element(By.CSS_SELECTOR, "a.agent-link")
        if link.get_attribute("textContent") == name:  # .text is empty while hidden
            return row
    return None


def state_of(driver: WebDriver, name: str) -> str | None:
    """Return the state attribute (ACTIVE, INACTIVE, ...) of an agent's row, or None."""
    found: list[str | None] = driver.execute_script(
        """
        const rows = document.querySelectorAll('#tree tr.agent');
        for (const r of rows) {
          const name = r.querySelector('a.agent-link').textContent;
          if (name === arguments[0]) return [r.dataset.state];
        }
        return [null];
        """,
        name,
    )
    return found[0]


def screenshot(driver: WebDriver, name: str) -> Path:
    """Write a screenshot under build/screenshots (and docs/, when asked) and return its path."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    assert driver.save_screenshot(str(path)), f"no screenshot written to {path}"
    if DOC_SCREENSHOTS:
        shutil.copyfile(path, DOCS / name)
    return path


def self_signed(directory: Path) -> tuple[Path, Path, ssl.SSLContext]:
    """Write a self-signed certificate for 127.0.0.1 and its key; return them and a client
    context that trusts that certificate only (made with `cryptography`, nothing fetched)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vox web test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "web.crt", directory / "web.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path, ssl.create_default_context(cafile=str(cert_path))
