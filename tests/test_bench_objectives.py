"""The presets benchmark's table (issue 40): per task and preset, held-out accuracy as mean
(lowest-highest) over seeds, steps per minute over all timed steps, and which runs did not
train, each figure worked out by hand from the runs below."""

from benchmarks.bench_objectives import SUCCEEDED, PresetRun, summary_table


def test_the_table_pools_seeds_per_task_and_preset_and_names_the_runs_that_did_not_train():
    runs = [
        PresetRun("demo", "GRPO", 0, 0.25, 0.50, 10, 10, 30.0, SUCCEEDED),
        PresetRun("calculator", "DAPO", 0, 0.30, None, 1, 0, None, "failed: out of memory"),
        PresetRun("demo", "GRPO", 1, 0.30, 0.40, 10, 10, 10.0, SUCCEEDED),
        PresetRun("demo", "RLOO", 0, 0.25, 0.25, 0, 5, 30.0, SUCCEEDED),  # every step rejected
    ]
    table = summary_table(runs)
    assert table.rows == [
        # 20 steps in 40 s: 30 a minute (not the mean of 20 and 60 a minute)
        ["demo", "GRPO", "0, 1", "27.5 (25.0-30.0)", "45.0 (40.0-50.0)", "30.0", "10, 10", "yes"],
        [
            "calculator",
            "DAPO",
            "0",
            "30.0",
            "-",
            "-",
            "1",
            "no (seed 0: failed: out of memory, v1)",
        ],
        ["demo", "RLOO", "0", "25.0", "25.0", "10.0", "0", "no (seed 0: succeeded, v0)"],
    ]
    assert len(table.columns) == len(table.rows[0])
