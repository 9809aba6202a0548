"""Prefix cache over KV pages: a trie of full pages keyed by their token IDs.

A finished request gives the cache the full pages of its prompt up to its last recorded token
endpoint (message endpoints and hint cuts from the frontend): conversation prefixes, never generated
text.  A later request walks the trie page by page along its own prompt (keeping at least one token
to prefill, whose logits give the first sampled token) and consumes the matched pages read-only: its
own writes start at the first unmatched position, which is page-aligned, so shared pages are never
written.  Matched nodes are reference counted; unreferenced leaves are evicted least recently used
first when the pool needs pages.
"""

from __future__ import annotations

import itertools


class Node:
    __slots__ = ("page", "parent", "key", "children", "refs", "used")

    def __init__(self, page: int, parent: "Node | None", key: tuple):
        self.page, self.parent, self.key = page, parent, key
        self.children: dict[tuple, Node] = {}
        self.refs, self.used = 0, 0


class PrefixCache:
    def __init__(self, page_size: int):
        self.page_size = page_size
        self.root = Node(-1, None, ())
        self.nodes: set[Node] = set()
        self._clock = itertools.count(1)

    @property
    def pages(self) -> int:
        return len(self.nodes)

    def _key(self, ids: list[int], i: int) -> tuple:
        return tuple(ids[i * self.page_size:(i + 1) * self.page_size])

    def match(self, ids: list[int]) -> list[Node]:
        """The longest cached run of full pages along ``ids`` (leaving one token to prefill), referenced."""
        node, out = self.root, []
        for i in range((len(ids) - 1) // self.page_size):
            node = node.children.get(self._key(ids, i))
            if node is None:
                break
            out.append(node)
        now = next(self._clock)
        for n in out:
            n.refs += 1
            n.used = now
        return out

    def release(self, nodes: list[Node]) -> None:
        for n in nodes:
            n.refs -= 1

    def insert(self, ids: list[int], cut: int, pages: list[int]) -> set[int]:
        """Offer the full pages of ``ids[:cut]`` (``pages[i]`` holds page ``i``); returns the indices of
        the pages the cache adopted (the caller must not free those)."""
        node, adopted, now = self.root, set(), next(self._clock)
        for i in range(min(cut // self.page_size, len(pages))):
            key = self._key(ids, i)
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = Node(pages[i], node, key)
                self.nodes.add(child)
                adopted.add(i)
            child.used = now
            node = child
        return adopted

    def evict(self, n: int) -> list[int]:
        """Free up to ``n`` pages from unreferenced leaves, least recently used first."""
        freed: list[int] = []
        while len(freed) < n:
            leaves = [x for x in self.nodes if not x.children and x.refs == 0]
            if not leaves:
                break
            leaves.sort(key=lambda x: x.used)
            for leaf in leaves[:n - len(freed)]:
                del leaf.parent.children[leaf.key]
                self.nodes.discard(leaf)
                freed.append(leaf.page)
        return freed
