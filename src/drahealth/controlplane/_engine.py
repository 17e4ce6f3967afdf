"""Object operations with Kubernetes semantics, independent of HTTP.

Owns get/list/create/update/patch/apply/delete/evict on top of the ``Store``:
preconditions (resourceVersion, uid), name generation, namespace existence,
finalizers and ``deletionTimestamp``, status-subresource isolation (via
``_strategy``), validation (via ``_validate``), field ownership (via ``_apply``),
no-op detection (an update that changes nothing keeps the resourceVersion) and the
PodDisruptionBudget status kept in step with pods, and SelfSubjectAccessReviews
(answered, never stored). What is dropped and validated follows the engine's release
profile. Every failure is an ``APIError`` carrying the ``Status`` the real server would
answer.

Simplifications: ``gracePeriodSeconds`` is treated as 0 (a pod without finalizers is
removed at once); ``propagationPolicy`` is accepted and ignored (there is no garbage
collector); deleting a namespace deletes its objects immediately (objects with
finalizers get ``deletionTimestamp`` and stay until their finalizers are removed).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

from drahealth._time import now_rfc3339
from drahealth.core import KubeProfile, with_pod_condition

from . import _apply, _status
from ._decode import DecodeError, TooLarge, check_object
from ._eviction import check_eviction, eviction_condition, pdb_status
from ._patch import PatchError, PatchTooLarge, json_patch, merge_patch, strategic_merge
from ._resources import PRIMITIVE_MERGE_LISTS, Registry, ResourceType, lookup, registry
from ._selectors import FieldSelector, LabelSelector
from ._status import APIError, cause
from ._store import Store
from ._strategy import prepare_create, prepare_update
from ._table import format_label_selector
from ._validate import (
    invalid_value,
    is_unknown_field,
    object_causes,
    prune_unknown,
    strict_decoding_message,
)

JSON = dict[str, Any]
#: ``spec.replicas`` is an int32 upstream.
INT32_MAX = 2**31 - 1


def replicas_causes(rt: ResourceType, obj: JSON) -> list[JSON]:
    """``spec.replicas`` of a kind with a ``scale`` subresource: an int32 (upstream's field
    type) and not negative (upstream's ``ValidateNonnegativeField``)."""
    spec = obj.get("spec")
    if "scale" not in rt.subresources or not isinstance(spec, dict):
        return []
    value = spec.get("replicas")
    if isinstance(value, bool) or not isinstance(value, int):
        return []  # absent (defaulted) or not a number: the type check reports it
    if value > INT32_MAX or value < -INT32_MAX - 1:
        detail = f"must be an int32 (at most {INT32_MAX})"
        return [invalid_value("spec.replicas", value, detail)]
    if value < 0:
        return [invalid_value("spec.replicas", value, "must be greater than or equal to 0")]
    return []


def _must(group: str, version: str, plural: str) -> ResourceType:
    rt = lookup(group, version, plural)
    if rt is None:  # pragma: no cover - registry constant
        raise LookupError(plural)
    return rt


NAMESPACES = _must("", "v1", "namespaces")
PODS = _must("", "v1", "pods")
PDBS = _must("policy", "v1", "poddisruptionbudgets")

PROTECTED_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
#: The reason of every SelfSubjectAccessReview answer: there is no authorizer.

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
PATCH_TYPES = (JSON_PATCH, MERGE, APPLY, STRATEGIC)


@dataclass
class WriteOptions:
    """Per-request write options (query parameters and the caller's identity)."""

    manager: str = "unknown"
    dry_run: bool = False
    field_validation: str = "Strict"
    force: bool = False
    warnings: list[str] = field(default_factory=list)


def _scale_of(obj: JSON) -> JSON:
    """The ``autoscaling/v1`` Scale of a workload with ``spec.replicas``."""
    meta = obj["metadata"]
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    scale_meta = {
        k: meta[k]
        for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
        if k in meta
    }
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": scale_meta,
        "spec": {"replicas": spec.get("replicas", 1)},
        "status": {
            "replicas": status.get("replicas", 0),
            "selector": format_label_selector(spec.get("selector"), none=""),
        },
    }


def _meta(obj: JSON) -> JSON:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _sets(path: tuple[str, ...]) -> bool:
    return path in PRIMITIVE_MERGE_LISTS


class Engine:
    """The object operations; one per API server, sharing its ``Store``."""

    def __init__(self, store: Store, profile: KubeProfile | None = None) -> None:
        self.store = store
        #: The release whose gates decide dropped fields and validation (None: newest).
        self.profile = profile
        self.registry: Registry = registry(profile)

    # ------------------------------------------------------------------ reads

    def get(self, rt: ResourceType, ns: str | None, name: str) -> JSON:
        obj = self.store.get(rt.key, ns or "", name)
        if obj is None:
            raise _status.not_found(rt.plural, rt.group, name)
        return obj

    def select(
        self, rt: ResourceType, ns: str | None, labels: LabelSelector, fields: FieldSelector
    ) -> list[JSON]:
        return [
            o
            for o in self.store.objects(rt.key, ns)
            if labels.matches(_meta(o).get("labels")) and fields.matches(o)
        ]

    # ------------------------------------------------------------------ helpers

    def _require_namespace(self, rt: ResourceType, ns: str | None) -> None:
        if rt.namespaced and self.store.get(NAMESPACES.key, "", ns or "") is None:
            raise _status.not_found("namespaces", "", ns or "")

    def _check_type(self, rt: ResourceType, body: JSON, name: str) -> None:
        causes = []
        av, kind = body.get("apiVersion"), body.get("kind")
        if av not in (None, "", rt.api_version):
            causes.append(
                cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{av}": must be {rt.api_version}',
                    "apiVersion",
                )
            )
        if kind not in (None, "", rt.kind):
            causes.append(
                cause("FieldValueInvalid", f'Invalid value: "{kind}": must be {rt.kind}', "kind")
            )
        if causes:  # the real server's decoder refuses the body before validation
            raise _status.bad_request(
                f"the object's {' and '.join(c['field'] for c in causes)} does not match the "
                f"{rt.api_version} {rt.kind} the request is for: "
                + "; ".join(str(c["message"]) for c in causes)
            )

    def _check_namespace(self, rt: ResourceType, body: JSON, ns: str | None, name: str) -> None:
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _status.invalid(
                rt.kind,
                rt.group,
                name,
                [cause("FieldValueTypeInvalid", "must be an object", "metadata")],
            )
        if not rt.namespaced:
            return
        given = meta.get("namespace")
        if given not in (None, "") and given != ns:
            raise _status.bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        meta["namespace"] = ns

    @staticmethod
    def _prune(rt: ResourceType, obj: JSON, opts: WriteOptions) -> None:
        """Under ``fieldValidation=Ignore``/``Warn`` drop unknown fields (Warn warns)."""
        if opts.field_validation == "Strict":
            return
        dropped = prune_unknown(obj, rt.model)
        if opts.field_validation == "Warn":
            opts.warnings.extend(f'unknown field "{path}"' for path in dropped)

    @staticmethod
    def _storable(obj: JSON) -> None:
        """Only objects the response encoder can encode, within the size limits, are stored."""
        try:
            check_object(obj)
        except TooLarge as e:
            raise APIError(_status.status(413, str(e), "RequestEntityTooLarge")) from e
        except DecodeError as e:
            raise _status.bad_request(str(e)) from e

    def _validate(
        self, rt: ResourceType, obj: JSON, opts: WriteOptions, old: JSON | None = None
    ) -> None:
        ns = self.store.get(NAMESPACES.key, "", _meta(obj).get("namespace") or "")
        causes = object_causes(rt, obj, self.profile, old=old, namespace=ns)
        wrong = [c for c in causes if c.get("reason") == "FieldValueTypeInvalid"]
        if wrong:  # the real server's decoder refuses these before validation runs
            raise _status.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                + "; ".join(f"{c['field']}: {c['message']}" for c in wrong)
            )
        causes += [c for c in replicas_causes(rt, obj) if c not in causes]
        unknown = [c for c in causes if is_unknown_field(c)]
        if opts.field_validation in ("Ignore", "Warn"):
            if opts.field_validation == "Warn":
                opts.warnings.extend(c["message"] for c in unknown)
            causes = [c for c in causes if c not in unknown]
        elif unknown:  # Strict: the decoder refuses the body before validation runs
            raise _status.bad_request(strict_decoding_message(rt, unknown))
        if causes:
            # a review's kind is empty when upstream's REST refuses it
            kind = rt.kind if "get" in rt.verbs else ""
            # events.k8s.io Events are validated as the core Event they are stored as
            group = "" if (rt.group, rt.kind) == ("events.k8s.io", "Event") else rt.group
            raise _status.invalid(kind, group, _meta(obj).get("name", ""), causes)

    def _track(
        self,
        rt: ResourceType,
        old: JSON | None,
        new: JSON,
        sub: str | None,
        opts: WriteOptions,
        now: str,
    ) -> JSON:
        return _apply.track_update(
            old,
            new,
            opts.manager,
            api_version=rt.api_version,
            subresource=sub,
            has_status=rt.has_status,
            keys=rt.merge_key,
            sets=_sets,
            now=now,
        )

    # ------------------------------------------------------------------ create

    def create(
        self,
        rt: ResourceType,
        ns: str | None,
        body: JSON,
        opts: WriteOptions,
        *,
        tracked: bool = False,
    ) -> JSON:
        body = copy.deepcopy(body)
        self._check_type(rt, body, str(_meta(body).get("name", "")))
        self._check_namespace(rt, body, ns, str(_meta(body).get("name", "")))
        if not tracked:
            self._prune(rt, body, opts)
        meta = body["metadata"]
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix or not isinstance(prefix, str):
                raise _status.invalid(
                    rt.kind,
                    rt.group,
                    "",
                    [
                        cause(
                            "FieldValueRequired",
                            "Required value: name or generateName is required",
                            "metadata.name",
                        )
                    ],
                )
            while True:
                meta["name"] = prefix + "".join(random.choices(_NAME_ALPHABET, k=5))
                if self.store.get(rt.key, ns or "", meta["name"]) is None:
                    break
        name = meta["name"]
        if not isinstance(name, str):
            raise _status.invalid(
                rt.kind,
                rt.group,
                "",
                [cause("FieldValueTypeInvalid", "must be a string", "metadata.name")],
            )
        now = now_rfc3339()
        obj = prepare_create(rt, body, now, self.profile)
        if not tracked:
            obj = self._track(rt, None, obj, None, opts, now)
        # as the real server: validation, then the namespace (admission), then the store
        self._validate(rt, obj, opts)
        self._require_namespace(rt, ns)
        if self.store.get(rt.key, ns or "", name) is not None:
            raise _status.already_exists(rt.plural, rt.group, name)
        self._storable(obj)
        if opts.dry_run:
            return obj
        obj = self.store.create(rt.key, obj)
        self._after_write(rt, ns)
        return obj

    # ------------------------------------------------------------------ update / patch

    def update(
        self,
        rt: ResourceType,
        ns: str | None,
        name: str,
        body: JSON,
        sub: str | None,
        opts: WriteOptions,
    ) -> JSON:
        body = copy.deepcopy(body)
        self._check_type(rt, body, name)
        self._check_namespace(rt, body, ns, name)
        given = body["metadata"].get("name")
        if given != name:
            raise _status.bad_request(
                f"the name of the object ({given}) does not match the name on the URL ({name})"
            )
        old = self.get(rt, ns, name)
        return self._commit(rt, old, body, sub, opts)

    def patch(
        self,
        rt: ResourceType,
        ns: str | None,
        name: str,
        ptype: str,
        body: Any,
        sub: str | None,
        opts: WriteOptions,
    ) -> tuple[JSON, bool]:
        """Apply a patch; returns the object and whether it was created (apply only)."""
        if ptype == APPLY:
            return self._apply(rt, ns, name, body, sub, opts)
        old = self.get(rt, ns, name)
        try:
            if ptype == MERGE:
                if not isinstance(body, dict):
                    raise _status.bad_request(
                        "json: cannot unmarshal array into Go value of type map[string]interface {}"
                    )
                candidate = merge_patch(old, body)
            elif ptype == JSON_PATCH:
                candidate = json_patch(old, body)
            else:
                if not isinstance(body, dict):
                    raise PatchError("a strategic merge patch must be a JSON object")
                candidate = strategic_merge(old, body, rt.merge_key, _sets, ordered=True)
        except PatchTooLarge as e:
            raise APIError(_status.status(413, str(e), "RequestEntityTooLarge")) from e
        except PatchError as e:
            raise APIError(_status.status(422, str(e))) from e
        if not isinstance(candidate, dict):
            raise APIError(_status.status(422, "the patched object is not a JSON object"))
        self._check_type(rt, candidate, name)
        cmeta = _meta(candidate)
        if cmeta.get("name") != name or (rt.namespaced and cmeta.get("namespace") != ns):
            raise _status.bad_request("the patch must not change metadata.name or namespace")
        return self._commit(rt, old, candidate, sub, opts), False

    def _apply(
        self,
        rt: ResourceType,
        ns: str | None,
        name: str,
        body: Any,
        sub: str | None,
        opts: WriteOptions,
    ) -> tuple[JSON, bool]:
        if not opts.manager:
            raise APIError(
                _status.status(
                    422,
                    'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                    "is required for apply patch",
                    "Invalid",
                    name="",
                    group="meta.k8s.io",
                    kind="PatchOptions",
                    causes=[
                        cause(
                            "FieldValueRequired",
                            "Required value: is required for apply patch",
                            "fieldManager",
                        )
                    ],
                )
            )
        if not isinstance(body, dict):
            raise _status.bad_request("an apply patch must be a YAML or JSON object")
        if not body.get("apiVersion") or not body.get("kind"):
            missing = "apiVersion" if not body.get("apiVersion") else "kind"
            raise _status.bad_request(
                f"invalid object type: {missing} must be set in an apply configuration"
            )
        body = copy.deepcopy(body)
        self._check_type(rt, body, name)
        self._check_namespace(rt, body, ns, name)
        self._prune(rt, body, opts)
        meta = body["metadata"]
        if meta.get("name") not in (None, name):
            raise _status.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on "
                f"the URL ({name})"
            )
        meta["name"] = name
        now = now_rfc3339()
        old = self.store.get(rt.key, ns or "", name)
        try:
            candidate = _apply.apply(
                old or {},
                body,
                opts.manager,
                force=opts.force,
                api_version=rt.api_version,
                subresource=sub,
                has_status=rt.has_status,
                keys=rt.merge_key,
                sets=_sets,
                now=now,
            )
        except _apply.ApplyConflict as e:
            causes = [
                cause(
                    "FieldManagerConflict",
                    f'conflict with "{c.manager}" using {c.api_version}',
                    _apply.pretty(c.path),
                )
                for c in e.conflicts
            ]
            raise APIError(_status.status(409, str(e), "Conflict", causes=causes)) from e
        except PatchError as e:
            raise APIError(_status.status(422, str(e))) from e
        if old is None:
            if sub is not None:
                raise _status.not_found(rt.plural, rt.group, name)
            return self.create(rt, ns, candidate, opts, tracked=True), True
        return self._commit(rt, old, candidate, sub, opts, tracked=True), False

    def _commit(
        self,
        rt: ResourceType,
        old: JSON,
        candidate: JSON,
        sub: str | None,
        opts: WriteOptions,
        *,
        tracked: bool = False,
    ) -> JSON:
        name = str(_meta(old).get("name"))
        self._storable(candidate)  # bounds the work below before it starts
        if not tracked:
            self._prune(rt, candidate, opts)
        want_rv = _meta(candidate).get("resourceVersion")
        have_rv = _meta(old).get("resourceVersion")
        if want_rv not in (None, "") and str(want_rv) != have_rv:
            raise _status.conflict(
                rt.plural,
                rt.group,
                name,
                "the object has been modified; please apply your changes to the latest "
                "version and try again",
            )
        now = now_rfc3339()
        new = prepare_update(rt, old, candidate, sub, now, self.profile)
        if not tracked:
            new = self._track(rt, old, new, sub, opts, now)
        new["metadata"]["resourceVersion"] = have_rv
        self._validate(rt, new, opts, old)
        self._storable(new)
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            if opts.dry_run:
                return new
            gone = self.store.delete(rt.key, new)
            self._after_write(rt, meta.get("namespace"))
            return gone
        if new == old or opts.dry_run:
            return new
        new = self.store.update(rt.key, new)
        self._after_write(rt, meta.get("namespace"))
        return new

    # ------------------------------------------------------------------ delete

    def delete(
        self, rt: ResourceType, ns: str | None, name: str, options: JSON, opts: WriteOptions
    ) -> JSON:
        old = self.get(rt, ns, name)
        self._check_preconditions(rt, old, options)
        if rt is NAMESPACES and name in PROTECTED_NAMESPACES:
            raise APIError(
                _status.status(
                    403,
                    f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                    "Forbidden",
                    name=name,
                    kind="namespaces",
                )
            )
        if opts.dry_run:
            return old
        return self._delete(rt, old)

    def _check_preconditions(self, rt: ResourceType, old: JSON, options: JSON) -> None:
        """A delete's ``preconditions`` (uid, resourceVersion) against the stored object."""
        name = str(_meta(old).get("name"))
        pre = options.get("preconditions") or {}
        meta = _meta(old)
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise _status.conflict(
                rt.kind,
                rt.group,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: "
                f"{meta.get('uid')}",
            )
        if pre.get("resourceVersion") and str(pre["resourceVersion"]) != meta.get(
            "resourceVersion"
        ):
            raise _status.conflict(
                rt.kind,
                rt.group,
                name,
                f"Precondition failed: ResourceVersion in precondition: "
                f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                f"{meta.get('resourceVersion')}",
            )

    def _delete(self, rt: ResourceType, old: JSON) -> JSON:
        meta = _meta(old)
        ns = meta.get("namespace")
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return old
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = now_rfc3339()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if rt is NAMESPACES:
                new.setdefault("status", {})["phase"] = "Terminating"
            new = self.store.update(rt.key, new)
            self._after_write(rt, ns)
            return new
        if rt is NAMESPACES:
            kinds = {r.key: r for r in self.registry.resources if r.namespaced}
            for other in kinds.values():
                for obj in self.store.objects(other.key, str(meta.get("name"))):
                    self._delete(other, obj)
        gone = self.store.delete(rt.key, old)
        self._after_write(rt, ns)
        return gone

    def delete_collection(
        self,
        rt: ResourceType,
        ns: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        opts: WriteOptions,
    ) -> list[JSON]:
        out = []
        for obj in self.select(rt, ns, labels, fields):
            if rt is NAMESPACES and _meta(obj).get("name") in PROTECTED_NAMESPACES:
                continue
            out.append(obj if opts.dry_run else self._delete(rt, obj))
        return out

    # ------------------------------------------------------------------ access reviews

    def access_review(self, rt: ResourceType, body: JSON, opts: WriteOptions) -> JSON:
        """A SelfSubjectAccessReview answered (never stored): every request is allowed."""
        body = copy.deepcopy(body)
        self._check_type(rt, body, "")
        self._check_namespace(rt, body, None, "")
        self._prune(rt, body, opts)
        self._validate(rt, body, opts)
        meta = body["metadata"]
        # every caller is an administrator (as system:masters, whose short-circuit
        # authorizer gives no reason)
        return {
            "kind": rt.kind,
            "apiVersion": rt.api_version,
            "metadata": meta,
            "spec": body.get("spec") or {},
            "status": {"allowed": True},
        }

    # ------------------------------------------------------------------ scale

    def scale(self, rt: ResourceType, ns: str | None, name: str) -> JSON:
        """The ``autoscaling/v1`` Scale of a workload (its ``scale`` subresource)."""
        return _scale_of(self.get(rt, ns, name))

    def update_scale(
        self, rt: ResourceType, ns: str | None, name: str, body: Any, opts: WriteOptions
    ) -> JSON:
        """Write a Scale: only ``spec.replicas`` reaches the workload (upstream's
        scale REST), with the Scale's resourceVersion as a precondition."""
        if (
            not isinstance(body, dict)
            or body.get("kind") != "Scale"
            or body.get("apiVersion") != "autoscaling/v1"
        ):
            raise _status.bad_request("the body must be an autoscaling/v1 Scale")
        meta = _meta(body)
        if meta.get("name") not in (None, name):
            raise _status.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on "
                f"the URL ({name})"
            )
        replicas = (body.get("spec") or {}).get("replicas", 0)
        if (
            isinstance(replicas, bool)
            or not isinstance(replicas, int)
            or not 0 <= replicas <= INT32_MAX
        ):
            message = "must be greater than or equal to 0"
            if not isinstance(replicas, int) or isinstance(replicas, bool):
                message = "must be an integer"
            elif replicas > INT32_MAX:
                message = f"must be an int32 (at most {INT32_MAX})"
            raise _status.invalid(
                "Scale",
                "autoscaling",
                name,
                [_status.cause("FieldValueInvalid", message, "spec.replicas")],
            )
        old = self.get(rt, ns, name)
        candidate = copy.deepcopy(old)
        candidate.setdefault("spec", {})["replicas"] = replicas
        candidate["metadata"]["resourceVersion"] = meta.get("resourceVersion") or None
        return _scale_of(self._commit(rt, old, candidate, "scale", opts))

    def patch_scale(
        self,
        rt: ResourceType,
        ns: str | None,
        name: str,
        ptype: str,
        body: Any,
        opts: WriteOptions,
    ) -> JSON:
        """Patch the Scale (merge, JSON or strategic merge), then write it."""
        current = self.scale(rt, ns, name)
        current["metadata"].pop("resourceVersion", None)
        try:
            if ptype == JSON_PATCH:
                candidate = json_patch(current, body)
            elif isinstance(body, dict) and ptype in (MERGE, STRATEGIC):
                candidate = merge_patch(current, body)
            else:
                raise PatchError(f"a {ptype} patch of a Scale must be a JSON object")
        except PatchTooLarge as e:
            raise APIError(_status.status(413, str(e), "RequestEntityTooLarge")) from e
        except PatchError as e:
            raise APIError(_status.status(422, str(e))) from e
        return self.update_scale(rt, ns, name, candidate, opts)

    # ------------------------------------------------------------------ eviction

    def evict(self, ns: str, name: str, body: Any, opts: WriteOptions) -> None:
        if (  # a body without apiVersion or kind is decoded as the endpoint's Eviction
            not isinstance(body, dict)
            or (body.get("kind") or "Eviction") != "Eviction"
            or (body.get("apiVersion") or "policy/v1") not in ("policy/v1", "policy/v1beta1")
        ):
            raise _status.bad_request("the body must be a policy/v1 Eviction")
        given = _meta(body).get("name")
        if given not in (None, "", name):
            raise _status.bad_request("name in URL does not match name in Eviction object")
        pod = self.get(PODS, ns, name)
        check_eviction(pod, self.store.objects(PDBS.key, ns))
        options = body.get("deleteOptions") or {}
        if not isinstance(options, dict):
            raise _status.bad_request("deleteOptions must be an object")
        dry = opts.dry_run or "All" in (options.get("dryRun") or [])
        if not dry:
            options = self._mark_disrupted(pod, options, opts)
        self.delete(PODS, ns, name, options, WriteOptions(opts.manager, dry_run=dry))

    def _mark_disrupted(self, pod: JSON, options: JSON, opts: WriteOptions) -> JSON:
        """Upstream's ``addConditionAndDeletePod``: the pod gets ``DisruptionTarget``
        (``EvictionByEvictionAPI``) through its status before it is deleted, so a Job's
        ``podFailurePolicy`` can tell an eviction from a failure. The delete's
        preconditions are checked first, and a resourceVersion precondition moves to
        the version this write made. Returns the delete options to use."""
        self._check_preconditions(PODS, pod, options)
        conditions, changed = with_pod_condition(
            pod.get("status"), eviction_condition(), now_rfc3339()
        )
        if not changed:
            return options
        candidate = copy.deepcopy(pod)
        candidate.setdefault("status", {})["conditions"] = conditions
        updated = self._commit(PODS, pod, candidate, "status", WriteOptions(opts.manager),
                               tracked=True)  # fmt: skip
        pre = options.get("preconditions") or {}
        if pre.get("resourceVersion"):
            rv = _meta(updated).get("resourceVersion")
            options = {**options, "preconditions": {**pre, "resourceVersion": rv}}
        return options

    # ------------------------------------------------------------------ side effects

    def _after_write(self, rt: ResourceType, ns: str | None) -> None:
        if rt is PODS or rt is PDBS:
            self.reconcile_pdbs(ns or "")

    def reconcile_pdbs(self, ns: str) -> None:
        """Bring every PDB status in ``ns`` in line with the pods there."""
        pdbs = self.store.objects(PDBS.key, ns)
        if not pdbs:
            return  # a pod write in a namespace without budgets costs nothing more
        pods = self.store.objects(PODS.key, ns)
        now = now_rfc3339()
        for pdb in pdbs:
            new_status = pdb_status(pdb, pods, pdb.get("status"), now)
            if new_status != pdb.get("status") and not _meta(pdb).get("deletionTimestamp"):
                self.store.update(PDBS.key, {**pdb, "status": new_status})
