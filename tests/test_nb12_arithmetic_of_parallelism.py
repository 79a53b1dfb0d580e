"""Notebook 12: every formula printed next to a measurement of the same quantity agrees with it
(exactly on CPU, where bytes are counted tensor by tensor), and the timing model is honest."""

from __future__ import annotations

import pytest

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


def test_activations_against_torchs_memtracker_and_gpu_figures_measured_or_skipped(
    notebook_record,
):
    """A bigger GPT's activations in a fresh process, by torch's MemTracker (not the hooks the
    formula came from): fp32 and bf16 autocast, with and without checkpointing, after forward
    and at backward's peak. Measured on CPU: exact but the 4-byte loss, the checkpointed peaks
    at most 2.5 % below the formula (an upper bound). On a GPU the allocator within 10 % and
    the CUDA context named; without one, skipped with why."""
    record = notebook_record(STEM)
    m, skips = record["metrics"], {s["what"]: s["why"] for s in record["skipped"]}
    ratios = m["activation_ratios"]
    assert set(ratios) == {"fp32", "fp32 checkpointed", "bf16", "bf16 checkpointed"}
    if record["hardware"]["gpu_count"]:  # CPU-derived terms; fused GPU kernels may keep less
        assert all(0.5 < r < 1.5 for pair in ratios.values() for r in pair), ratios
        assert m["device_activation_error"] <= GPU_TOLERANCE
        assert m["cuda_context_mib"] > 0
    else:
        for after_forward, backward_peak in ratios.values():
            assert abs(after_forward - 1) <= BYTES_TOLERANCE
            assert abs(backward_peak - 1) <= BYTES_TOLERANCE
        assert m["activations_measured_on"] == "cpu"
        assert ratios["fp32"][0] == pytest.approx(1, abs=1e-5)  # the counts are exact on CPU
        assert "GPU" in skips["torch.cuda.memory_allocated and the CUDA context"]
        assert "GPU" in skips["CPUOffloadPolicy per-rank memory"]  # offload needs GPU workers


def test_bytes_on_the_wire_measured_by_the_kernel_match_the_ring(notebook_record):
    """/proc/self/io's wchar around each collective (gloo over TCP): the ring formulas within
    1 %. gloo's reduce-scatter is a whole all-reduce (ProcessGroupGloo): 2x its formula;
    measured 2.0003 at 2 and 4 ranks. Either a real reduce-scatter (1x) or gloo's (2x)."""
    ratio = notebook_record(STEM)["metrics"]["wire_bytes_ratio"]
    for kind in ("all_reduce", "all_gather", "all_to_all"):
        assert 1 <= ratio[kind] <= 1.01, (kind, ratio)
    assert 1 <= ratio["reduce_scatter"] <= 1.01 or 2 <= ratio["reduce_scatter"] <= 2.02, ratio


def test_the_calculator_reproduces_the_zero_papers_table(notebook_record):
    low, high = notebook_record(STEM)["metrics"]["zero_paper_ratio_range"]
    assert 0.99 <= low <= high <= 1.01  # the paper rounds to 3 or 4 digits


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


def test_mfu_against_the_datasheet_peak_with_the_measured_peak_beside_it(notebook_record):
    """MFU as papers define it needs the exact part's datasheet peak: on a CPU there is none,
    and the record says so rather than dividing by the measured peak and calling that MFU."""
    record = notebook_record(STEM)
    m, skips = record["metrics"], {s["what"]: s["why"] for s in record["skipped"]}
    assert m["matmul_peak_tflops"] > 0 and m["step_tflops"] > 0
    assert 0 < m["of_measured_peak"] < 1
    if "mfu" in m:
        assert 0 < m["mfu"] < 1 and m["mfu_checkpointed"] < m["hfu_checkpointed"]
        assert m["datasheet_part"] and m["datasheet_bf16_tflops"] > 0
    else:
        assert "no datasheet dense peak" in skips["MFU against the datasheet peak"]


def test_the_exercises_run_jobs_and_pass(notebook_record):
    assert notebook_record(STEM)["metrics"]["exercises"] == {"12.1": True, "12.2": True}
