"""Notebook 09: tensor parallel computes what the dense block does, with the all-reduces the plan
implies; a 2-D (dp, tp) mesh trains like one process or says why it did not run."""

from __future__ import annotations

STEM = "09_tensor_parallel"
TOLERANCE = 1e-5  # float rounding of a different summation order


def test_tensor_parallel_equals_dense(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert 0 <= m["max_diff_tp_vs_dense"] <= TOLERANCE
    assert 0 <= m["max_grad_diff_tp_vs_dense"] <= TOLERANCE
    if m["world_size"] > 1:  # one all-reduce at the end of the block, one in backward
        assert m["tp_allreduces"] == {"forward": 1, "backward": 1}


def test_mesh_2d_trained_or_skipped_with_reason(notebook_record):
    record = notebook_record(STEM)
    trained = record["metrics"]["mesh_2d_trained"]
    skips = [s for s in record["skipped"] if s["what"].startswith("2-D mesh")]
    if trained is None:
        assert skips and skips[0]["why"], "a 2-D mesh that did not run must say why"
    else:
        assert trained is True
        assert not skips
        assert record["metrics"]["max_loss_diff_2d_vs_single"] <= 1e-4


def test_the_exercises_change_the_plan_and_the_inputs_and_pass(notebook_record):
    """09.1 splits only w1 (still dense-equal, w2 whole), 09.2 feeds each rank its own input."""
    assert notebook_record(STEM)["metrics"]["exercises"] == {"09.1": True, "09.2": True}
