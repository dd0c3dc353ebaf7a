import pytest

from scaling import sweep
from scaling.errors import ConfigError


def test_grid_product_excludes_and_includes():
    experiment = {
        "grid": {"model": {"size": [1, 2]}, "precision": ["fp32", "fp8", "fp4"]},
        "exclude": [{"model.size": 2, "precision": "fp4"}],
        "include": [{"model.size": 3, "precision": "fp8"}],
    }
    points = sweep.grid_points(experiment)
    assert len(points) == 2 * 3 - 1 + 1
    assert {"model.size": 2, "precision": "fp4"} not in points
    assert points[-1] == {"model.size": 3, "precision": "fp8"}
    assert points[0] == {"model.size": 1, "precision": "fp32"}


def test_precision_table_is_a_leaf():
    table = {"weight": {"format": "fp8_e4m3"}}
    assert sweep.flatten({"precision": table}) == {"precision": table}
    assert sweep.flatten({"grid": {"train": {"lr": [1, 2]}}}) == {"grid.train.lr": [1, 2]}


def test_bad_grid_axis_names_key_and_value():
    with pytest.raises(ConfigError, match=r"grid.train.lr: got 0.1; allowed: a non-empty list"):
        sweep.grid_points({"grid": {"train": {"lr": 0.1}}})
    with pytest.raises(ConfigError, match="exclude"):
        sweep.grid_points({"exclude": {"a": 1}})


def test_dotted_set_and_get():
    cfg = {}
    sweep.set_dotted(cfg, "train.lr", 0.1)
    assert cfg == {"train": {"lr": 0.1}} and sweep.get_dotted(cfg, "train.lr") == 0.1
    assert sweep.get_dotted(cfg, "train.nope", "d") == "d"


def test_zipped_axis_varies_keys_together():
    points = sweep.grid_points({"grid": {"seed": [0, 1], "model.size,precision": [[2, "fp32"], [5, "fp4"]]}})
    assert points == [{"seed": 0, "model.size": 2, "precision": "fp32"}, {"seed": 0, "model.size": 5, "precision": "fp4"},
                      {"seed": 1, "model.size": 2, "precision": "fp32"}, {"seed": 1, "model.size": 5, "precision": "fp4"}]
    with pytest.raises(ConfigError, match="2-element lists"):
        sweep.grid_points({"grid": {"model.size,precision": [[2, "fp32"], [5]]}})


def test_a_run_another_process_owns_is_left_alone_then_waited_for(tmp_path):
    """The ownership rules of both local executors, without training: a held run is OWNED (nothing
    written into it); waited for, it is `skipped` once its owner lands it."""
    import threading

    from scaling import runs

    spec = sweep.RunSpec(run_id="abc", sweep="s", config={"seed": 0})
    run_dir = spec.out_dir(tmp_path)
    for attempt in (lambda wait: sweep.execute(spec, tmp_path, hang_timeout=60, poll_s=0.05, wait=wait),
                    lambda wait: sweep._run_in_process(spec, tmp_path, wait)):
        lock = runs.acquire(run_dir)
        assert attempt(False) == sweep.OWNED
        assert [p.name for p in run_dir.iterdir()] == [runs.LOCK_FILE]

        def owner_lands():
            runs.land(run_dir, {"status": "ok"})
            lock.release()

        timer = threading.Timer(0.3, owner_lands)
        timer.start()
        assert attempt(True) == "skipped"
        timer.join()
        (run_dir / runs.SUMMARY_FILE).unlink()
