"""Kubernetes name rules: DNS labels, DNS subdomains, qualified names, label values.

Owns the one spelling of the apimachinery name patterns (``IsDNS1123Label``,
``IsDNS1123Subdomain``, ``IsQualifiedName``, ``IsValidLabelValue``) and their length
limits. Every check matches the whole text, as Go's ``regexp`` does: a trailing line
break is not a name. Callers keep their own error wording; these functions only say
yes or no. Pure functions, no I/O.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "DNS_LABEL_MAX",
    "DNS_LABEL_PATTERN",
    "DNS_SUBDOMAIN_MAX",
    "DNS_SUBDOMAIN_PATTERN",
    "LABEL_VALUE_MAX",
    "QUALIFIED_NAME_MAX",
    "is_dns_label",
    "is_dns_subdomain",
    "is_label_value",
    "is_qualified_name",
    "matches_dns_label",
    "matches_dns_subdomain",
    "matches_qualified_name_part",
]

#: ``IsDNS1123Label``: lowercase letters, digits and ``-``, alphanumeric at both ends.
DNS_LABEL_PATTERN: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
#: ``IsDNS1123Subdomain``: DNS labels joined by ``.``.
DNS_SUBDOMAIN_PATTERN: Final = rf"{DNS_LABEL_PATTERN}(\.{DNS_LABEL_PATTERN})*"
#: The name part of a qualified name, and a non-empty label value.
_QUALIFIED_PART_PATTERN: Final = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"

DNS_LABEL_MAX: Final = 63
DNS_SUBDOMAIN_MAX: Final = 253
QUALIFIED_NAME_MAX: Final = 63
LABEL_VALUE_MAX: Final = 63

_DNS_LABEL = re.compile(DNS_LABEL_PATTERN)
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)
_QUALIFIED_PART = re.compile(_QUALIFIED_PART_PATTERN)


def matches_dns_label(text: str) -> bool:
    """Does ``text`` have the shape of a DNS label (the length is not checked)?"""
    return _DNS_LABEL.fullmatch(text) is not None


def matches_dns_subdomain(text: str) -> bool:
    """Does ``text`` have the shape of a DNS subdomain (the length is not checked)?"""
    return _DNS_SUBDOMAIN.fullmatch(text) is not None


def matches_qualified_name_part(text: str) -> bool:
    """Does ``text`` have the shape of a qualified name's name part (no length check)?"""
    return _QUALIFIED_PART.fullmatch(text) is not None


def is_dns_label(text: str) -> bool:
    """A DNS label (RFC 1123) of at most 63 characters."""
    return 0 < len(text) <= DNS_LABEL_MAX and matches_dns_label(text)


def is_dns_subdomain(text: str) -> bool:
    """A DNS subdomain (RFC 1123) of at most 253 characters."""
    return 0 < len(text) <= DNS_SUBDOMAIN_MAX and matches_dns_subdomain(text)


def is_qualified_name(text: str) -> bool:
    """A qualified name (label key, taint key): ``[prefix/]name``.

    The prefix is a DNS subdomain; the name is 1-63 characters of ``[A-Za-z0-9-_.]``
    starting and ending with a letter or digit.
    """
    prefix, sep, name = text.rpartition("/")
    if sep and not is_dns_subdomain(prefix):
        return False
    return 0 < len(name) <= QUALIFIED_NAME_MAX and matches_qualified_name_part(name)


def is_label_value(text: str) -> bool:
    """A label value: empty, or at most 63 characters shaped like a qualified name part."""
    return text == "" or (len(text) <= LABEL_VALUE_MAX and matches_qualified_name_part(text))
