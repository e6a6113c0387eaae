"""The cluster-facts file: what doctor writes, plan / estimate / config read back."""

from __future__ import annotations

import json

import pytest

from zerofit.cluster_facts import (
    FORMAT,
    VERSION,
    ClusterFacts,
    load_cluster_facts,
    write_cluster_facts,
)
from zerofit.errors import ZerofitError


def test_written_facts_read_back_equal(tmp_path):
    facts = ClusterFacts(
        inter_node_gbps=94.5,
        intra_node_gbps=None,
        nodes=("node-a", {"host": "node-b", "interface": "ib0"}),
        measured={"method": "timed TCP transfer", "pairs": [["node-a", "node-b", 94.5]]},
    )
    path = write_cluster_facts(tmp_path / "facts.json", facts)
    assert load_cluster_facts(path) == facts
    data = json.loads(path.read_text())
    assert list(data)[:2] == ["format", "version"]
    assert (data["format"], data["version"]) == (FORMAT, VERSION)


def test_a_new_measurement_replaces_the_file_only_with_force(tmp_path):
    path = tmp_path / "facts.json"
    write_cluster_facts(path, ClusterFacts(inter_node_gbps=10))
    newer = ClusterFacts(inter_node_gbps=25, intra_node_gbps=32)
    with pytest.raises(ZerofitError, match=r"facts.json already exists \(fix: pass --force"):
        write_cluster_facts(path, newer)
    assert load_cluster_facts(path) == ClusterFacts(inter_node_gbps=10.0)
    write_cluster_facts(path, newer, force=True)
    assert load_cluster_facts(path) == ClusterFacts(inter_node_gbps=25.0, intra_node_gbps=32.0)
    assert sorted(item.name for item in tmp_path.iterdir()) == ["facts.json"]  # no temp file
    with pytest.raises(ZerofitError, match="is a directory"):
        write_cluster_facts(tmp_path, newer, force=True)


def test_writing_bad_facts_writes_nothing(tmp_path):
    with pytest.raises(ZerofitError, match="inter_node_gbps"):
        write_cluster_facts(tmp_path / "facts.json", ClusterFacts(inter_node_gbps=0))
    assert list(tmp_path.iterdir()) == []


GOOD = {"format": FORMAT, "version": VERSION, "inter_node_gbps": 100, "intra_node_gbps": None}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"format": "something-else"}, "cluster-facts format"),
        ({"version": 2}, "cluster-facts version"),
        ({"inter_node_gbps": None}, "cluster-facts inter_node_gbps"),
        ({"inter_node_gbps": "fast"}, "cluster-facts inter_node_gbps"),
        ({"inter_node_gbps": -5}, "cluster-facts inter_node_gbps"),
        ({"intra_node_gbps": 0}, "cluster-facts intra_node_gbps"),
        ({"nodes": "node-a"}, "cluster-facts nodes"),
        ({"measured": [1, 2]}, "cluster-facts measured"),
    ],
)
def test_a_bad_file_is_refused_in_one_line_naming_the_field(tmp_path, change, field):
    path = tmp_path / "facts.json"
    path.write_text(json.dumps({**GOOD, **change}))
    with pytest.raises(ZerofitError) as caught:
        load_cluster_facts(path)
    assert caught.value.field == field
    assert "\n" not in str(caught.value) and "(fix: " in str(caught.value)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_a_file_that_is_no_facts_object_is_refused(tmp_path, text):
    path = tmp_path / "facts.json"
    path.write_text(text)
    with pytest.raises(ZerofitError) as caught:
        load_cluster_facts(path)
    assert caught.value.field == "--cluster-facts"


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(ZerofitError, match="does not exist"):
        load_cluster_facts(tmp_path / "absent.json")
