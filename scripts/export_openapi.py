"""Write the controller's OpenAPI 3 document to docs/openapi.json.

    python scripts/export_openapi.py [--out docs/openapi.json] [--check]

The document is exactly what a controller serves at `/openapi.json`, built
from `create_app` on a throwaway state dir (no hosts are contacted). Run it
whenever a route, model or summary changes; tests/controller/test_openapi.py
fails until the committed file is current. `--check` exits 1 when it is not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def document() -> dict:
    from fuse.controller.app import create_app
    from fuse.controller.service import Controller

    with tempfile.TemporaryDirectory(prefix="fuse-openapi-") as d:
        return create_app(Controller(Path(d))).openapi()


def render(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "openapi.json")
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when the file is stale")
    args = ap.parse_args()
    text = render(document())
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run python scripts/export_openapi.py", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    n = sum(len(ops) for ops in json.loads(text)["paths"].values())
    print(f"wrote {args.out} ({n} operations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
