"""The chart checks its policy value with the controller's loader at install: a
pre-install/pre-upgrade hook Job (its own hook ConfigMap, weights, delete policy) and an
initContainer on the controller, both running ``drahealth policy check`` as the image's
entrypoint would; a bad policy fails them with the loader's one-line error."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from drahealth.cli import main
from tests.deploy._render import CHART, render
from tests.deploy.test_chart import _restricted_violations, by_kind, docs, nvidia_values, one

MOUNT = "/etc/drahealth"


def hook_parts(manifests: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    cm = one(manifests, "ConfigMap", "-controller-policy-check")
    [job] = by_kind(manifests, "Job")
    return cm, job


def run_check(args: list[str], mounts: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    """Run a container's args with the image's entrypoint (``drahealth``), the files its
    volume mounts would show placed under ``tmp_path``."""
    for name, text in mounts.items():
        (tmp_path / name).write_text(text)
    local = [a.replace(MOUNT, str(tmp_path)) for a in args]
    result = CliRunner().invoke(main, local)
    return result.exit_code, result.stdout + result.stderr


def test_the_hook_job_checks_the_same_policy_before_install_and_upgrade() -> None:
    manifests = docs()
    cm, job = hook_parts(manifests)
    policy_cm = one(manifests, "ConfigMap", "-controller-policy")
    assert cm["data"]["policy.yaml"] == policy_cm["data"]["policy.yaml"]
    for obj, weight in ((cm, "-10"), (job, "-5")):  # the ConfigMap exists before the Job
        notes = obj["metadata"]["annotations"]
        assert notes["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert notes["helm.sh/hook-weight"] == weight
        # kept when it fails (its logs), replaced by the next attempt
        assert notes["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 120
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert _restricted_violations(pod) == []
    [c] = pod["containers"]
    assert c["args"] == ["policy", "check", f"{MOUNT}/policy.yaml"]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert c["volumeMounts"][0]["mountPath"] == MOUNT
    assert pod["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]


def test_the_controller_checks_its_policy_in_an_init_container() -> None:
    deployment = one(docs(), "Deployment", "-controller")
    pod = deployment["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert init["args"] == ["policy", "check", f"{MOUNT}/policy.yaml"]
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    [mount] = init["volumeMounts"]
    assert (mount["name"], mount["mountPath"]) == ("policy", MOUNT)
    assert init["image"] == pod["containers"][0]["image"]
    assert _restricted_violations(pod) == []


@pytest.mark.parametrize("values", ["default", "nvidia"])
def test_the_shipped_policies_pass_the_check(values: str, tmp_path: Path) -> None:
    manifests = docs(nvidia_values() if values == "nvidia" else None)
    cm, job = hook_parts(manifests)
    [c] = job["spec"]["template"]["spec"]["containers"]
    code, out = run_check(c["args"], cm["data"], tmp_path)
    assert code == 0, out
    assert "valid" in out


def test_a_bad_policy_fails_the_hook_and_the_init_container_with_the_loaders_error(
    tmp_path: Path,
) -> None:
    default = yaml.safe_load((CHART / "values.yaml").read_text())
    policy = copy.deepcopy(default["controller"]["policy"])
    policy["rules"][0]["action"]["effect"] = "Sometimes"
    manifests = docs({"controller": {"policy": policy}})  # the chart itself renders
    cm, job = hook_parts(manifests)
    [c] = job["spec"]["template"]["spec"]["containers"]
    code, out = run_check(c["args"], cm["data"], tmp_path)
    assert code == 1
    assert out == (
        f"error: {tmp_path}/policy.yaml: rules[0].action.effect: Invalid enum value 'Sometimes'\n"
    )
    [init] = one(manifests, "Deployment", "-controller")["spec"]["template"]["spec"][
        "initContainers"
    ]
    policy_cm = one(manifests, "ConfigMap", "-controller-policy")
    assert run_check(init["args"], policy_cm["data"], tmp_path)[0] == 1


def test_both_checks_can_be_turned_off() -> None:
    manifests = docs({"controller": {"policyCheck": {"hook": False, "initContainer": False}}})
    assert not by_kind(manifests, "Job")
    assert not [d for d in manifests if d["metadata"]["name"].endswith("-policy-check")]
    pod = one(manifests, "Deployment", "-controller")["spec"]["template"]["spec"]
    assert "initContainers" not in pod


def test_policy_check_values_are_schema_checked() -> None:
    with pytest.raises(render.TemplateError, match="policyCheck"):
        docs({"controller": {"policyCheck": {"hooks": True}}})
    with pytest.raises(render.TemplateError, match="activeDeadlineSeconds"):
        docs({"controller": {"policyCheck": {"activeDeadlineSeconds": 0}}})


def test_no_hook_without_the_controller() -> None:
    manifests = docs({"controller": {"enabled": False}})
    assert not by_kind(manifests, "Job")
