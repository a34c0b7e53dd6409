"""Issue 43, item 12: the built manual asks nothing of the internet.

mkdocs-material loads Roboto from Google's font servers on every page unless ``theme.font`` is
false: on a machine without internet that is a stall, anywhere else a request to a third party
the reader did not ask for. The manual is built here (as ``make docs`` does) and every resource
a page loads by itself (stylesheets, scripts, images, fonts, CSS imports) must come from the site;
links a reader may follow are not loads and are not counted.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(300)
#: What a page fetches by itself: a stylesheet, icon or preload link, a script, an image or frame.
LOADS = re.compile(
    r"<(?:link[^>]*\bhref|script[^>]*\bsrc|img[^>]*\bsrc|iframe[^>]*\bsrc|source[^>]*\bsrc)"
    r"\s*=\s*[\"']?((?:https?:)?//[^\"' >]+)",
    re.I,
)
CSS_LOADS = re.compile(r"(?:@import\s+|url\()\s*[\"']?((?:https?:)?//[^\"') ]+)", re.I)


def test_the_built_manual_loads_nothing_from_elsewhere(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the manual needs the docs extra (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="the manual needs mkdocs-material (the docs extra)")
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                           cwd=REPO, capture_output=True, text=True, timeout=240,
                           env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    remote: dict[str, list[str]] = {}
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    for path in [*pages, *site.rglob("*.css")]:
        text = path.read_text(errors="replace")
        found = (CSS_LOADS if path.suffix == ".css" else LOADS).findall(text)
        if path.suffix == ".html":
            found += CSS_LOADS.findall(" ".join(re.findall(r"<style[^>]*>(.*?)</style>", text, re.S)))
        if found:
            remote[str(path.relative_to(site))] = found
    assert remote == {}, remote
    assert not any("//fonts.googleapis.com/css" in p.read_text(errors="replace") for p in pages)
