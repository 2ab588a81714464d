"""tkc build --shard I/N + tkc merge give wheels byte-identical to a single-machine build."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import small_options
from tkc.build import ArchSummary, BuildOptions, build_shard, merge, plan, shard_of, units_of
from tkc.errors import UsageError

pytestmark = pytest.mark.slow


def test_shards_partition_the_work_deterministically(small_build: tuple[BuildOptions, list[ArchSummary]]) -> None:
    options, _ = small_build
    work = plan(options)
    for count in (1, 2, 3, 4, 7):
        shards = [shard_of(work, i, count) for i in range(1, count + 1)]
        flat = [(v.id, a.name) for s in shards for v, a in s]
        assert sorted(flat) == sorted((v.id, a.name) for v, a in work)  # each item exactly once
        units = units_of(work)
        assert max(map(len, shards)) - min(map(len, shards)) <= max(map(len, units))  # balanced
        for unit in units:  # whole units: no two shards lower and compile the same one
            assert sum(1 for s in shards if unit[0] in s) == 1 and all(w in s for s in shards if unit[0] in s
                                                                      for w in unit)
        assert shards == [shard_of(list(reversed(work)), i, count) for i in range(1, count + 1)]  # order-free
    with pytest.raises(UsageError, match="between 1 and 3"):
        shard_of(work, 4, 3)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_merge_of_all_shards_is_byte_identical(small_build: tuple[BuildOptions, list[ArchSummary]], tmp_path: Path,
                                               count: int) -> None:
    options, single = small_build
    shard_dirs = []
    for index in range(1, count + 1):
        # Each "runner" starts from a copy of the cache so the test spends no time in TileLang; what is
        # under test is the split, the export and the merge.
        runner = small_options(tmp_path / f"runner{index}")
        shutil.copytree(options.build_dir / "cache", runner.build_dir / "cache")
        out = tmp_path / f"shard-{index}-of-{count}"
        assert build_shard(runner, index, count, out) == len(shard_of(plan(runner), index, count))
        shard_dirs.append(out)
    merged = merge(small_options(tmp_path / "merged"), shard_dirs)
    assert [s.wheel.name for s in merged] == [s.wheel.name for s in single]
    for a, b in zip(merged, single):
        assert a.wheel.read_bytes() == b.wheel.read_bytes()


def test_merge_with_a_missing_shard_refuses_to_compile(small_build: tuple[BuildOptions, list[ArchSummary]],
                                                       tmp_path: Path) -> None:
    options, _ = small_build
    runner = small_options(tmp_path / "runner")
    shutil.copytree(options.build_dir / "cache", runner.build_dir / "cache")
    build_shard(runner, 1, 2, tmp_path / "s1")
    with pytest.raises(UsageError, match="in none of the merged shards"):
        merge(small_options(tmp_path / "merged"), [tmp_path / "s1"])
    assert not (tmp_path / "merged" / "dist").exists()
