"""Where the package's C ABI libraries (libdrafthead_lane.so, libdrafthead_grpc.so) are found."""
import os
from pathlib import Path
from typing import Optional


def find(name: str, env_var: str) -> Optional[Path]:
    """The first of: $env_var when set, the package's own copy (_native/, the wheel's), a build
    tree's (a source checkout: <repo>/client/python/drafthead_client -> <repo>/build*/client)."""
    here = Path(__file__).resolve().parent
    candidates = [here / "_native" / name]
    if os.environ.get(env_var):
        candidates.insert(0, Path(os.environ[env_var]))
    candidates += sorted(here.parent.parent.parent.glob(f"build*/client/{name}"))
    return next((p for p in candidates if p.is_file()), None)
