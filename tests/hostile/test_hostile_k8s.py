"""Kubernetes expands `$(VAR)` in container args and env values (and reads `$$` as `$`): a recipe
value must reach the pod exactly as written, like it reaches a compose container; only the
references recipegen adds itself (leader address, worker index) are expanded."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from recipegen.k8s.render import render_k8s
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "dsv41-flash-gb300x2-pp2.yaml"
HOSTILE = ["$(HF_TOKEN)", "pa$$word", "${HF_TOKEN}", "$$(LWS_LEADER_ADDRESS)", "a$", "$((1+1))"]


def kubernetes_expand(text: str, variables: dict[str, str]) -> str:
    """Kubernetes' expansion of args/env values, written from its documented rules: `$$` is a
    literal `$`, `$(NAME)` is the variable's value (kept as written when undefined), any other
    `$` stays as it is."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif (m := re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)").match(text, i)):
            out.append(variables.get(m.group(1), m.group(0)))
            i = m.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _containers() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    lane = doc["lanes"][0]
    lane["env"] = {f"NOTE_{i}": value for i, value in enumerate(HOSTILE)}
    lane["extra_args"] = ["--chat-template", " ".join(HOSTILE)]
    loaded = load_recipe(RECIPE, text=yaml.safe_dump(doc, sort_keys=False))
    (body,) = render_k8s(loaded, REPO).values()
    lws = next(d for d in yaml.safe_load_all(body.decode()) if d["kind"] == "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    return [template[t]["spec"]["containers"][0] for t in ("leaderTemplate", "workerTemplate")]


def test_recipe_values_reach_the_pod_as_written() -> None:
    pod_env = {"HF_TOKEN": "hf_secret", "LWS_LEADER_ADDRESS": "10.0.0.1", "LWS_WORKER_INDEX": "1"}
    for container in _containers():
        env = {e["name"]: e.get("value") for e in container["env"]}
        for i, value in enumerate(HOSTILE):
            assert kubernetes_expand(env[f"NOTE_{i}"], pod_env) == value
        args = [kubernetes_expand(a, pod_env) for a in container["args"]]
        assert args[args.index("--chat-template") + 1] == " ".join(HOSTILE)
        assert "hf_secret" not in " ".join(args + [kubernetes_expand(v or "", pod_env)
                                                   for v in env.values()])
        # recipegen's own references are still expanded by Kubernetes
        assert args[args.index("--master-addr") + 1] == "10.0.0.1"


def _host_paths(checkpoint: str | None) -> list[str]:
    doc = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    if checkpoint is not None:
        doc["model"]["checkpoint"] = checkpoint
    loaded = load_recipe(RECIPE, text=yaml.safe_dump(doc, sort_keys=False))
    (body,) = render_k8s(loaded, REPO).values()
    lws = next(d for d in yaml.safe_load_all(body.decode()) if d["kind"] == "LeaderWorkerSet")
    volumes = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["volumes"]
    return [v["hostPath"]["path"] for v in volumes if "hostPath" in v]


def test_a_checkpoint_path_is_its_text_in_host_paths() -> None:
    # compose.yaml keeps a recipe's `${X:-…}` literal (written `$${X:-…}`); the hostPath did not: it
    # took the default, `/${X:-root/.ssh}` mounting /root/.ssh
    for checkpoint in ("/${X:-root/.ssh}", "/data/${X:-/etc}", "/data/a$b$$c"):
        assert checkpoint in _host_paths(checkpoint)
    # recipegen's own interpolation still resolves to its default: the models folder
    assert any(p.startswith("/srv/models/") for p in _host_paths(None))
