"""Host-side pieces of the runtime without a model: the prefix cache trie, the page pool, the CLI's start
failures."""

from __future__ import annotations

from helios.cli import main
from helios.runtime.engine import PagePool
from helios.runtime.prefix_cache import PrefixCache

PS = 4


def test_match_keeps_one_token_to_prefill_and_stops_at_the_first_difference():
    cache = PrefixCache(PS)
    ids = list(range(12))
    assert cache.insert(ids, 12, [7, 8, 9]) == {0, 1, 2}
    assert [n.page for n in cache.match(ids)] == [7, 8]  # 12 tokens: the last page stays to prefill
    assert [n.page for n in cache.match(ids + [99])] == [7, 8, 9]
    assert [n.page for n in cache.match(ids[:4] + [0] * 9)] == [7]


def test_insert_stops_at_the_cut_and_does_not_adopt_pages_it_already_holds():
    cache = PrefixCache(PS)
    ids = list(range(16))
    assert cache.insert(ids, 9, [1, 2, 3, 4]) == {0, 1}  # cut 9: two full pages
    assert cache.insert(ids, 16, [5, 6, 7, 8]) == {2, 3}  # pages 0, 1 already cached (as 1, 2)
    assert cache.pages == 4


def test_referenced_pages_are_never_evicted_and_leaves_go_least_recently_used_first():
    cache = PrefixCache(PS)
    a, b = list(range(8)), [100 + i for i in range(8)]
    cache.insert(a, 8, [1, 2])
    cache.insert(b, 8, [3, 4])
    held = cache.match(b + [0])  # b's pages referenced and most recently used
    assert cache.evict(1) == [2]  # a's leaf first
    assert cache.evict(10) == [1]  # then a's root page; b is referenced
    cache.release(held)
    assert sorted(cache.evict(10)) == [3, 4] and cache.pages == 0


def test_page_pool_never_hands_out_more_than_it_has():
    pool = PagePool(3)
    got = pool.allocate(2)
    assert pool.allocate(2) is None and pool.free == 1
    pool.release(got)
    assert sorted(pool.allocate(3)) == [0, 1, 2] and pool.used == 3


def test_flare_run_on_a_bad_core_fails_at_start_with_a_clear_message(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing")]) == 1
    assert "no such core folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["run", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert "cannot serve this core" in err and "core.pb" in err
