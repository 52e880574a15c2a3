"""The ``run_policy`` section: which config keys a run of a deployment may change (from the Prefect UI's "Custom
run" form or the API), and under which directories a path it changes must lie.

A deployment's config is set at deploy time by the operator (``mclpipe deploy CONFIG --set ...``). Whoever may
start a run of it (anyone the Prefect server lets in) sends a whole config with the run; the flow compares it,
before any compute (``flows/run_parameters.py``), with the config stored in the deployment and refuses the run
when it changes a key this section, *as stored in the deployment*, does not allow. So a run cannot give itself
more: its own ``run_policy`` is one more key it may not change.

Some keys are never overridable, whatever the operator writes (``OPERATOR_ONLY``): what runs as shell on the
cluster or picks the code, image, volumes, identity and output location of a run, and where its results and
credentials go. A policy that allows one of them is refused when the config validates, so at deploy time.
"""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path, PurePath

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contrastive.errors import ConfigError

#: What a run may change unless the operator says otherwise: seeds, epochs, learning rates, the cluster counts K
#: (also per stage), evaluation settings and the data paths (under ``path_roots``). A key a modality does not have
#: is never changed, so one list serves every modality.
DEFAULT_OVERRIDABLE = [
    "seed", "train.epochs", "train.lr", "mcl.clusters", "mcl.num_stages",
    "stage_overrides.*.train.epochs", "stage_overrides.*.train.lr", "eval",
    "data.cache_dir", "data.image_folder.source", "data.image_folder.labels_csv", "data.files",
]

#: Never overridable by a run: shell lines and options of the batch script, the interpreter, the container image,
#: volumes, service account and credentials of the pods, where outputs go and where tracking (with the
#: credentials from the environment) is sent, and this policy itself.
OPERATOR_ONLY = [
    "run_policy", "output_dir", "tracking.uri",
    "launcher.slurm.setup", "launcher.slurm.extra_sbatch", "launcher.slurm.python",
    "launcher.slurm.container_image", "launcher.slurm.container_mounts",
    "launcher.kubernetes.image", "launcher.kubernetes.volume_claim", "launcher.kubernetes.mount_path",
    "launcher.kubernetes.service_account", "launcher.kubernetes.image_pull_secret",
    "launcher.kubernetes.kubeconfig", "launcher.kubernetes.context", "launcher.kubernetes.namespace",
]

_PATTERN = re.compile(r"[A-Za-z0-9_*?\[\]-]+(\.[A-Za-z0-9_*?\[\]-]+)*")
_MISSING = object()


def allows(pattern: str, key: str) -> bool:
    """Whether ``pattern`` (a dotted key, ``*`` for any part) covers ``key``: the key itself or a key inside it
    (``train`` covers ``train.epochs``)."""
    return fnmatch.fnmatchcase(key, pattern) or fnmatch.fnmatchcase(key, pattern + ".*")


class RunPolicyConfig(BaseModel):
    """Which keys a run of this config's deployment may change (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    overridable: list[str] = Field(default_factory=lambda: list(DEFAULT_OVERRIDABLE), description=(
        "config keys a run of the deployment may change (UI 'Custom run', API); 'train' allows every key under it, "
        "'*' any one part (stage_overrides.*.train.epochs). Fixed at deploy time; shell, image, volume, output and "
        "tracking keys can never be listed"))
    path_roots: list[str] = Field(default_factory=lambda: ["data"], description=(
        "a path a run changes must resolve (symlinks and '..' followed) under one of these directories; relative "
        "ones are relative to the flow's working directory"))

    @field_validator("overridable")
    @classmethod
    def _no_operator_key(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not _PATTERN.fullmatch(pattern):
                raise ValueError(f"{pattern!r} is not a config key pattern: dotted keys, '*' for any part, e.g. "
                                 "train.epochs or stage_overrides.*.train.lr")
            for key in OPERATOR_ONLY:
                if allows(pattern, key) or allows(key, pattern):
                    raise ValueError(f"{pattern!r} would let a run change {key}, which only the operator sets at "
                                     f"deploy time (it reaches a shell, the image or where results and credentials "
                                     f"go): list narrower keys")
        return value

    @field_validator("path_roots")
    @classmethod
    def _roots(cls, value: list[str]) -> list[str]:
        for root in value:
            if not root.strip() or re.search(r"[\x00-\x1f\x7f]", root):
                raise ValueError(f"path root {root!r} is empty or holds control characters: give a directory")
        return value


def _flat(value, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix.removesuffix("."): value}


def changed_keys(*, deployed: BaseModel, run: BaseModel) -> list[str]:
    """The dotted keys whose values differ between two configs (a key only one of them has included)."""
    before, after = _flat(deployed.model_dump(mode="json")), _flat(run.model_dump(mode="json"))
    return sorted(key for key in before.keys() | after.keys()
                  if before.get(key, _MISSING) != after.get(key, _MISSING))


def _value_at(config: BaseModel, key: str):
    node = config
    for part in key.split("."):
        node = node.get(part, _MISSING) if isinstance(node, dict) else getattr(node, part, _MISSING)
        if node is _MISSING:
            return None
    return node


def path_under_roots(path: PurePath, roots: list[str]) -> Path | None:
    """The root ``path`` lies under once both are resolved (symlinks followed, '..' collapsed), else None."""
    resolved = Path(path).resolve()
    for root in roots:
        base = Path(root).resolve()
        if resolved == base or base in resolved.parents:
            return base
    return None


def check_overrides(*, deployed, run, deployment: str) -> None:
    """Refuse a run whose config changes a key the deployed config's ``run_policy`` does not allow, or a path
    outside its ``path_roots``; one line naming the key and the fix. ``deployed``: the config stored in the
    deployment (its policy is the one that counts), ``run``: the config the run was started with."""
    policy = deployed.run_policy
    changed = changed_keys(deployed=deployed, run=run)
    refused = [key for key in changed if not any(allows(p, key) for p in policy.overridable)
               or any(allows(k, key) for k in OPERATOR_ONLY)]
    if refused:
        more = f" (and {', '.join(refused[1:])})" if refused[1:] else ""
        raise ConfigError(f"this run of deployment {deployment!r} changes {refused[0]}{more}, which the deployment "
                          f"fixes: a run may change only {', '.join(policy.overridable) or 'nothing'}; start it "
                          f"without that change, or ask the operator to redeploy with it (mclpipe deploy ... --set "
                          f"{refused[0]}=...) or to list it in run_policy.overridable")
    for key in changed:
        value = _value_at(run, key)
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, PurePath) and path_under_roots(path, policy.path_roots) is None:
                raise ConfigError(f"this run of deployment {deployment!r} sets {key}={str(path)!r}, which resolves "
                                  f"to {Path(path).resolve()}, outside the allowed roots "
                                  f"({', '.join(str(Path(r).resolve()) for r in policy.path_roots) or 'none'}): "
                                  "use a path under one of them, or ask the operator to add its directory to "
                                  "run_policy.path_roots")
