"""`moelambda choose` against a brute force of separate `profile`, `plan` and quality runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ground.errors import CorpusError
from ground.plan import Plan
from moe import load_model, moefy_options
from moelambda.cli import app
from planner.choose import pareto_front

runner = CliRunner()
TOKENS = 256  # per planned batch; choose profiles 4x as many
QUALITY_TOKENS = 512


def _grid() -> list:
    return [
        # k = 4 of 4 is the dense model: the best and the dearest, so a floor near it tells the
        # cheapest eligible option from the best and the dearest (`_discriminating_floor`).
        moefy_options(4, k)
        for k in (1, 2, 3, 4)
    ]


@pytest.fixture(scope="module")
def tiny_llama(tiny_dirs: dict[str, Path]) -> str:
    """The tiny decoder with every option of the grid MoEfied in the test cache (quality on
    512 held-out tokens, as choose asks for below)."""
    path = str(tiny_dirs["llama"])
    for options in _grid():
        load_model(path, options=options, quality_tokens=QUALITY_TOKENS)
    return path


def _brute_force(path: str, tmp: Path) -> list[tuple[str, float, float, float]]:
    """(label, validation ppl ratio, test ppl ratio, bill) of every option from the separate
    commands (the validation part, where choose decides, from Python)."""
    from moe import quality_of

    rows = []
    for number, options in enumerate(_grid()):
        flags = ["--model", path, "--experts", "4", "--top-k", options.top_k.label()]
        flags += ["--correction"] if options.correction else []
        trace = tmp / f"trace{number}"
        result = runner.invoke(
            app,
            [
                "profile",
                *flags,
                "--tokens",
                str(4 * TOKENS),
                "--window",
                "128",
                "--out",
                str(trace),
                "--json",
            ],
        )
        assert result.exit_code == 0, result.output
        quality = json.loads(result.stdout)["quality"]
        result = runner.invoke(
            app,
            [
                "plan",
                "--traces",
                str(trace),
                "--tokens",
                str(TOKENS),
                "--out",
                str(tmp / f"p{number}.json"),
                "--json",
            ],
        )
        assert result.exit_code == 0, result.output
        bill = json.loads(result.stdout)["bill_usd"]["total_usd"]
        model = load_model(path, options=options, quality_tokens=QUALITY_TOKENS)
        validation, _ = quality_of(model, tokens=QUALITY_TOKENS, split="validation")
        assert quality["split"] == "test"
        rows.append((options.label(), validation.ppl_ratio, quality["ppl_ratio"], bill))
    return rows


def _untimed(summary: dict) -> dict:
    """A summary without the seconds each validation measurement took (measured every run)."""
    summary = json.loads(json.dumps(summary))  # the chosen row shares its option's dicts
    rows = [*summary["options"], *([summary["chosen"]] if summary["chosen"] else [])]
    for row in rows:
        row["validation_quality"].pop("wall_s")
    return summary


def _discriminating_floor(rows: list[tuple[str, float, float, float]]) -> float:
    """A floor that admits at least two options and whose cheapest eligible option is neither
    the best-quality nor the dearest eligible one, so that a `choose` picking either of those
    fails the test."""
    ranked = sorted(rows, key=lambda r: r[1])
    for n in range(2, len(ranked) + 1):
        eligible = ranked[:n]
        cheapest = min(eligible, key=lambda r: (r[3], r[1]))
        if cheapest not in (eligible[0], max(eligible, key=lambda r: r[3])):
            upper = ranked[n][1] if n < len(ranked) else ranked[-1][1] + 1.0
            return (eligible[-1][1] + upper) / 2
    pytest.fail(f"no floor of this grid tells the cheapest eligible option apart: {rows}")


def test_choose_is_the_cheapest_option_meeting_the_floor(tiny_llama: str, tmp_path: Path) -> None:
    rows = _brute_force(tiny_llama, tmp_path)
    floor = _discriminating_floor(rows)
    eligible = [r for r in rows if r[1] <= floor]
    assert len(eligible) >= 2
    expected = min(eligible, key=lambda r: (r[3], r[1]))
    out = tmp_path / "chosen"
    common = [
        "choose",
        "--model",
        tiny_llama,
        "--experts",
        "4",
        "--top-k",
        "1,2,3,4",
        "--shared",
        "0",
    ]
    common += ["--tokens", str(TOKENS), "--quality-tokens", str(QUALITY_TOKENS)]
    common += ["--correction", "off", "--fit-tokens", "8192"]  # the models the fixture built
    result = runner.invoke(
        app, [*common, "--max-ppl-ratio", str(floor), "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert len(summary["options"]) == 4
    assert (summary["chosen_on"], summary["reported_on"]) == ("validation", "test")
    chosen = summary["chosen"]
    assert chosen["label"] == expected[0]
    assert chosen["bill_usd"] == pytest.approx(expected[3], rel=1e-9)
    by_label = {o["label"]: o for o in summary["options"]}
    for label, validation, test, bill in rows:
        assert by_label[label]["validation_quality"]["ppl_ratio"] == validation
        assert by_label[label]["quality"]["ppl_ratio"] == test
        assert by_label[label]["bill_usd"] == pytest.approx(bill, rel=1e-9)
        assert by_label[label]["meets_floor"] == (validation <= floor)
    assert Plan.load(out / "plan.json").totals.bill_usd["total_usd"] == pytest.approx(expected[3])
    assert (out / "choose.png").stat().st_size > 0 and (out / "choose.json").is_file()

    # No option meets an impossible floor: exit 2, the best reached named, nothing written.
    strict = tmp_path / "strict"
    result = runner.invoke(app, [*common, "--max-ppl-ratio", "0.5", "--out", str(strict)])
    assert result.exit_code == 2
    assert f"{min(r[1] for r in rows):.4f}" in result.output and not strict.exists()


def test_choose_skips_options_over_the_conversion_budget(tiny_llama: str, tmp_path: Path) -> None:
    """The converted option counts its measured minutes; the distilled one, estimated from
    the rates at about 3 minutes for this tiny model, is skipped and named, never converted."""
    common = ["choose", "--model", tiny_llama, "--experts", "4", "--top-k", "1", "--shared", "0"]
    common += ["--tokens", str(TOKENS), "--quality-tokens", str(QUALITY_TOKENS)]
    common += ["--correction", "off", "--fit-tokens", "8192", "--max-ppl-ratio", "100"]
    common += ["--distil-steps", "0,100000"]
    result = runner.invoke(
        app, [*common, "--max-convert-minutes", "1", "--out", str(tmp_path / "a"), "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [o["label"] for o in summary["options"]] == ["E4 k1"]
    assert summary["options"][0]["convert_s"] > 0  # measured when the fixture converted it
    skipped = summary["skipped_for_convert_budget"]
    assert [s["label"] for s in skipped] == ["E4 k1 distil 100000"]
    assert skipped[0]["convert_minutes"] > 1 and not skipped[0]["measured"]
    result = runner.invoke(
        app, [*common, "--max-convert-minutes", "0.00001", "--out", str(tmp_path / "b")]
    )
    assert result.exit_code == 2 and "no option of the grid converts within" in result.output
    assert not (tmp_path / "b").exists()


def test_pareto_front_against_brute_force() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        bills = rng.choice([1.0, 2.0, 3.0, 4.0, np.nan], size=7)
        quality = rng.choice([0.1, 0.5, 0.9], size=7)
        front = pareto_front(bills, quality)
        expected = [
            i
            for i in range(7)
            if np.isfinite(bills[i])
            and not any(
                np.isfinite(bills[j])
                and bills[j] <= bills[i]
                and quality[j] >= quality[i]
                and (bills[j] < bills[i] or quality[j] > quality[i] or j < i)
                for j in range(7)
                if j != i
            )
        ]
        assert sorted(front) == sorted(expected)


def test_choose_refuses_bad_floors() -> None:
    for args, message in (
        ([], "exactly one quality floor"),
        (["--min-cosine", "0.9", "--max-ppl-ratio", "1.1"], "exactly one quality floor"),
        (["--min-cosine", "2"], "is not a cosine"),
        (["--min-cosine", "0.9", "--top-k", "two"], "not a number of experts"),
        (["--min-cosine", "0.9", "--correction", "maybe"], "on, off or both"),
        (["--min-cosine", "0.9", "--distil-steps", "many"], "comma-separated list of numbers"),
        (["--min-cosine", "0.9", "--distil-steps", "-5"], "--distil-steps must be 0 or more"),
        (["--min-cosine", "0.9", "--local-steps", "-5"], "--local-steps 0 or more"),
        (["--min-cosine", "0.9", "--ridge", "0"], "--ridge 0 is not positive"),
        (["--min-cosine", "0.9", "--max-convert-minutes", "0"], "is not positive"),
    ):
        result = runner.invoke(app, ["choose", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "Traceback" not in result.output


def test_choose_from_python_is_the_command(tiny_llama: str, tmp_path: Path) -> None:
    """`check_choose`, `choose`, `Selection.summary` and `write_selection` give what the
    command prints and writes."""
    from planner.choose import check_choose, choose, write_selection

    args = [
        "choose",
        "--model",
        tiny_llama,
        "--experts",
        "4",
        "--top-k",
        "1,2,3,4",
        "--shared",
        "0",
    ]
    args += ["--tokens", str(TOKENS), "--quality-tokens", str(QUALITY_TOKENS)]
    args += ["--correction", "off", "--fit-tokens", "8192", "--max-ppl-ratio", "1e9"]
    args += ["--out", str(tmp_path / "cli")]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    floor = check_choose(max_ppl_ratio=1e9, tokens=TOKENS, quality_tokens=QUALITY_TOKENS)
    selection = choose(tiny_llama, _grid(), floor, tokens=TOKENS, quality_tokens=QUALITY_TOKENS)
    summary = selection.summary(tiny_llama, TOKENS, None)
    write_selection(tmp_path / "api", selection, summary)
    untimed = _untimed(summary | {"out": str(tmp_path / "cli")})
    assert untimed == _untimed(json.loads(result.stdout))
    written = [json.loads((tmp_path / d / "choose.json").read_text()) for d in ("api", "cli")]
    assert _untimed(written[0]) == _untimed(written[1])
    assert (tmp_path / "api" / "plan.json").read_text() == (
        tmp_path / "cli" / "plan.json"
    ).read_text()


def test_the_grid_crosses_distillation_steps() -> None:
    from moelambda.cli.choose import grid_of

    grid = grid_of("minilm", "8", "4", "0", "mass", "on", 0, 131072, "0,1500")
    assert [(o.top_k.k, o.correction, o.distil_steps) for o in grid] == [
        (4, True, 0),
        (4, True, 1500),
    ]


def test_choose_and_quality_refuse_more_text_than_the_test_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before any option is MoEfied (distillation takes minutes), for every option and seed."""
    import moe

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("loaded a model before checking the held-out text")

    monkeypatch.setattr(moe, "load_model", no_load)
    result = runner.invoke(
        app, ["choose", "--min-cosine", "0.9", "--quality-tokens", "40000", "--seed", "1"]
    )
    assert result.exit_code == 2 and "no fit or choice reads" in result.output
    assert "pass --quality-tokens 32,704 or fewer" in result.output
    result = runner.invoke(
        app, ["quality", "--experts", "8", "--top-k", "4", "--seed", "3", "--tokens", "40000"]
    )
    assert result.exit_code == 2 and "test part of the embedded text" in result.output
    assert "pass --tokens 32,704 or fewer" in result.output


def test_the_grid_crosses_fit_texts(tmp_path: Path) -> None:
    from moelambda.cli.choose import grid_of

    mine = tmp_path / "mine.txt"
    mine.write_text("my requests\n")
    grid = grid_of(
        "minilm", "8", "4", "0", "mass", "on", 0, 131072, "0", "wiki,user,user", str(mine)
    )
    assert [o.fit_corpus for o in grid] == ["wiki", str(mine)]
    assert grid[1].label() == "E8 k4 corr fit mine.txt"
    with pytest.raises(CorpusError, match="does not exist"):
        grid_of("minilm", "8", "4", "0", "mass", "on", 0, 131072, "0", "nope.txt", "wiki")


def test_an_option_fitted_on_the_judged_text_is_preferred_when_it_keeps_the_floor() -> None:
    """Fitted on the user's text it bills a little more here (another routing), yet it is the
    one chosen; when it misses the floor, the cheapest of the others is."""
    from planner.choose import Floor, OptionResult, Selection

    def quality(cosine: float, fit: str) -> dict[str, object]:
        return {"cosine_mean": cosine, "expert_flops_share": 0.5, "corpus_sha256": "user",
                "fit_corpus_sha256": fit}  # fmt: skip

    floor = Floor("cosine_mean", 0.95)

    def select(own_cosine: float) -> Selection:
        results = [
            OptionResult(moefy_options(8, 4), quality(0.96, "wiki"), quality(0.96, "wiki"), 1.0),
            OptionResult(
                moefy_options(8, 4, fit_corpus="u.txt"),
                quality(own_cosine, "user"),
                quality(own_cosine, "user"),
                1.1,
            ),
            OptionResult(moefy_options(8, 6), quality(0.99, "wiki"), quality(0.99, "wiki"), 2.0),
        ]
        for r in results:
            r.meets_floor = floor.met(r.validation)
        return Selection.of(results, floor)

    chosen = select(0.97)
    assert chosen.chosen == 1 and chosen.results[1].describe()["fitted_on_judged_text"]
    assert chosen.frontier == [0, 1, 2]
    assert select(0.90).chosen == 0


def test_the_bench_picks_its_best_option_on_validation_and_reports_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Validation and test disagree on purpose: the best at half the FLOPs is the validation
    winner, reported with its test numbers (which here miss the target)."""
    import planner.choose
    from planner.bench import quality_by_seed
    from planner.choose import Floor, OptionResult, Selection

    def quality(cosine: float, share: float) -> dict[str, float]:
        return {"cosine_mean": cosine, "neighbour_overlap_10": 0.9, "expert_flops_share": share}

    results = [
        OptionResult(moefy_options(4, 1), quality(0.99, 0.25), quality(0.95, 0.25), 1e-6),
        OptionResult(moefy_options(4, 2), quality(0.96, 0.5), quality(0.98, 0.5), 2e-6),
        OptionResult(moefy_options(2, 2), quality(0.999, 1.0), quality(0.999, 1.0), 3e-6),
    ]
    floor = Floor("cosine_mean", 0.97)
    for r in results:
        r.meets_floor = floor.met(r.validation)
    selection = Selection(results, floor, chosen=1)
    monkeypatch.setattr(planner.choose, "choose", lambda *a, **k: selection)
    run = quality_by_seed("minilm", [], floor, 256, seed=1)
    assert run["seed"] == 1
    assert run["best_at_half_flops"] == "E4 k2"
    assert run["best_at_half_flops_quality"]["cosine_mean"] == 0.96
    assert run["half_flops_target_met"] is False
    assert run["chosen_for_floor"] == "E4 k2"


def test_the_bench_can_leave_out_options_not_converted_yet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`bench quality --cached-only` names what it left out instead of converting it (a
    distilled MiniLM option takes about 48 minutes)."""
    import moe
    import moe._cache
    import planner.bench
    from planner.bench import bench_quality, quality_grid

    asked: list[list[str]] = []

    def by_seed(model, grid, floor, tokens, seed, progress=None, corpus="wiki"):  # type: ignore[no-untyped-def]
        asked.append([o.label() for o in grid])
        return {"seed": seed, "options": []}

    def cached(model, *, experts, top_k, options):  # type: ignore[no-untyped-def]
        return None if options.distil_steps else Path("cached")

    monkeypatch.setattr(planner.bench, "quality_by_seed", by_seed)
    monkeypatch.setattr(moe._cache, "cached_export_dir", cached)
    for name in ("load_model", "dense_reference", "load_corpus", "measure_quality"):
        monkeypatch.setattr(moe, name, lambda *a, **k: None)
    report = bench_quality("minilm", seeds=(0, 1), cached_only=True)
    distilled = [o.label() for o in quality_grid("minilm") if o.distil_steps]
    assert distilled and all(set(distilled).isdisjoint(labels) for labels in asked)
    assert [run["not_converted"] for run in report["models"]["minilm"]["seeds"]] == [distilled] * 2
    assert len(asked) == 2 and len(asked[0]) == len(quality_grid("minilm")) - len(distilled)
    bench_quality("minilm", seeds=(0,))
    assert set(distilled) <= set(asked[-1])  # without the flag, everything is converted


def test_the_bench_on_a_user_text_fits_each_option_on_both_texts(tmp_path: Path) -> None:
    """`bench quality --corpus FILE`: each option twice, fitted on wiki and on the file, and
    `fit_comparison` sets the pair side by side whatever the order of the rows."""
    from planner.bench import USER_TEXT_OPTIONS, fit_comparison, quality_grid

    text = tmp_path / "mine.txt"
    text.write_text("my requests\n")
    grid = quality_grid("minilm", 1, str(text))
    assert len(grid) == 2 * len(USER_TEXT_OPTIONS["minilm"])
    assert [o.fit_corpus for o in grid[:2]] == ["wiki", str(text)]
    assert {o.seed for o in grid} == {1}

    def row(options: object, fitted: bool, cosine: float) -> dict[str, object]:
        q = {"cosine_mean": cosine, "neighbour_overlap_10": 0.7, "expert_flops_share": 0.5}
        return {"moefy": options.describe(), "fitted_on_judged_text": fitted, "quality": q}  # type: ignore[attr-defined]

    rows = [row(grid[1], True, 0.95), row(grid[0], False, 0.93), row(grid[3], True, 0.97)]
    pairs = fit_comparison(rows)
    assert [p["moefy"]["distil_steps"] for p in pairs] == [0, grid[3].distil_steps]
    assert pairs[0]["wiki"]["cosine_mean"] == 0.93 and pairs[0]["user"]["cosine_mean"] == 0.95
    assert "wiki" not in pairs[1] and pairs[1]["user"]["cosine_mean"] == 0.97
    assert "fit_corpus" not in pairs[0]["moefy"]


def test_decoder_targets_take_the_validation_best_within_flops_training_and_time() -> None:
    """The training-free target ignores trained options however good; the timed one ignores
    options over its minutes or not metered; each reports its pick's test ratio."""
    from planner.bench import DECODER_TARGETS, decoder_target

    def row(label: str, share: float, val: float, test: float, convert_s: float | None,
            **moefy: int) -> dict:  # fmt: skip
        return {
            "label": label,
            "expert_flops_share": share,
            "convert_s": convert_s,
            "moefy": {"distil_steps": 0, "local_steps": 0, **moefy},
            "validation_quality": {"ppl_ratio": val},
            "quality": {"ppl_ratio": test},
        }

    rows = [
        row("k6", 0.75, 1.5, 1.52, 300.0),
        row("k6 local", 0.75, 1.1, 1.12, 600.0, local_steps=100),
        row("k4", 0.5, 3.0, 3.1, 200.0),
        row("k4 local", 0.5, 1.4, 1.45, 2400.0, local_steps=100),
        row("k4 distil", 0.5, 1.2, 1.2, 7200.0, distil_steps=3000),
        row("k4 unmetered", 0.5, 1.0, 1.0, None, local_steps=5),
    ]
    free, timed = (decoder_target(t, rows) for t in DECODER_TARGETS)
    assert (free["best"], free["ppl_ratio"], free["met"]) == ("k6", 1.52, False)
    assert (timed["best"], timed["ppl_ratio"], timed["met"]) == ("k4 local", 1.45, True)
    assert decoder_target(DECODER_TARGETS[1], rows[:1])["best"] is None
