"""Notebook 12: every formula printed next to a measurement of the same quantity agrees with it
(exactly on CPU, where bytes are counted tensor by tensor), and the timing model is honest."""

from __future__ import annotations

STEM = "12_arithmetic_of_parallelism"
BYTES_TOLERANCE = 0.05  # issue 34: 5 % on CPU (measured: 0, the counts are exact)
GPU_TOLERANCE = 0.10  # the caching allocator rounds blocks and keeps kernel workspaces


def test_memory_formulas_match_measured_bytes(notebook_record):
    record = notebook_record(STEM)
    m = record["metrics"]
    assert 0 <= m["activation_prediction_error"] <= BYTES_TOLERANCE
    bound = GPU_TOLERANCE if record["hardware"]["gpu_count"] else BYTES_TOLERANCE
    assert 0 <= m["memory_prediction_error"] <= bound
    zero = m["zero_bytes_per_rank"]
    total = {k: sum(v.values()) for k, v in zero.items()}
    assert total["ddp"] > total["zero1"] > total["zero2"] > total["zero3"]  # each stage shards more
    if "hsdp" in zero:
        assert total["zero3"] < total["hsdp"] < total["ddp"]


def test_activations_in_a_worker_match_and_gpu_figures_are_measured_or_skipped(notebook_record):
    """A bigger GPT's activations, in a fresh process: by the allocator on a GPU (10 %), by the
    saved storages on CPU (5 %); the CUDA context is named on a GPU, skipped with why without."""
    record = notebook_record(STEM)
    m, skips = record["metrics"], {s["what"]: s["why"] for s in record["skipped"]}
    if record["hardware"]["gpu_count"]:
        assert m["device_activation_error"] <= GPU_TOLERANCE
        assert m["cuda_context_mib"] > 0
    else:
        assert m["activations_measured_on"] == "cpu"
        assert m["device_activation_error"] <= BYTES_TOLERANCE
        assert "GPU" in skips["torch.cuda.memory_allocated and the CUDA context"]
        assert "GPU" in skips["CPUOffloadPolicy per-rank memory"]  # offload needs GPU workers


def test_communication_bytes_match_the_formulas(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert 0 <= m["comm_bytes_prediction_error"] <= BYTES_TOLERANCE
    sent = m["sent_bytes_per_rank"]  # on the wire: ZeRO-3 3(n-1)/n Psi, DDP 2(n-1)/n Psi
    assert 1.5 - 1e-9 <= sent["zero3"] / sent["ddp"] <= 1.6  # FSDP's padding adds a little


def test_collective_sweep_and_time_prediction(notebook_record):
    """The figures depend on the machine and its load: only their sense is asserted, never a
    time bound (issue 34: "report the figure"; the kit keeps timings out of tests). The notebook
    prints whether the timing model held within a factor of 2. Quick runs on 2 shared cores:
    error 0.02-1.08 over 8 runs alone, 2.05 once in a CI run (DDP's one all-reduce predicted
    3x too slow while pytest and a kernel shared the cores), before the sweep and the replayed
    steps were interleaved round by round."""
    m = notebook_record(STEM)["metrics"]
    assert m["allreduce_alpha_us"] >= 0
    assert m["allreduce_busbw_GBps"] > 0
    errors = m["comm_time_prediction_errors"]
    assert set(errors) == {"ddp", "zero3"}
    assert m["comm_time_prediction_error"] == max(errors.values()) >= 0


def test_fake_64_rank_layout_matches_the_calculator(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert m["fake_world_size"] == 64
    assert m["fake_layout_matches_formula"] is True
    assert m["fake_params_per_rank"] > 0


def test_mfu_is_below_one_against_a_measured_peak(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert m["matmul_peak_tflops"] > 0
    assert 0 < m["mfu"] < 1


def test_the_exercises_run_jobs_and_pass(notebook_record):
    assert notebook_record(STEM)["metrics"]["exercises"] == {"12.1": True, "12.2": True}
