"""Copy what an H200 call needs of hub models into ``.hub/`` (git-ignored; name ``.hub/models--ORG--NAME`` in the
device call's ``carry``): each model's snapshot files that ``ignition synth-checkpoint`` and the export read
(``ignition.checkpoints.synth.HUB_FILES``, links resolved), without the slow tokenizer's ``vocab.json`` and
``merges.txt`` -- ``tokenizer.json`` holds the same vocabulary and merges, and every reader here takes it (4.4 MB of a
Qwen3 model's 15.9 MB: the working tree and the carried paths share one 64 MiB budget per call).

    python3 scripts/device_hub.py Qwen/Qwen3-8B Qwen/Qwen3-0.6B [--hub-cache DIR] [--out .hub]

``--hub-cache``: default ``$HF_HUB_CACHE``, else the materialized ``../shared/hub`` (``ignition.hub``).  Prints each model's
folder and size; fails naming the model when the cache lacks its snapshot or its ``config.json``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Not carried: the slow tokenizer's files (``tokenizer.json`` has their content).
SKIPPED = ("vocab.json", "merges.txt")


def hub_cache(given: str | None) -> Path:
    """The hub cache to read: ``given``, else :func:`ignition.hub.default_hub_cache` (the environment's, else the
    materialized ``../shared/hub``)."""
    from ignition.hub import default_hub_cache

    cache = given or default_hub_cache()
    if not cache:
        raise SystemExit("device_hub: no --hub-cache, no $HF_HUB_CACHE and no ../shared/hub to materialize")
    return Path(cache)


def copy_model(repo_id: str, cache: Path, out: Path) -> int:
    """Copy ``repo_id``'s snapshot files (:data:`ignition.checkpoints.synth.HUB_FILES` and ``config.json``, minus
    :data:`SKIPPED`) from ``cache`` to ``out`` in the hub layout (``models--ORG--NAME/snapshots/REV``,
    ``refs/main``); returns the bytes copied."""
    from ignition.checkpoints.synth import HUB_FILES

    folder = "models--" + repo_id.replace("/", "--")
    src = cache / folder
    ref = src / "refs" / "main"
    if not ref.is_file():
        raise SystemExit(f"device_hub: {repo_id}: no {ref} in the hub cache {cache}")
    rev = ref.read_text().strip()
    snap = src / "snapshots" / rev
    if not (snap / "config.json").is_file():
        raise SystemExit(f"device_hub: {repo_id}: the snapshot {snap} has no config.json")
    dst = out / folder
    shutil.rmtree(dst, ignore_errors=True)
    (dst / "refs").mkdir(parents=True)
    (dst / "refs" / "main").write_text(rev)
    (dst / "snapshots" / rev).mkdir(parents=True)
    total = 0
    for name in ("config.json", *HUB_FILES):
        if name in SKIPPED or not (snap / name).is_file():
            continue
        shutil.copyfile(snap / name, dst / "snapshots" / rev / name)  # follows the cache's links to its blobs
        total += (snap / name).stat().st_size
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="hub repository ids, e.g. Qwen/Qwen3-8B")
    ap.add_argument("--hub-cache", default=None)
    ap.add_argument("--out", type=Path, default=ROOT / ".hub")
    args = ap.parse_args(argv)
    cache = hub_cache(args.hub_cache)
    for repo_id in args.models:
        size = copy_model(repo_id, cache, args.out)
        print(f"{args.out / ('models--' + repo_id.replace('/', '--'))}: {size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
