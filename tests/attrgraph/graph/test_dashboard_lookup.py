"""The one dashboards lookup of the viewer and the export: the order (given, named by the graph,
found by fingerprint), the fingerprint match of a graph built from Python on the bundled sets, the
refusal of files that do not fit, each site on its own, unreadable files, the per-version cache."""

import os
import shutil

import pytest

from attrgraph.errors import GraphFileError
from attrgraph.graph.dashboard_lookup import (
    SITES,
    bundled_fingerprint,
    find_dashboards,
    find_site_dashboards,
    fits,
    load_cached,
    site_meta,
)
from tests.attrgraph.ag_helpers import bundled_attention_graph

pytestmark = pytest.mark.bundled("default", "default-plt", "default-clt", "default-attn-sae")


def board(name):
    from transcoders.paths import BUNDLED

    return BUNDLED[name] / "dashboards.h5"


@pytest.fixture(scope="module")
def graph():
    return bundled_attention_graph()


def test_given_then_named_then_fingerprint(tmp_path):
    plt = bundled_fingerprint("default-plt")
    meta = {"n_layers": 4, "transcoders": "default-clt", "transcoder_fingerprint": plt}
    given = find_dashboards(meta, "mlp", "default-plt")  # 1. given wins over the named set
    assert given.dashboards.path == board("default-plt") and given.given
    assert find_dashboards(meta, "mlp", board("default-plt").parent).dashboards.path == board("default-plt")
    named = find_dashboards({k: v for k, v in meta.items() if k != "transcoder_fingerprint"})  # 2. named
    assert named.dashboards.path == board("default-clt") and not named.given
    assert named.reason == f"named by the graph, {board('default-clt')}"
    stale = find_dashboards(meta)  # named, but its file records another set's fingerprint: passed over
    assert stale.dashboards is None and stale.reason == (
        f"{board('default-clt')} was computed for another set (fingerprint {bundled_fingerprint('default-clt')}; "
        f"the graph's transcoder set is {plt}: retrained, or loaded in another dtype)"
    )
    meta["transcoders"] = str(tmp_path)  # named, but no dashboards there: 3. the fingerprint
    found = find_dashboards(meta)
    assert found.dashboards.path == board("default-plt") and found.reason.startswith(
        "found by its fingerprint"
    )
    meta["transcoder_fingerprint"] = "0123456789abcdef"  # nothing left: each step says why
    none = find_dashboards(meta)
    assert none.dashboards is None and none.reason == (
        f"no dashboards for transcoder set {str(tmp_path)!r} ({tmp_path / 'dashboards.h5'} is missing); "
        "no bundled set has its fingerprint"
    )
    assert find_dashboards({}).reason == "the graph names no transcoder set"
    with pytest.raises(GraphFileError, match="no dashboards file at .*dashboards.h5 does not exist"):
        find_dashboards(meta, "mlp", tmp_path)  # given but absent: an error, not a fallback


def test_a_graph_built_from_python_finds_both_sets_by_fingerprint(graph):
    meta = graph.meta
    assert "transcoders" not in meta and "attn_transcoders" not in meta
    assert meta["attn_transcoder_fingerprint"] == bundled_fingerprint("default-attn-sae")
    found = find_site_dashboards(meta)
    assert list(found) == list(SITES)
    assert found["mlp"].dashboards.path == board("default-plt")
    assert found["attn"].dashboards.path == board("default-attn-sae")
    assert found["attn"].dashboards.d_sae == meta["attn_transcoder_d_sae"] == 512


def test_files_that_do_not_fit_are_refused_with_the_reason(graph):
    wrong = dict(graph.meta, n_layers=7)
    found = find_dashboards(wrong)
    assert found.dashboards is None and found.reason == f"{board('default-plt')} covers 4 layers, the graph 7"
    narrow = dict(graph.meta, transcoders="default-attn-sae")  # a 512-wide file for the 1024-wide set
    assert find_dashboards(narrow).reason == (
        f"{board('default-attn-sae')} has 512 features per layer, the graph's transcoder set 1024"
    )
    given = find_dashboards(graph.meta, "attn", "default-plt")  # given, but of the MLP set's width
    assert given.dashboards is None and given.given and "the graph's attention set 512" in given.reason
    loaded = load_cached(board("default-clt"))
    assert fits(loaded, graph.meta) is None and fits(loaded, graph.meta, "attn") is not None
    assert find_dashboards(graph.meta, "mlp", loaded).dashboards is loaded


def test_each_site_reads_its_own_provenance(graph):
    assert site_meta(graph.meta, "attn") == {
        "transcoder_fingerprint": graph.meta["attn_transcoder_fingerprint"],
        "transcoder_d_sae": 512,
        "n_layers": 4,
    }
    named = dict(graph.meta, transcoders="default-clt", attn_transcoders="default-attn-sae")
    found = find_site_dashboards(named, {"mlp": "default-plt"})
    assert found["mlp"].given and found["mlp"].dashboards.path == board("default-plt")
    assert found["attn"].reason == f"named by the graph, {board('default-attn-sae')}"
    mlp_only = {k: v for k, v in graph.meta.items() if not k.startswith("attn_")}
    assert find_dashboards(mlp_only, "attn").reason == "the graph names no attention set"
    assert find_dashboards(mlp_only).dashboards is not None
    with pytest.raises(ValueError, match="site 'resid'"):
        find_dashboards(graph.meta, "resid")
    with pytest.raises(ValueError, match="resid"):
        find_site_dashboards(graph.meta, {"resid": "default-plt"})


def test_unreadable_files_and_the_per_version_cache(tmp_path):
    from transcoders.errors import DashboardFileError

    bad = tmp_path / "set"
    bad.mkdir()
    (bad / "dashboards.h5").write_text("not hdf5")
    found = find_dashboards({"transcoders": str(bad)})  # found but unreadable: passed over, said why
    assert found.dashboards is None and "not a readable HDF5 file" in found.reason
    with pytest.raises(DashboardFileError):  # given: an error
        find_dashboards({}, "mlp", bad)
    copy = tmp_path / "copy.h5"
    shutil.copyfile(board("default-plt"), copy)
    first = load_cached(copy)
    assert load_cached(copy) is first  # read once per version
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new version: read again
    assert load_cached(copy) is not first
