"""`Loader.load_state_dict` against forged states: every field checked with a ConfigError naming it, and a
state saved over another dataset of the same length refused by its fingerprint."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import make_image_folder

import ingest
from ingest.errors import ConfigError
from ingest.ops import Resize
from ingest.torch import dataset_fingerprint

KW = dict(batch_size=4, ops=[Resize((8, 8))], shuffle=True, seed=3)


@pytest.fixture
def folder(tmp_path):
    return make_image_folder(tmp_path / "train", {"cat": 7, "dog": 5, "emu": 9})


def half_epoch(loader):
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    del it
    return head, state


FORGED = [
    ("batch_size", "8", "int >= 1"), ("batch_size", 8.5, "int >= 1"), ("batch_size", [8], "int >= 1"),
    ("batch_size", float("nan"), "int >= 1"), ("batch_size", True, "int >= 1"), ("batch_size", 0, "int >= 1"),
    ("epoch", float("nan"), "int >= 0"), ("epoch", None, "int >= 0"), ("batch", 1.0, "int >= 0"),
    ("offset", -1, "int >= 0"), ("offset", 22, "past the 21 samples"), ("position", 10**30, "past the 21"),
    ("seed", "3", "int >= 0"), ("num_samples", 2**70, "another dataset order"), ("num_shards", 0, "int >= 1"),
    ("shard_id", 1, "< its `num_shards` 1"), ("shuffle", "yes", "a bool"), ("shuffle", 1, "a bool"),
    ("last_batch", 5, "one of drop, partial, pad"), ("last_batch", "keep", "one of"),
    ("fingerprint", "zz", "16 hex digits"), ("fingerprint", 7, "16 hex digits"),
    ("fingerprint", "0123456789abcdef", "not this dataset's"), ("batch", 7, "in \\[0, 6\\]"),
]


@pytest.mark.parametrize("key,bad,says", FORGED)
def test_every_field_is_checked_and_named(folder, key, bad, says):
    loader = ingest.Loader(folder, **KW)
    state = loader.state_dict()
    with pytest.raises(ConfigError, match=f"`{key}`.*{says}|{says}.*{key}"):
        loader.load_state_dict({**state, key: bad})
    assert loader.state_dict() == state   # a refused state changes nothing


def test_missing_unknown_and_non_dict_states(folder):
    loader = ingest.Loader(folder, **KW)
    state = loader.state_dict()
    with pytest.raises(ConfigError, match="missing batch_size"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "batch_size"})
    with pytest.raises(ConfigError, match="unknown field.*'extra'"):
        loader.load_state_dict({**state, "extra": 1})
    with pytest.raises(ConfigError, match="must be a dict"):
        loader.load_state_dict([("epoch", 0)])


def test_a_state_of_another_dataset_of_the_same_length_is_refused(folder, tmp_path):
    other = make_image_folder(tmp_path / "other", {"cat": 7, "dog": 5, "emu": 9}, seed=5)
    for path in sorted(other.rglob("*.jpg")):   # same classes and counts, other file names
        path.rename(path.with_name("x" + path.name))
    _, state = half_epoch(ingest.Loader(folder, **KW))
    resumed = ingest.Loader(other, **KW)
    assert len(resumed.source) == 21
    with pytest.raises(ConfigError, match="`fingerprint`.*not this dataset's"):
        resumed.load_state_dict(state)
    relabelled = make_image_folder(tmp_path / "relabelled", {"ant": 7, "bee": 5, "cow": 9})
    with pytest.raises(ConfigError, match="`fingerprint`"):
        ingest.Loader(relabelled, **KW).load_state_dict(state)


def test_resume_is_exact_from_a_moved_dataset_and_from_a_state_without_fingerprint(folder, tmp_path):
    full = [y.clone() for _, y in ingest.Loader(folder, **KW)]
    head, state = half_epoch(ingest.Loader(folder, **KW))
    moved = tmp_path / "elsewhere" / "train"
    shutil.copytree(folder, moved)
    assert dataset_fingerprint(ingest.Loader(moved, **KW).source) == state["fingerprint"]
    for source, saved in ((moved, state), (folder, {k: v for k, v in state.items() if k != "fingerprint"})):
        resumed = ingest.Loader(source, **KW)
        resumed.load_state_dict(saved)
        got = [y for _, y in head] + [y for _, y in resumed]
        assert len(got) == len(full) and all(torch.equal(a, b) for a, b in zip(got, full))
