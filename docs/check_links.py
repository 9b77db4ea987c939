"""Check every internal link of the built HTML site: the file it points to exists and, when it
names an anchor, the page has an element with that id. External links (with a scheme) are
not followed: the documentation builds and is checked offline.

    python docs/check_links.py BUILD_DIR        (exit status 1 and a list when one is broken)
"""

import os
import sys
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) and not (
                tag == "link" and key == "href" and a.get("rel") in ("canonical",)
            ):
                self.links.append(a[key])


def check(root: str) -> list[str]:
    pages: dict[str, _Page] = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".html"):
                p = _Page()
                with open(os.path.join(d, f), encoding="utf-8") as fh:
                    p.feed(fh.read())
                pages[os.path.normpath(os.path.join(d, f))] = p
    broken = []
    for path, page in sorted(pages.items()):
        for link in page.links:
            u = urlsplit(link)
            if u.scheme or u.netloc or link.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = (
                os.path.normpath(os.path.join(os.path.dirname(path), unquote(u.path)))
                if u.path
                else path
            )
            if os.path.isdir(target):
                target = os.path.join(target, "index.html")
            where = f"{os.path.relpath(path, root)}: {link}"
            if not os.path.exists(target):
                broken.append(f"{where} (no file {os.path.relpath(target, root)})")
            elif (
                u.fragment
                and target.endswith(".html")
                and unquote(u.fragment) not in pages[target].ids
            ):
                broken.append(f"{where} (no anchor #{u.fragment})")
    return broken


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isfile(os.path.join(sys.argv[1], "index.html")):
        sys.exit("usage: python docs/check_links.py BUILD_DIR (a built HTML site)")
    bad = check(sys.argv[1])
    for b in bad:
        print(b)
    print(f"check_links: {len(bad)} broken internal link(s)")
    sys.exit(1 if bad else 0)
