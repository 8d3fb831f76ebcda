"""Documents: typed, versioned session state stored as merge-patch deltas and full baselines.

A document's value is a JSON object. Every write makes a new version. Version 1, and every
K-th version after it (``Settings.document_baseline_every``), is stored in full (a
*baseline*); the versions in between are stored as an RFC 7386 JSON merge patch against the
version before (a *delta*). Writing a baseline deletes the deltas before it, so loading a
document reads one baseline and at most K-1 deltas however often it changed.

Layout inside the session's ``docs`` hash (names never contain ``@``)::

    <name>            "<version> <baseline version>"   the head, checked by commit.lua
    <name>@b          Document JSON                     the baseline (full value)
    <name>@<version>  DocumentDelta JSON                the merge patch to that version

A ``DocumentType`` binds a document name to a pydantic model: the Brain validates the value
on every write and every read.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from baton.errors import ConfigError, ValidationError, not_found
from baton.models import Document, Model, Record, decode

if TYPE_CHECKING:
    from baton.store.store import Store

NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")

__all__ = [
    "DocumentChange",
    "DocumentDelta",
    "DocumentType",
    "check_name",
    "document_from_hash",
    "documents_from_hash",
    "merge_diff",
    "merge_patch",
    "next_change",
    "read_document",
]


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise ConfigError(f"invalid document name {name!r}: lower-case letters, digits, '_.-'")
    return name


# ---------------------------------------------------------------------------- RFC 7386


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply a JSON merge patch (RFC 7386) to ``target``; returns a new value."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def merge_diff(old: Any, new: Any) -> Any:
    """A merge patch that turns ``old`` into ``new``.

    Merge patches cannot set a member to ``null`` (null means "remove"): where ``new`` holds
    a null inside an object, the result does not reproduce it; :func:`next_change` then
    stores a baseline instead.
    """
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return copy.deepcopy(new)
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = copy.deepcopy(value)
        elif old[key] != value:
            patch[key] = merge_diff(old[key], value)
    return patch


# ---------------------------------------------------------------------------- storage


class DocumentDelta(Record):
    """A stored change: the merge patch from ``version - 1`` to ``version``."""

    name: str
    version: int
    patch: dict[str, Any]
    updated_ms: int = 0


class DocumentChange(Model):
    """One document write of a commit: what commit.lua stores, and the resulting document."""

    mode: Literal["b", "d"]  # baseline or delta
    document: Document
    payload: str  # Document JSON (baseline) or DocumentDelta JSON (delta)

    @property
    def name(self) -> str:
        return self.document.name


def next_change(
    current: Document | None, name: str, value: dict[str, Any], now_ms: int, every: int
) -> DocumentChange:
    """The change that makes ``value`` the next version of a document."""
    version = (current.version if current else 0) + 1
    doc = Document(name=name, version=version, value=value, updated_ms=now_ms)
    if current is not None and (version - 1) % every != 0:
        patch = merge_diff(current.value, value)
        if merge_patch(current.value, patch) == value:  # else: a null a patch cannot carry
            delta = DocumentDelta(name=name, version=version, patch=patch, updated_ms=now_ms)
            return DocumentChange(mode="d", document=doc, payload=delta.to_json())
    return DocumentChange(mode="b", document=doc, payload=doc.to_json())


def _rebuild(name: str, base: Document, deltas: Iterable[DocumentDelta], last: int) -> Document:
    """A document from its baseline and the deltas after it, up to version ``last``."""
    value, version, updated = base.value, base.version, base.updated_ms
    for d in sorted(deltas, key=lambda d: d.version):
        if version < d.version <= last:
            value, version, updated = merge_patch(value, d.patch), d.version, d.updated_ms
    return Document(name=name, version=version, value=value, updated_ms=updated)


def document_from_hash(
    fields: dict[str, str], name: str, version: int | None = None,
) -> tuple[Document, int, int] | None:
    """Document ``name`` of a ``docs`` hash at ``version`` (default: its head), rebuilt from
    its baseline and the deltas up to that version; with the versions the hash can still
    rebuild, ``(first, head)``. None if there is no such document.

    A version outside first..head gives the document at the nearest end it may not go past:
    the caller compares ``document.version`` with the version it asked for."""
    base_raw = fields.get(f"{name}@b")
    if base_raw is None or name not in fields:
        return None
    head = int(str(fields[name]).split()[0])
    base = decode(Document, base_raw)
    deltas = (decode(DocumentDelta, raw) for key, raw in fields.items()
              if key.startswith(f"{name}@") and key != f"{name}@b")
    last = head if version is None else min(version, head)
    return _rebuild(name, base, deltas, last), base.version, head


async def read_document(store: Store, session_id: str, name: str,
                        version: int | None = None) -> tuple[Document, int]:
    """Document ``name`` of a session at ``version`` (default: its current one), and its
    head version. NotFoundError names what is missing: the session, the document, or the
    version (with the versions kept)."""
    fields: Any = await store.redis.hgetall(store.keys.session(session_id).docs)
    found = document_from_hash(fields, name, version)
    ns = store.keys.ns
    if found is None:
        if not await store.inbox.exists(session_id):
            raise not_found(f"session {session_id}", namespace=ns, session_id=session_id)
        raise not_found(f"document {name} in session {session_id}", namespace=ns,
                        session_id=session_id)
    doc, first, head = found
    if version is not None and doc.version != version:
        raise not_found(f"version {version} of document {name} in session {session_id} "
                        f"(kept: {first}..{head})", namespace=ns, session_id=session_id)
    return doc, head


def documents_from_hash(fields: dict[str, str]) -> dict[str, Document]:
    """Rebuild every document of a ``docs`` hash: its baseline plus the deltas after it."""
    heads: dict[str, int] = {}
    baselines: dict[str, Document] = {}
    deltas: dict[str, list[DocumentDelta]] = {}
    for key, raw in fields.items():
        name, at, suffix = key.partition("@")
        if not at:
            heads[name] = int(raw.split()[0])
        elif suffix == "b":
            baselines[name] = decode(Document, raw)
        else:
            deltas.setdefault(name, []).append(decode(DocumentDelta, raw))
    return {name: _rebuild(name, baselines[name], deltas.get(name, ()), head)
            for name, head in heads.items() if name in baselines}


# ---------------------------------------------------------------------------- types


@dataclass(frozen=True)
class DocumentType:
    """A document name bound to a pydantic model, validated on every write and read."""

    name: str
    model: type[BaseModel]

    def __post_init__(self) -> None:
        check_name(self.name)
        if not (isinstance(self.model, type) and issubclass(self.model, BaseModel)):
            raise ConfigError(f"document {self.name}: the type must be a pydantic model class "
                              f"(a BaseModel subclass), not {self.model!r}")

    def dump(self, value: Any) -> dict[str, Any]:
        """The stored JSON object of ``value`` (a model instance or plain data), validated."""
        data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        return self.parse(data).model_dump(mode="json")

    def parse(self, data: Any) -> BaseModel:
        try:
            return self.model.model_validate(data)
        except PydanticValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(root)"
            raise ValidationError(
                f"invalid document {self.name}: {where}: {first['msg']}", model=self.name
            ) from None
