"""The embedded default: a tokenizer and chat template the project builds itself.

``materialize_default()`` returns a folder holding ``tokenizer.json`` (a byte-level BPE trained
on the project's generated corpus, see :mod:`.corpus` and :mod:`.tokenizer`) and
``tokenizer_config.json`` (special-token strings, ``model_max_length`` and ``chat_template`` =
the unannotated ``chat_template.jinja`` of this package).  Nothing is downloaded or copied from
upstream, so the frontend, ``flare qualify`` and ``flare run`` work without a hub cache.

The folder is built once and cached under ``$FLARE_CACHE/embedded/<key>/`` (default
``~/.cache/flare/embedded/<key>/``), where ``<key>`` hashes everything the build reads: this
package's sources, the template, the build parameters and the ``tokenizers`` version.  A build
writes into a temporary sibling folder and renames it into place, so readers never see a
partial folder; concurrent builders produce identical bytes and the first rename wins.  A
cached folder is checked against its manifest (``flare-embedded.json``: SHA-256 of each file)
and rebuilt when it does not match.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from . import corpus as _corpus
from . import tokenizer as _tokenizer

PACKAGE_DIR = Path(__file__).resolve().parent
TEMPLATE_PATH = PACKAGE_DIR / "chat_template.jinja"
#: Repository-relative path of the template (the patch asset's ``embedded`` source).
TEMPLATE_REPO_PATH = "ignition/embedded/chat_template.jinja"
#: Bump to invalidate cached builds when the output format changes without a source change.
BUILD_FORMAT = 1
MODEL_MAX_LENGTH = 8192
MANIFEST = "flare-embedded.json"
FILES = ("tokenizer.json", "tokenizer_config.json")
_KEY_SOURCES = ("__init__.py", "corpus.py", "tokenizer.py", "chat_template.jinja")


def chat_template() -> str:
    """The unannotated chat template text."""
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def build_key() -> str:
    """Hash of every input of the build (cache folder name)."""
    import tokenizers

    h = hashlib.sha256()
    h.update(f"flare-embedded/{BUILD_FORMAT}/tokenizers={tokenizers.__version__}\n".encode())
    for name in _KEY_SOURCES:
        data = (PACKAGE_DIR / name).read_bytes()
        h.update(f"{name}:{len(data)}\n".encode())
        h.update(data)
    return h.hexdigest()[:16]


def tokenizer_config(template: str | None = None) -> dict:
    eot, im_end = _tokenizer.SPECIAL_TOKENS[0], _tokenizer.SPECIAL_TOKENS[2]
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eot,
        "eos_token": im_end,
        "pad_token": eot,
        "unk_token": eot,
        "additional_special_tokens": list(_tokenizer.SPECIAL_TOKENS[1:]),
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": chat_template() if template is None else template,
    }


def build_files(documents: list[str] | None = None) -> dict[str, bytes]:
    """The bytes of every file of the folder (``documents`` replaces the default corpus)."""
    docs = _corpus.documents() if documents is None else documents
    tok = _tokenizer.train(docs)
    config = json.dumps(tokenizer_config(), ensure_ascii=False, indent=2) + "\n"
    return {"tokenizer.json": _tokenizer.serialize(tok), "tokenizer_config.json": config.encode("utf-8")}


def write_folder(folder: Path, files: dict[str, bytes], key: str) -> None:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    manifest = {"build_key": key, "files": {n: hashlib.sha256(d).hexdigest() for n, d in sorted(files.items())}}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def verify_folder(folder: Path) -> bool:
    """Whether ``folder`` holds every file and each matches its manifest hash."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        for name in FILES:
            if hashlib.sha256((folder / name).read_bytes()).hexdigest() != manifest["files"][name]:
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def default_root() -> Path:
    base = os.environ.get("FLARE_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "flare") / "embedded"


def materialize_default(root: str | os.PathLike | None = None) -> Path:
    """The folder with the embedded default's ``tokenizer.json`` and ``tokenizer_config.json``.

    ``root`` is the folder holding cached builds (default :func:`default_root`); the result is
    ``root/<build key>``.
    """
    root = Path(root) if root is not None else default_root()
    key = build_key()
    final = root / key

    def build(tmp: Path) -> Path:
        staging = tmp / key
        write_folder(staging, build_files(), key)
        return staging

    from ignition.cached_build import build_cached

    return build_cached(final, build, verify_folder)

