"""MathJax served by the book itself, so that formulas render without network.

Sphinx's default ``mathjax_path`` loads MathJax 3 from a CDN: a reader offline (or behind a
firewall) sees raw TeX. This extension vendors MathJax **at build time** from a pinned npm
package instead. When an HTML builder starts it

1. downloads ``mathjax-<MATHJAX_VERSION>.tgz`` from the npm registry (with Python: CI has
   no Node) into ``_vendor/``, unless a copy is there already;
2. checks the tarball against the ``dist.integrity`` (sha512) that the registry publishes
   for that version, pinned below, and fails the build with a clear message when the
   download or the check fails;
3. extracts what the book needs into ``_vendor/mathjax-<version>/static/mathjax/`` (once;
   later builds reuse it): the component Sphinx loads by default, ``tex-mml-chtml.js``
   (TeX input with amsmath, CommonHTML output), the TeX extensions it autoloads on demand
   (``\\boldsymbol``, ``\\cancel``, ...) and the woff-v2 fonts that CommonHTML output
   loads; MathJax finds them relative to its own script, so nothing else is fetched;
4. adds that folder to ``html_static_path`` and points ``mathjax_path`` at it, so the page
   loads ``_static/mathjax/tex-mml-chtml.js``.

Everything else about math is unchanged: myst-parser still sets ``mathjax3_config``
(``processHtmlClass``) for dollarmath and amsmath. ``tests/test_browser_math.py`` opens
built pages in headless Chromium with the network off and checks that they are typeset.

To build without network, put the tarball (from :data:`MATHJAX_URL`) into ``_vendor/``
by hand; its hash is checked all the same.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from sphinx.errors import ExtensionError
from sphinx.util import logging

logger = logging.getLogger(__name__)

MATHJAX_VERSION = "3.2.2"
# `dist.integrity` of mathjax@3.2.2 in https://registry.npmjs.org/mathjax (npm's SRI form)
MATHJAX_INTEGRITY = (
    "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/"
    "O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
)
MATHJAX_URL = f"https://registry.npmjs.org/mathjax/-/mathjax-{MATHJAX_VERSION}.tgz"
ENTRY = "tex-mml-chtml.js"  # the component Sphinx's default CDN URL names
# what is extracted from the tarball (paths under its `package/`), files or folders ending in /
PACKAGE_PATHS = (
    "LICENSE",
    f"es5/{ENTRY}",
    "es5/input/tex/extensions/",
    "es5/output/chtml/fonts/woff-v2/",
)
VENDOR_DIR = "_vendor"  # under the book's source folder, git-ignored
STATIC_NAME = "mathjax"  # the folder in _static/ of the built book


def _integrity(path: Path) -> str:
    digest = hashlib.sha512(path.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode("ascii")


def _fail(message: str) -> ExtensionError:
    return ExtensionError(f"mathjax_offline: {message}")


def _download(tarball: Path) -> None:
    logger.info("mathjax_offline: downloading %s", MATHJAX_URL)
    partial = tarball.with_name(f"{tarball.name}.{os.getpid()}.part")
    try:
        with urllib.request.urlopen(MATHJAX_URL, timeout=60) as response:
            partial.write_bytes(response.read())
    except (urllib.error.URLError, OSError) as error:
        partial.unlink(missing_ok=True)
        raise _fail(
            f"could not download MathJax {MATHJAX_VERSION} from {MATHJAX_URL} ({error}). "
            f"The book serves MathJax itself so that math renders offline. Build once with "
            f"network access to the npm registry, or download that file by hand to {tarball} "
            f"(its sha512 is checked: {MATHJAX_INTEGRITY})."
        ) from error
    os.replace(partial, tarball)


def _verified_tarball(vendor: Path) -> Path:
    tarball = vendor / f"mathjax-{MATHJAX_VERSION}.tgz"
    if tarball.exists() and _integrity(tarball) != MATHJAX_INTEGRITY:
        # (not a warning: -W would fail the build for a cache that mends itself)
        logger.info("mathjax_offline: %s does not match its pinned hash; downloading it", tarball)
        tarball.unlink()
    if not tarball.exists():
        _download(tarball)
        found = _integrity(tarball)
        if found != MATHJAX_INTEGRITY:
            tarball.unlink()
            raise _fail(
                f"{MATHJAX_URL} has integrity {found}, not the pinned {MATHJAX_INTEGRITY} "
                f"(book/_ext/mathjax_offline.py). Nothing was extracted. If the registry "
                f"really changed, check the new tarball and update the pin."
            )
    return tarball


def _wanted(name: str) -> str | None:
    """The path under the static folder of a tarball member, or None to skip it."""
    if not name.startswith("package/") or ".." in name.split("/"):
        return None
    inner = name.removeprefix("package/")
    for wanted in PACKAGE_PATHS:
        if inner == wanted or (wanted.endswith("/") and inner.startswith(wanted)):
            return inner.removeprefix("es5/")
    return None


def ensure_mathjax(srcdir: str | os.PathLike[str]) -> Path:
    """Vendor MathJax under ``srcdir/_vendor`` (once) and return the folder for html_static_path.

    The returned folder holds ``mathjax/`` (:data:`STATIC_NAME`), MathJax's root: the entry
    script :data:`ENTRY`, ``input/tex/extensions/`` and ``output/chtml/fonts/woff-v2/``.

    Raises:
        sphinx.errors.ExtensionError: the download failed or its hash is not the pinned one.
    """
    vendor = Path(srcdir) / VENDOR_DIR
    target = vendor / f"mathjax-{MATHJAX_VERSION}"
    stamp = target / "complete"  # written last: its content is the tarball's integrity
    static = target / "static"
    if stamp.exists() and stamp.read_text(encoding="ascii") == MATHJAX_INTEGRITY:
        return static
    vendor.mkdir(parents=True, exist_ok=True)
    tarball = _verified_tarball(vendor)
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=vendor))
    try:
        root = staging / "static" / STATIC_NAME
        with tarfile.open(tarball, "r:gz") as archive:
            for member in archive.getmembers():
                inner = _wanted(member.name)
                if inner is None or not member.isfile():
                    continue
                path = root / inner
                path.parent.mkdir(parents=True, exist_ok=True)
                with archive.extractfile(member) as source, path.open("wb") as sink:
                    shutil.copyfileobj(source, sink)
        if not (root / ENTRY).is_file():
            raise _fail(f"{tarball} has no package/es5/{ENTRY}")
        (staging / "complete").write_text(MATHJAX_INTEGRITY, encoding="ascii")
        shutil.rmtree(target, ignore_errors=True)  # an incomplete or older extraction
        try:
            os.replace(staging, target)
        except OSError:  # another build finished the same extraction first
            if not (stamp.exists() and stamp.read_text(encoding="ascii") == MATHJAX_INTEGRITY):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("mathjax_offline: MathJax %s vendored in %s", MATHJAX_VERSION, static)
    return static


def _use_vendored_mathjax(app) -> None:
    if app.builder.format != "html":
        return
    static = ensure_mathjax(app.srcdir)
    # Set here, not in _config.yml: Sphinx drops an html_static_path entry that does not
    # exist yet when the configuration is read, and the first build has not vendored it.
    app.config.html_static_path = [*app.config.html_static_path, str(static)]
    app.config.mathjax_path = f"{STATIC_NAME}/{ENTRY}"  # relative: under _static/


def setup(app):
    app.connect("builder-inited", _use_vendored_mathjax)
    return {"version": MATHJAX_VERSION, "parallel_read_safe": True, "parallel_write_safe": True}
