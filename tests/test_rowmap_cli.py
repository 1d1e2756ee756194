"""`recipegen rowmap …` end to end through the real CLI root (click), on raw and vLLM captures."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from cli_support import invoke
from expert_residency.formats import load_histogram, load_rowmap, save_rowmap

# 4 tokens, 2 MoE layers, top-2 of 4 experts. Hand counts:
#   layer 0: e0 x4, e1 x2, e2 x1, e3 x1      layer 1: e3 x4, e2 x3, e1 x1, e0 x0
IDS = np.array([[[0, 1], [3, 2]],
                [[0, 1], [3, 2]],
                [[0, 2], [3, 2]],
                [[0, 3], [3, 1]]], dtype=np.uint8)


def _b64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return base64.b64encode(buf.getbuffer()).decode()


def test_reduce_then_build_from_raw_capture(tmp_path: Path) -> None:
    np.save(tmp_path / "cap.npy", IDS)
    result = invoke("rowmap", "reduce", str(tmp_path / "cap.npy"), "--experts", "4",
                    "-o", str(tmp_path / "c.hist"))
    assert result.code == 0, result.stderr
    h = load_histogram(tmp_path / "c.hist")
    assert h.counts.tolist() == [[4, 2, 1, 1], [0, 1, 3, 4]]
    assert h.moe_layer_indices == (0, 1) and h.tokens == 4 and h.top_k == 2
    assert "4 tokens, 16 selections" in result.stdout

    result = invoke("rowmap", "build", str(tmp_path / "cap.npy"), "--experts", "4",
                    "--layers", "0-1", "--hot", "2", "-o", str(tmp_path / "m.rowmap"))
    assert result.code == 0, result.stderr
    rm = load_rowmap(tmp_path / "m.rowmap")
    # layer 0: e0 (4), e1 (2) hot; e2/e3 tie at 1 -> cold; layer 1: e3 (4), e2 (3) hot
    assert rm.hot == [[0, 1], [2, 3]] and rm.cold == [[2, 3], [0, 1]]
    assert rm.provenance["selections"] == 16 and rm.provenance["builder"] == "top-n"


def test_eval_vllm_capture_json_exact_cold_share(tmp_path: Path) -> None:
    rm_path = tmp_path / "m.rowmap"
    from expert_residency.formats import RowMap
    save_rowmap(RowMap((0, 1), 4, [[0, 1], [2, 3]], [[2, 3], [0, 1]]), rm_path)
    responses = [{"choices": [{"routed_experts": _b64(IDS[:2])}]},
                 {"choices": [{"routed_experts": _b64(IDS[2:])}]}]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in responses) + "\n")
    result = invoke("rowmap", "eval", str(rm_path), str(tmp_path / "r.jsonl"), "--json")
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    [h] = report["histograms"]
    # cold: layer 0 e2 + e3 = 2 of 8; layer 1 e0 + e1 = 1 of 8 -> 3 / 16
    assert h["cold_share"] == pytest.approx(3 / 16)
    assert h["cold_share_per_layer"] == pytest.approx([2 / 8, 1 / 8])
    # positional (e0, e1 hot in both layers): layer 0 cold 2, layer 1 cold 7 -> 9 / 16
    assert h["positional_cold_share"] == pytest.approx(9 / 16)


def test_eval_text_and_leave_one_out(tmp_path: Path) -> None:
    rm_path = tmp_path / "m.rowmap"
    np.save(tmp_path / "a.npy", IDS[:2])
    np.save(tmp_path / "b.npy", IDS[2:])
    assert invoke("rowmap", "build", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                  "--experts", "4", "--layers", "0-1", "--hot", "2", "-o", str(rm_path)).code == 0
    result = invoke("rowmap", "eval", str(rm_path), str(tmp_path / "a.npy"),
                    str(tmp_path / "b.npy"), "--per-layer")
    assert result.code == 0
    assert "leave-one-out" in result.stdout and "a.npy" in result.stdout and "top 73%" in result.stdout
    assert "per-layer cold %" in result.stdout


def test_compare_diff_show(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", IDS)
    np.save(tmp_path / "b.npy", 3 - IDS)  # mirror image: e3 <-> e0, e2 <-> e1
    result = invoke("rowmap", "compare", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                    "--experts", "4", "--layers", "0-1", "--hot", "2", "--json")
    assert result.code == 0, result.stderr
    r = json.loads(result.stdout)
    # a's map: cold {2,3} in layer 0, {0,1} in layer 1. b (mirrored) counts: layer 0
    # [1,1,2,4] -> 2 + 4 = 6 cold; layer 1 [4,3,1,0] -> 4 + 3 = 7 cold -> 13 / 16
    assert r["cold_shares"]["A"]["b"] == pytest.approx(13 / 16)
    assert r["cold_shares"]["A"]["a"] == pytest.approx(3 / 16)
    assert r["mean_spearman"] < 0

    for name, hot in (("x", "3"), ("y", "3"), ("z", "2")):
        assert invoke("rowmap", "build", str(tmp_path / "a.npy"), "--experts", "4", "--layers",
                      "0-1", "--hot", hot, "-o", str(tmp_path / f"{name}.rowmap")).code == 0
    result = invoke("rowmap", "diff", str(tmp_path / "x.rowmap"), str(tmp_path / "y.rowmap"))
    assert result.code == 0 and "identical assignment" in result.stdout
    result = invoke("rowmap", "diff", str(tmp_path / "x.rowmap"), str(tmp_path / "z.rowmap"),
                    "--json")
    d = json.loads(result.stdout)
    assert not d["same_shape"] and [l["cold_changed"] for l in d["layers"]] == [1, 1]

    result = invoke("rowmap", "show", str(tmp_path / "z.rowmap"), "--bytes-per-expert", "1 MiB")
    assert result.code == 0 and "hot bank (HBM):   0.00 GiB (4,194,304 B)" in result.stdout
    result = invoke("rowmap", "show", str(tmp_path / "z.rowmap"), "--json")
    assert json.loads(result.stdout)["hot_counts"] == [2, 2]


def test_budget_build_reports_shapes(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", IDS)
    result = invoke("rowmap", "build", str(tmp_path / "a.npy"), "--experts", "4",
                    "--layers", "0-1", "--cold-budget", "3 MiB", "--bytes-per-expert",
                    "1 MiB", "-o", str(tmp_path / "g.rowmap"), "--json")
    assert result.code == 0, result.stderr
    s = json.loads(result.stdout)
    # 3 cold: layer 1 e0 (0); then the 1-counts: l0 e3, l0 e2, l1 e1 -> descending id: l0 e3,
    # then l1 e1 vs l0 e2 -> descending id: e2 (layer 0)
    assert s["cold_experts"] == 3 and s["uniform_cold_per_layer"] == 1
    rm = load_rowmap(tmp_path / "g.rowmap")
    assert rm.cold == [[2, 3], [0]] and rm.hot_counts() == [2, 3]
    assert s["kernel_tunings"] == 3 and s["uniform_kernel_tunings"] == 2


def test_errors_are_clear_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.rowmap"
    bad.write_text("format: expert-residency-rowmap/7\n")
    result = invoke("rowmap", "show", str(bad))
    assert result.code == 2 and result.stderr.startswith("error: ") and f"{bad}:1" in result.stderr
    assert "unknown row-map format version" in result.stderr and "Traceback" not in result.stderr
    np.save(tmp_path / "a.npy", IDS)
    result = invoke("rowmap", "build", str(tmp_path / "a.npy"), "--hot", "2", "-o",
                    str(tmp_path / "m.rowmap"))
    assert result.code == 2 and "need the model geometry" in result.stderr
    assert not (tmp_path / "m.rowmap").exists()
    result = invoke("rowmap", "build", str(tmp_path / "a.npy"), "--experts", "3",
                    "--layers", "0-1", "--hot", "2", "-o", str(tmp_path / "m.rowmap"))
    assert result.code == 2 and "expert id 3 out of range" in result.stderr
    result = invoke("rowmap", "build", str(tmp_path / "a.npy"), "--experts", "4",
                    "-o", str(tmp_path / "m.rowmap"))
    assert result.code == 2 and "exactly one of --hot" in result.stderr
    result = invoke("rowmap", "eval", str(bad), str(tmp_path / "missing.hist"))
    assert result.code == 2


def test_show_and_build_with_the_reference_recipe(tmp_path: Path, repo_root: Path) -> None:
    maps = repo_root / "recipes" / "maps" / "dsv41-flash"
    result = invoke("rowmap", "show", str(maps / "agent.rowmap"), "--recipe",
                    "dsv41-flash-gb300")
    assert result.code == 0, result.stderr
    # 295 × 40 and 89 × 40 experts of 18,800,640 B (the agreed DSv4.1-Flash geometry)
    assert "hot bank (HBM):   206.61 GiB (221,847,552,000 B)" in result.stdout
    assert "cold bank (host): 62.33 GiB (66,930,278,400 B)" in result.stdout
    # a histogram of another geometry is refused against the recipe's model
    np.save(tmp_path / "a.npy", IDS)
    assert invoke("rowmap", "reduce", str(tmp_path / "a.npy"), "--experts", "4", "-o",
                  str(tmp_path / "small.hist")).code == 0
    result = invoke("rowmap", "build", str(tmp_path / "small.hist"), "--recipe",
                    "dsv41-flash-gb300", "--hot", "2", "-o", str(tmp_path / "m.rowmap"))
    assert result.code == 2 and "small.hist" in result.stderr and "2 MoE layers × 4 experts" in result.stderr
    # the docs/design.md budget example through the command: 62.33 GiB -> 88 cold per layer
    profiles = repo_root / "recipes" / "profiles" / "dsv41-flash"
    result = invoke("rowmap", "build", str(profiles / "agent.hist"), "--recipe",
                    "dsv41-flash-gb300", "--cold-budget", "62.33 GiB", "--uniform", "-o",
                    str(tmp_path / "u.rowmap"), "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["hot_counts"] == [296] * 40


def test_progress_bar_reports_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from recipegen.rowmap.inputs import Geometry, read_histograms
    np.save(tmp_path / "a.npy", IDS)
    [(name, h)] = read_histograms([tmp_path / "a.npy"], Geometry((0, 1), 4), progress=True)
    assert h.counts.tolist() == [[4, 2, 1, 1], [0, 1, 3, 4]]
    assert "reducing a.npy" in capsys.readouterr().err


def test_unwritable_output_and_bad_synth_arguments(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", IDS)
    result = invoke("rowmap", "build", str(tmp_path / "a.npy"), "--experts", "4", "--layers",
                    "0-1", "--hot", "2", "-o", str(tmp_path / "missing-dir" / "x" / "m.rowmap"))
    # parent folders are created; a path under a regular file cannot be
    assert result.code == 0
    (tmp_path / "file").write_text("x")
    result = invoke("rowmap", "build", str(tmp_path / "a.npy"), "--experts", "4", "--layers",
                    "0-1", "--hot", "2", "-o", str(tmp_path / "file" / "m.rowmap"))
    assert result.code == 2 and "cannot write" in result.stderr and "Traceback" not in result.stderr
    result = invoke("rowmap", "synth", "--experts", "4", "--layers", "0-1", "--top-k", "2",
                    "--class", "../evil", "-o", str(tmp_path))
    assert result.code == 2 and "class name" in result.stderr
    result = invoke("rowmap", "synth", "--experts", "4", "--layers", "0-1", "--top-k", "9",
                    "-o", str(tmp_path))
    assert result.code == 2 and "top-k" in result.stderr
    result = invoke("rowmap", "synth", "--experts", "4", "--layers", "0-1", "--top-k", "2",
                    "--tokens", "10", "--class", "a", "-o", str(tmp_path / "s"))
    assert result.code == 0, result.stderr
    h = load_histogram(tmp_path / "s" / "a.hist")
    assert h.counts.sum(axis=1).tolist() == [20, 20] and h.meta["synthetic"] is True


def test_reduce_decode_only(tmp_path: Path) -> None:
    resp = {"usage": {"prompt_tokens": 2, "completion_tokens": 3},
            "choices": [{"routed_experts": _b64(IDS)}]}  # 4 rows = 2 prefill + 2 decode
    (tmp_path / "r.jsonl").write_text(json.dumps(resp) + "\n")
    result = invoke("rowmap", "reduce", str(tmp_path / "r.jsonl"), "--experts", "4",
                    "-o", str(tmp_path / "all.hist"))
    assert result.code == 0, result.stderr
    assert "(2 prefill + 2 decode)" in result.stdout
    result = invoke("rowmap", "reduce", str(tmp_path / "r.jsonl"), "--experts", "4",
                    "--decode-only", "-o", str(tmp_path / "dec.hist"))
    assert result.code == 0, result.stderr
    h = load_histogram(tmp_path / "dec.hist")
    # rows 2 and 3 of IDS: [[0,2],[3,2]] and [[0,3],[3,1]]
    assert h.counts.tolist() == [[2, 0, 1, 1], [0, 1, 1, 2]] and h.decode_tokens == 2
    np.save(tmp_path / "a.npy", IDS)
    result = invoke("rowmap", "build", str(tmp_path / "a.npy"), "--experts", "4", "--layers",
                    "0-1", "--hot", "2", "--decode-only", "-o", str(tmp_path / "m.rowmap"))
    assert result.code == 2 and "no prompt/decode split" in result.stderr


def _qwen_project(root: Path) -> Path:
    """The Qwen3-30B-A3B RTX 4090 recipe with its histogram and map, in a project of its own."""
    repo = Path(__file__).resolve().parent.parent / "recipes"
    (root / "recipes" / "maps" / "qwen3-30b-a3b").mkdir(parents=True)
    (root / "recipes" / "profiles" / "qwen3-30b-a3b").mkdir(parents=True)
    for rel in ("maps/qwen3-30b-a3b/chat.rowmap", "profiles/qwen3-30b-a3b/chat.hist"):
        (root / "recipes" / rel).write_bytes((repo / rel).read_bytes())
    recipe = root / "recipes" / "q.yaml"
    recipe.write_text((repo / "qwen3-30b-a3b-rtx4090.yaml").read_text()
                      .replace("hot_experts_per_layer: 20 ", "hot_experts_per_layer: 24 ")
                      .replace("\nname: qwen3-30b-a3b-rtx4090\n", "\nname: q\n"))  # the file's name
    return recipe


@pytest.mark.parametrize("map_state", ["stale", "missing"])
def test_build_for_a_recipe_invalid_only_because_of_its_map(tmp_path: Path, map_state: str) -> None:
    """The recipe asks for 24 hot per layer; its map holds 20 (or is not there yet). The recipe is
    invalid until the map is built — and `rowmap build --recipe` must build it."""
    recipe = _qwen_project(tmp_path)
    rowmap = tmp_path / "recipes" / "maps" / "qwen3-30b-a3b" / "chat.rowmap"
    if map_state == "missing":
        rowmap.unlink()
    result = invoke("check", "recipe", str(recipe))
    assert result.code == 2, result.stderr
    assert "disagrees with the budget" in result.stderr or "file not found" in result.stderr, result.stderr
    hist = tmp_path / "recipes" / "profiles" / "qwen3-30b-a3b" / "chat.hist"
    result = invoke("rowmap", "build", str(hist), "--hot", "24", "--recipe", str(recipe), "-o", str(rowmap))
    assert result.code == 0, result.stderr
    assert load_rowmap(rowmap).hot_counts() == [24] * 48
    result = invoke("check", "budgets", str(recipe))
    assert result.code == 0, result.stderr


def test_build_with_a_recipe_still_reports_a_broken_recipe(tmp_path: Path) -> None:
    """Only the map's own checks are skipped: a recipe that is broken elsewhere still fails, naming it."""
    recipe = _qwen_project(tmp_path)
    recipe.write_text(recipe.read_text().replace("max_model_len: 32768", "max_model_len: lots"))
    hist = tmp_path / "recipes" / "profiles" / "qwen3-30b-a3b" / "chat.hist"
    result = invoke("rowmap", "build", str(hist), "--hot", "24", "--recipe", str(recipe),
                    "-o", str(tmp_path / "m.rowmap"))
    assert result.code == 2 and "max_model_len" in result.stderr, result.stderr
