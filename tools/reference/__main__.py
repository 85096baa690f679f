"""`python -m tools.reference` (make reference): write docs/reference/; `--check`: exit 1
naming each page that differs from what the code generates."""

from __future__ import annotations

import argparse
import sys

from tools.reference.pages import FOLDER, PAGES, ROOT
from tools.reference.rpcs import undocumented


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.reference", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args()
    stale = []
    for name, render in PAGES.items():
        path = FOLDER / name
        fresh = render()
        if path.exists() and path.read_text() == fresh:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(fresh)
            print(f"wrote {path.relative_to(ROOT)}")
    missing = undocumented()
    print(f"proto elements without a comment: {len(missing)}", file=sys.stderr)
    for name in missing:
        print(f"  {name}", file=sys.stderr)
    if args.check and stale:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run `make reference`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
