"""``qualify.archive``'s commit record: the checkout's own, or ``FLARE_GIT_SHA`` for a copied tree."""

import subprocess

from qualify import archive


def test_git_sha_is_the_checkouts_commit_unless_the_tree_names_its_own(monkeypatch):
    monkeypatch.delenv("FLARE_GIT_SHA", raising=False)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=archive.REPO_ROOT, capture_output=True,
                          text=True)
    expected = head.stdout.strip() if head.returncode == 0 else "nogit"
    assert archive.git_sha() == expected
    monkeypatch.setenv("FLARE_GIT_SHA", " 214bc22\n")  # a copied tree's commit, as .tree-commit holds it
    assert archive.git_sha() == "214bc22"
    assert archive.git_dirty() is None  # the local .git cannot tell whether that commit's files changed
    assert archive.environment(["x"])["git_sha"] == "214bc22"
