"""A full disk while attrgraph writes an export or a validation report (bad input round 7; round 2
asked it of graph files): one line naming the folder, the files there before unchanged, no
temporary left. Before, each was an `OSError: [Errno 28]` traceback, a validation report was left
half new (its JSON replaced, its plots old or missing), and an export's feature files were written
in place. On a real 3 MB tmpfs (`small_tmpfs`, root only), filled to a few kB before the write."""

import os

import pytest

from attrgraph.errors import ExportError, OptionError
from attrgraph.graph.neuronpedia import export_json
from tests.attrgraph.graph.test_neuronpedia import layered_graph


def fill(folder, leave: int) -> None:
    st = os.statvfs(folder)
    (folder / "filler").write_bytes(b"\0" * max(st.f_bavail * st.f_frsize - leave, 0))


def files(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.filterwarnings("ignore::attrgraph.errors.ExportWarning")  # its set has no dashboards
def test_an_export_on_a_full_disk_is_one_line_and_keeps_the_old_export(small_tmpfs):
    out = small_tmpfs / "site"
    export_json(layered_graph(0), out, slug="first")
    before = files(out)
    fill(small_tmpfs, 2_048)
    with pytest.raises(ExportError, match=r"^cannot write .*: no space left on its disk") as e:
        export_json(layered_graph(1, n_pos=9, d_sae=400), out, slug="second")
    assert "\n" not in str(e.value)
    assert files(out) == before  # the first export whole, nothing of the second, no temporary


def test_a_validation_report_on_a_full_disk_keeps_the_old_report(small_tmpfs):
    from attrgraph.analysis.validate import ValidateConfig, validate_graph
    from attrgraph.analysis.validation_report import write_report
    from attrgraph.engine.attribute import attribute
    from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders

    model = tiny_model("gpt2")
    tc = tiny_transcoders(model)
    graph = attribute(model, tc, [3, 17, 5, 9, 17, 5, 22, 8])
    res = validate_graph(model, tc, graph, ValidateConfig(max_features=8, n_perturbations=2, windows=(0,)))
    out = small_tmpfs / "report"
    write_report([res], ["a"], out)
    before = files(out)
    fill(small_tmpfs, 30_000)  # room for the JSON, not for the plots
    with pytest.raises(OptionError, match=rf"^cannot write {out}: no space left on its disk"):
        write_report([res, res], ["a", "b"], out)
    assert files(out) == before


def test_a_circuit_tracer_graph_on_a_full_disk_is_one_line_and_keeps_the_old_file(small_tmpfs):
    from transformer_lens import HookedTransformerConfig

    from attrgraph.graph.circuit_tracer_pt import save_pt
    from tests.attrgraph.graph.test_neuronpedia import D_VOCAB, N_LAYERS

    cfg = HookedTransformerConfig(
        n_layers=N_LAYERS, d_model=4, n_ctx=8, d_head=2, d_vocab=D_VOCAB, act_fn="relu"
    )
    path = small_tmpfs / "g.pt"
    save_pt(layered_graph(0), path, cfg)
    before = files(small_tmpfs)
    fill(small_tmpfs, 2_048)
    with pytest.raises(ExportError, match=rf"^cannot write {path}: no space left on its disk") as e:
        save_pt(layered_graph(1, n_pos=9, d_sae=400), path, cfg)
    assert "\n" not in str(e.value)
    assert {k: v for k, v in files(small_tmpfs).items() if k != "filler"} == {
        k: v for k, v in before.items() if k != "filler"
    }  # the old file whole, no temporary
