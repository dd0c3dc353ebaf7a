import pandas as pd
import pytest

from scaling.study.sweeps import results
from scaling._io import atomic_write_json


def _summary(run_id, evals, **extra):
    return {
        "run_id": run_id, "status": "ok", "N": 1000, "N_total": 2000, "P": 8, "recipe": "fp8",
        "format": "fp8_e4m3", "granularity": "tensor", "scaling": "current", "smooth_swiglu": False,
        "seed": 0, "wall_s": 1.5, "tokens_per_s": 100.0, "D": evals[-1]["D"],
        "val_loss": evals[-1]["val_loss"], "train_loss": evals[-1]["train_loss"],
        "telemetry": {"activation": {"amax": 3.0, "frac_saturated": 0.01, "frac_underflow": 0.0, "snr_db": 30.0}},
        "evals": evals, **extra,
    }


def test_one_row_per_run_and_budget(tmp_path):
    evals = [{"D": 100, "step": 1, "val_loss": 3.0, "train_loss": 3.1},
             {"D": 200, "step": 2, "val_loss": 2.5, "train_loss": 2.6}]
    atomic_write_json(tmp_path / "sw" / "aaa" / "summary.json", _summary("aaa", evals, hardware="gpu: NVIDIA H200 x1"))
    atomic_write_json(tmp_path / "sw" / "bbb" / "summary.json", _summary(
        "bbb", evals[:1], P=4, corpus={"source": "stdlib", "fingerprint": "b27681494f2ffe6815ee", "bytes": 10}))
    (tmp_path / "sw" / "ccc").mkdir()  # crashed before landing: no summary, no row
    (tmp_path / "sw" / "ccc" / "config.json").write_text("{}")
    df = results.load(tmp_path / "sw")
    assert len(df) == 3
    assert list(df.columns[: len(results.COLUMNS)]) == results.COLUMNS
    assert set(df["sweep"]) == {"sw"}
    aaa = df[df.run_id == "aaa"].sort_values("D")
    assert aaa["val_loss"].tolist() == [3.0, 2.5] and aaa["D"].tolist() == [100, 200]
    assert df.loc[df.run_id == "bbb", "P"].item() == 4
    assert (df["activation_amax"] == 3.0).all()
    assert df.loc[df.run_id == "bbb", "corpus"].item() == "stdlib b27681494f2f"  # which data, for the report
    assert df.loc[df.run_id == "aaa", "corpus"].isna().all()
    assert (df.loc[df.run_id == "aaa", "hardware"] == "gpu: NVIDIA H200 x1").all()  # where it trained, per row
    assert df.loc[df.run_id == "bbb", "hardware"].isna().all()


def test_bits_per_byte_and_tokenizer_are_carried(tmp_path):
    evals = [{"D": 100, "step": 1, "val_loss": 3.0, "train_loss": 3.1, "val_bpb": 1.2, "train_bpb": 1.25},
             {"D": 200, "step": 2, "val_loss": 2.5, "train_loss": 2.6, "val_bpb": 1.0, "train_bpb": 1.05}]
    corpus = {"source": "pysrc", "fingerprint": "ab" * 32, "bytes": 10, "vocab": 4096, "tokenizer": "bpe:4096"}
    atomic_write_json(tmp_path / "sw" / "bpe" / "summary.json", _summary("bpe", evals, corpus=corpus))
    old = {"source": "stdlib", "fingerprint": "cd" * 32, "bytes": 10, "vocab": 256}  # before data.tokenizer
    atomic_write_json(tmp_path / "sw" / "old" / "summary.json", _summary("old", evals[:1], corpus=old))
    df = results.load(tmp_path / "sw").set_index(["run_id", "D"])
    assert df.loc[("bpe", 100), "val_bpb"] == 1.2 and df.loc[("bpe", 200), "train_bpb"] == 1.05
    assert df.loc[("bpe", 200), "tokenizer"] == "bpe:4096" and df.loc[("bpe", 200), "corpus"].endswith(" bpe:4096")
    assert df.loc[("old", 100), "tokenizer"] == "bytes" and df.loc[("old", 100), "corpus"] == "stdlib " + "cd" * 6


def test_no_duplicate_rows_and_unreadable_summary_is_skipped(tmp_path):
    evals = [{"D": 100, "step": 1, "val_loss": 3.0, "train_loss": 3.1}] * 2
    atomic_write_json(tmp_path / "sw" / "aaa" / "summary.json", _summary("aaa", evals))
    (tmp_path / "sw" / "bad").mkdir()
    (tmp_path / "sw" / "bad" / "summary.json").write_text('{"truncated": ')
    with pytest.warns(UserWarning, match="unreadable"):
        df = results.load(tmp_path)
    assert len(df) == 1


def test_export_round_trip(tmp_path):
    evals = [{"D": 100, "step": 1, "val_loss": 3.0, "train_loss": 3.1}]
    atomic_write_json(tmp_path / "sw" / "aaa" / "summary.json", _summary("aaa", evals))
    df = results.load(tmp_path / "sw")
    for name in ("s.csv", "s.parquet"):
        back = results.load(results.export(df, tmp_path / name))
        pd.testing.assert_frame_equal(back, df, check_dtype=False)


def test_missing_or_malformed_path_is_a_one_line_error(tmp_path):
    from scaling.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^results: got '.*nope'; allowed: an existing results directory"):
        results.load(tmp_path / "nope")
    (tmp_path / "x.txt").write_text("a")
    with pytest.raises(ConfigError, match=r"^results: got '.*x.txt'"):
        results.load(tmp_path / "x.txt")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ConfigError, match=r"^results: got '.*bad.parquet'.*ArrowInvalid|^results: got '.*bad.parquet'"):
        results.load(tmp_path / "bad.parquet")


def test_takeoff_probes_are_not_results(tmp_path):
    evals = [{"D": 100, "step": 1, "val_loss": 3.0, "train_loss": 3.1}]
    atomic_write_json(tmp_path / "sw" / "aaa" / "summary.json", _summary("aaa", evals))
    atomic_write_json(tmp_path / ".takeoff" / "sw" / "probe" / "summary.json", _summary("probe", evals))
    assert results.load(tmp_path).run_id.tolist() == ["aaa"]


def _committed(path, runs, loss, sweep="isoflop"):
    """A committed summary (.csv) of `runs` at one eval each, with a 3-step curve per run beside it."""
    from scaling.study.sweeps import curves
    from scaling.study.sweeps.summary import Summary
    rows = [r for run in runs for r in results.rows_from_summary(
        _summary(run, [{"D": 100, "step": 1, "val_loss": loss, "train_loss": loss}]), run_id=run, sweep=sweep)]
    results.export(results.tidy(pd.DataFrame(rows)), path)
    curve = pd.DataFrame([{"run_id": run, "sweep": sweep, "step": s, "tokens": 10 * s, "loss": loss + 1 / s}
                          for run in runs for s in (1, 2, 3)])
    results.export(curves.validate_curves(curve), Summary(path).curves_path)
    return Summary(path)


def test_merge_joins_a_side_summary_rows_and_curves_and_is_idempotent(tmp_path, capsys):
    from scaling import cli
    from scaling.study.sweeps import curves
    main = _committed(tmp_path / "isoflop.csv", ["a", "b"], 2.0)
    side = _committed(tmp_path / "isoflop_heldout.csv", ["b", "c"], 1.5)
    assert cli.main(["merge", str(side.path), "--into", str(main.path)]) == 0
    assert "1 runs added, 1 replaced" in capsys.readouterr().out
    rows = main.rows().set_index("run_id")["val_loss"]
    assert rows.to_dict() == {"a": 2.0, "b": 1.5, "c": 1.5}  # the side summary's b replaces the main's
    got = curves.load_curves(main.curves_path)
    assert sorted(got["run_id"].unique()) == ["a", "b", "c"] and len(got) == 9
    assert got.loc[got["run_id"] == "b", "loss"].min() == pytest.approx(1.5 + 1 / 3)
    assert side.rows()["run_id"].tolist() == ["b", "c"]  # the side summary is left as it was
    before = main.path.read_text()
    assert main.merge(side) == (0, 2) and main.path.read_text() == before


def test_merge_refuses_another_sweep_or_a_bad_path_in_one_line(tmp_path, capsys):
    from scaling import cli
    from scaling.errors import ConfigError
    main = _committed(tmp_path / "isoflop.csv", ["a"], 2.0)
    other = _committed(tmp_path / "granularity.csv", ["g"], 2.0, sweep="granularity")
    before = main.path.read_text()
    with pytest.raises(ConfigError, match="rows of sweep isoflop"):
        main.merge(other)
    assert cli.main(["merge", str(tmp_path / "missing.csv"), "--into", str(main.path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "side" in err and "missing.csv" in err and "an existing summary .csv" in err
    assert cli.main(["merge", str(main.path), "--into", str(main.path)]) == 2
    assert "another summary than the side one" in capsys.readouterr().err
    assert main.path.read_text() == before


def test_a_summary_takes_each_sweeps_rows_on_the_corpus_that_sweep_pins(tmp_path):
    from scaling.study.sweeps.summary import Summary

    rows = pd.DataFrame({"run_id": ["a", "b", "g", "h"], "sweep": ["isoflop", "isoflop", "granularity", "granularity"],
                         "D": 100, "val_loss": 2.0, "status": "ok",
                         "corpus": ["pysrc 0123456789ab", "pysrc ffffffffffff", "pysrc ffffffffffff", None]})
    path = tmp_path / "isoflop.csv"
    rows.to_csv(path, index=False)
    assert set(Summary(path).landed_ids()) == {"a", "b", "g", "h"}  # nothing pinned: every row
    pinned = Summary(path, {"isoflop": "0123456789abcdef", "outliers": "ffffffffffff"})
    assert pinned.landed_ids() == {"a", "g", "h"}  # isoflop's b is on other data; granularity pins nothing
    assert pinned.elsewhere()["run_id"].tolist() == ["b"] and len(pinned.all_rows()) == 4
    both = Summary(path, {"isoflop": "0123456789ab", "granularity": "ffffffffffff"})
    assert both.landed_ids() == {"a", "g"}  # a row with no recorded corpus is on no pinned one
