"""`moelambda choose` against a brute force of separate `profile`, `plan` and quality runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ground.plan import Plan
from moe import load_model, moefy_options
from moelambda.cli import app
from planner.choose import pareto_front

runner = CliRunner()
TOKENS = 256  # per planned batch; choose profiles 4x as many
QUALITY_TOKENS = 512


def _grid() -> list:
    return [
        moefy_options(4, k, correction=c, shared=s)
        for k in (1, 2)
        for c in (False, True)
        for s in (0.0,)
    ]


@pytest.fixture(scope="module")
def tiny_llama(tiny_dirs: dict[str, Path]) -> str:
    """The tiny decoder with every option of the grid MoEfied in the test cache (quality on
    512 held-out tokens, as choose asks for below)."""
    path = str(tiny_dirs["llama"])
    for options in _grid():
        load_model(path, options=options, quality_tokens=QUALITY_TOKENS)
    return path


def _brute_force(path: str, tmp: Path) -> list[tuple[str, float, float]]:
    """(label, ppl ratio, bill) of every option from the separate commands."""
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
        rows.append((options.label(), quality["ppl_ratio"], bill))
    return rows


def test_choose_is_the_cheapest_option_meeting_the_floor(tiny_llama: str, tmp_path: Path) -> None:
    rows = _brute_force(tiny_llama, tmp_path)
    ratios = sorted({r[1] for r in rows})
    assert len(ratios) > 1  # the options really differ in quality
    floor = (ratios[0] + ratios[1]) / 2  # only the best-quality option(s) meet it
    expected = min((r for r in rows if r[1] <= floor), key=lambda r: r[2])
    out = tmp_path / "chosen"
    common = ["choose", "--model", tiny_llama, "--experts", "4", "--top-k", "1,2", "--shared", "0"]
    common += ["--tokens", str(TOKENS), "--quality-tokens", str(QUALITY_TOKENS)]
    common += ["--fit-tokens", "8192"]  # the models the fixture built
    result = runner.invoke(
        app, [*common, "--max-ppl-ratio", str(floor), "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert len(summary["options"]) == 4
    chosen = summary["chosen"]
    assert chosen["label"] == expected[0]
    assert chosen["bill_usd"] == pytest.approx(expected[2], rel=1e-9)
    by_label = {o["label"]: o for o in summary["options"]}
    for label, ratio, bill in rows:
        assert by_label[label]["quality"]["ppl_ratio"] == ratio
        assert by_label[label]["bill_usd"] == pytest.approx(bill, rel=1e-9)
        assert by_label[label]["meets_floor"] == (ratio <= floor)
    assert Plan.load(out / "plan.json").totals.bill_usd["total_usd"] == pytest.approx(expected[2])
    assert (out / "choose.png").stat().st_size > 0 and (out / "choose.json").is_file()

    # No option meets an impossible floor: exit 2, the best reached named, nothing written.
    strict = tmp_path / "strict"
    result = runner.invoke(app, [*common, "--max-ppl-ratio", "0.5", "--out", str(strict)])
    assert result.exit_code == 2
    assert f"{ratios[0]:.4f}" in result.output and not strict.exists()


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
    ):
        result = runner.invoke(app, ["choose", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "Traceback" not in result.output


def test_choose_from_python_is_the_command(tiny_llama: str, tmp_path: Path) -> None:
    """`check_choose`, `choose`, `Selection.summary` and `write_selection` give what the
    command prints and writes."""
    from planner.choose import check_choose, choose, write_selection

    args = ["choose", "--model", tiny_llama, "--experts", "4", "--top-k", "1,2", "--shared", "0"]
    args += ["--tokens", str(TOKENS), "--quality-tokens", str(QUALITY_TOKENS)]
    args += ["--fit-tokens", "8192", "--max-ppl-ratio", "1e9", "--out", str(tmp_path / "cli")]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    floor = check_choose(max_ppl_ratio=1e9, tokens=TOKENS, quality_tokens=QUALITY_TOKENS)
    selection = choose(tiny_llama, _grid(), floor, tokens=TOKENS, quality_tokens=QUALITY_TOKENS)
    summary = selection.summary(tiny_llama, TOKENS, None)
    write_selection(tmp_path / "api", selection, summary)
    assert summary | {"out": str(tmp_path / "cli")} == json.loads(result.stdout)
    written = [json.loads((tmp_path / d / "choose.json").read_text()) for d in ("api", "cli")]
    assert written[0] == written[1]
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


def test_choose_refuses_held_out_text_a_distilled_option_trained_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before any option is MoEfied: distillation takes minutes."""
    import moe

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("loaded a model before checking the held-out text")

    monkeypatch.setattr(moe, "load_model", no_load)
    result = runner.invoke(
        app,
        ["choose", "--min-cosine", "0.9", "--distil-steps", "0,10", "--quality-tokens", "40000"],
    )
    assert result.exit_code == 2 and "would read text it was trained on" in result.output
    result = runner.invoke(
        app,
        [
            "quality",
            "--experts",
            "8",
            "--top-k",
            "4",
            "--distil-steps",
            "10",
            "--seed",
            "0",
            "--tokens",
            "40000",
        ],
    )
    assert result.exit_code == 2 and "--corpus with text of your own" in result.output
