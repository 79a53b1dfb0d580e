"""Notebook 09: tensor parallel computes what the dense block does, with the all-reduces the plan
implies; on the GPT, TP and TP + SP equal the dense model with the collectives their plans
predict; a 2-D (dp, tp) mesh trains the GPT like one process or says why it did not run."""

from __future__ import annotations

import math

import predictions

STEM = "09_tensor_parallel"
TOLERANCE = 1e-5  # float rounding of a different summation order


def test_tensor_parallel_equals_dense(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert 0 <= m["max_diff_tp_vs_dense"] <= TOLERANCE
    assert 0 <= m["max_grad_diff_tp_vs_dense"] <= TOLERANCE
    if m["world_size"] > 1:  # one all-reduce at the end of the block, one in backward
        assert m["tp_allreduces"] == {"forward": 1, "backward": 1}


def test_the_gpt_learns_in_one_process(notebook_record):
    """The loss of the character model falls below a uniform guess over ~100 characters."""
    loss = notebook_record(STEM)["metrics"]["transformer_final_loss"]
    assert math.isfinite(loss) and loss < math.log(90)


def test_tp_and_sp_on_the_gpt_equal_dense_with_the_predicted_collectives(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert 0 <= m["max_diff_tp_sp_vs_dense"] <= TOLERANCE  # logits and one SGD step, both plans
    assert m["collectives_per_block"] == {
        "tp": {"all_reduce": 2},  # attention's o and the MLP's w2
        "tp_sp": {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2},
    }
    # backward as many again: q, k and v share one input gradient all-reduce (Megatron's plan);
    # with SP the same bytes as TP (issue 42: without PrepareModuleInput TP sent 4 all-reduces)
    assert m["collectives_per_block_backward"] == m["collectives_per_block"]


def test_mesh_2d_trained_or_skipped_with_reason(notebook_record):
    record = notebook_record(STEM)
    trained = record["metrics"]["mesh_2d_trained"]
    skips = [s for s in record["skipped"] if s["what"].startswith("2-D mesh")]
    if trained is None:
        assert skips and skips[0]["why"], "a 2-D mesh that did not run must say why"
    else:
        assert trained is True
        assert not skips
        assert 0 <= record["metrics"]["max_diff_fsdp_tp_vs_single"] <= TOLERANCE


def test_the_exercises_change_the_plan_and_the_inputs_and_pass(notebook_record):
    """09.1 splits only w1 (still dense-equal, w2 whole), 09.2 feeds each rank its own input."""
    assert notebook_record(STEM)["metrics"]["exercises"] == {"09.1": True, "09.2": True}


def test_the_exercises_sit_in_section_1_and_check_the_prediction():
    """Both exercises change section 1's script: each check passes with the solution's
    predictions and fails with a wrong one; nothing launched."""
    shards = {"w1.weight": [[256, 64], [128, 64], "S(0)"], "w1.bias": [[256], [128], "S(0)"]}
    forward, backward = {"all_gather_into_tensor": 1}, {"all_reduce": 1}  # measured on gloo
    ranks = {
        r: {"max_diff": 0.0, "forward_comms": forward, "backward_comms": backward, "shards": shards}
        for r in (0, 1)
    }
    wrong = {"predicted_forward_comms": {"all_reduce": 1}, "predicted_backward_comms": {}}
    predictions.assert_checked(STEM, "09.1", "## 1.", ranks, wrong)
    ranks = {r: {"max_diff": 0.8, "forward_comms": {"all_reduce": 1}} for r in (0, 1)}
    wrong = {"predicted_equal_to_dense": True, "predicted_forward_comms": {}}
    predictions.assert_checked(STEM, "09.2", "## 1.", ranks, wrong)
