"""`python -m serving [ARTIFACT_DIR] [--host H] [--port P] [--threads N]`: run the HTTP server.

Options not given come from LSAN_* environment variables (serving/settings.py), e.g.
`LSAN_ARTIFACT=artifacts/lsan python -m serving`. A missing or tampered artifact is one line on
stderr and exit status 1; invalid settings exit 2.
"""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from lsan.artifact import ArtifactError
from lsan.serving.app import run_server
from lsan.serving.settings import Settings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving", description=__doc__.splitlines()[0])
    ap.add_argument("artifact", nargs="?", help="artifact directory (default: $LSAN_ARTIFACT)")
    ap.add_argument("--host", help="interface to bind (default: $LSAN_HOST or 127.0.0.1)")
    ap.add_argument("--port", type=int, help="TCP port (default: $LSAN_PORT or 8000)")
    ap.add_argument("--threads", type=int, help="onnxruntime intra-op threads (default: 1)")
    given = {k: v for k, v in vars(ap.parse_args(argv)).items() if v is not None}
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        why = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        print(f"error: invalid settings: {why} (artifact: pass ARTIFACT_DIR or set LSAN_ARTIFACT)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        run_server(settings)
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
