"""What a batch script or a manifest may hold: each string the launchers write (a Slurm partition, an sbatch option,
a Kubernetes name, label, image or quantity) against the character set its system accepts.

A value that reaches a Slurm batch script is read by ``sbatch`` (the ``#SBATCH`` lines) or by bash (the rest): a
newline there adds a line to the script, and ``;``, ``$(...)`` or a backtick run a command. Kubernetes refuses
malformed names itself, but only at submission, after the pipeline's first steps ran. So every such string is
checked here, while the config validates (``pipeline_config/launcher.py``) and again when a launcher builds its
script or manifest. Each check raises ``ValueError`` with one line that names the key and what is accepted.

Patterns use ``fullmatch``: ``re.match`` with ``$`` also accepts a value that ends in a newline.
"""
from __future__ import annotations

import re

#: Control characters (newline, carriage return, NUL, ...): never accepted anywhere.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}")
# Partition, account and QOS names (slurm.conf): letters, digits, '_', '.', '-'; a partition list is comma-separated
SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
SLURM_NAME_LIST = re.compile(rf"{SLURM_NAME.pattern}(,{SLURM_NAME.pattern})*")
# One sbatch option: --name or --name=value, or a short -X / -Xvalue. Values: what Slurm options hold (node
# features with & | [ ] *, gres gpu:a100:2, mail addresses, memory 64G, paths); no quote, space, ';', '$' or '`'.
SBATCH_OPTION = re.compile(r"(--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:=@%/+*&|!\[\]-]+)?|-[A-Za-z][A-Za-z0-9_.,:=@%/+-]*)")
# A path written into a batch script or run by it: no space, quote or shell character
SCRIPT_PATH = re.compile(r"[A-Za-z0-9_.,:=@%/+~-]+")
# An environment variable name (export NAME=...)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# RFC 1123 label (namespaces, Services, Job names): lowercase alphanumerics and '-', at most 63 characters
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# RFC 1123 subdomain (PersistentVolumeClaims, ServiceAccounts, Secrets): labels joined by '.', at most 253
DNS_SUBDOMAIN = re.compile(rf"{DNS_LABEL.pattern}(\.{DNS_LABEL.pattern})*")
# Label values (and the name part of a label key): at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")
# Resource quantities: 8, 500m, 64Gi, 1.5, 1e3
QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?")
# An image reference, after github.com/distribution/reference (regexp.go): [registry[:port]/]path[:tag][@digest]
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*"
IMAGE_REFERENCE = re.compile(rf"{_NAME}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                             r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:77] + "...")


def _refuse(key: str, value: str, accepted: str) -> ValueError:
    control = _CONTROL.search(value)
    why = f" (it holds the control character {control.group()!r})" if control else ""
    shown = f"{key}={_shown(value)}" if key else _shown(value)  # no key: the config's error names the location
    return ValueError(f"{shown} is refused{why}: {accepted}")


def one_line(key: str, value: str) -> str:
    """A free shell line (``launcher.slurm.setup``): any text but control characters (a newline would add a
    line). What it runs is the operator's: it may only come from the deploy-time config (docs/operating.md)."""
    if _CONTROL.search(value):
        raise _refuse(key, value, "give one shell line an entry, without newlines or other control characters")
    return value


def matching(pattern: re.Pattern, key: str, value: str, accepted: str, *, max_length: int | None = None) -> str:
    """``value`` when the whole of it matches ``pattern`` (and has at most ``max_length`` characters)."""
    if not isinstance(value, str) or not pattern.fullmatch(value) or (max_length and len(value) > max_length):
        raise _refuse(key, str(value), accepted)
    return value


def slurm_time(key: str, value: str) -> str:
    return matching(SLURM_TIME, key, value, "a Slurm time: minutes ('30'), H:M:S ('04:00:00') or D-H:M:S "
                                            "('1-00:00:00')")


def slurm_name(key: str, value: str, *, several: bool = False) -> str:
    """A partition (``several``: a comma-separated list), account or QOS name."""
    return matching(SLURM_NAME_LIST if several else SLURM_NAME, key, value,
                    "a Slurm name: letters, digits, '_', '.', '+', '-'" + (" (several: comma-separated)"
                                                                          if several else ""))


def sbatch_option(key: str, value: str) -> str:
    return matching(SBATCH_OPTION, key, value, "an sbatch option, one option a line, e.g. '--constraint=a100' or "
                                               "'--qos=high' "
                                               "(no spaces, quotes, ';', '$' or backticks)")


def script_path(key: str, value: str) -> str:
    return matching(SCRIPT_PATH, key, value, "a path of letters, digits and _ . , : = @ % / + ~ - (no spaces, "
                                             "quotes or shell characters)")


def env_name(key: str, value: str) -> str:
    return matching(ENV_NAME, key, value, "an environment variable name: letters, digits, '_'")


def dns_label(key: str, value: str) -> str:
    return matching(DNS_LABEL, key, value, "a Kubernetes name (RFC 1123 label): lowercase letters, digits and '-', "
                                           "alphanumeric at both ends, at most 63 characters", max_length=63)


def dns_subdomain(key: str, value: str) -> str:
    return matching(DNS_SUBDOMAIN, key, value, "a Kubernetes name (RFC 1123 subdomain): lowercase letters, digits, "
                                               "'-' and '.', at most 253 characters", max_length=253)


def label_value(key: str, value: str) -> str:
    return matching(LABEL_VALUE, key, value, "a Kubernetes label value: at most 63 letters, digits, '-', '_', '.', "
                                             "alphanumeric at both ends")


def label_key(key: str, value: str) -> str:
    """``[prefix/]name``: an optional DNS subdomain prefix and a name of at most 63 characters."""
    prefix, _, name = value.rpartition("/") if isinstance(value, str) else ("", "", value)
    accepted = ("a Kubernetes label key: [prefix/]name, prefix a DNS subdomain, name at most 63 letters, digits, "
                "'-', '_', '.'")
    if prefix:
        matching(DNS_SUBDOMAIN, key, prefix, accepted, max_length=253)
    matching(LABEL_NAME, key, name, accepted)
    return value


def quantity(key: str, value: str) -> str:
    return matching(QUANTITY, key, value, "a Kubernetes quantity, e.g. '8', '500m', '64Gi'")


def image_reference(key: str, value: str) -> str:
    return matching(IMAGE_REFERENCE, key, value, "an image reference: [registry[:port]/]name[:tag][@sha256:digest], "
                                                 "e.g. registry.example.org/mclpipe:0.1", max_length=512)


def container_image(key: str, value: str) -> str:
    """pyxis's --container-image: an image reference (``registry#name:tag`` or ``docker://...`` too) or an enroot
    squashfs file (an absolute ``.sqsh`` path)."""
    if isinstance(value, str) and value.endswith(".sqsh"):
        return absolute_path(key, value)
    reference = value.removeprefix("docker://").replace("#", "/", 1) if isinstance(value, str) else value
    image_reference(key, reference)
    return value


def absolute_path(key: str, value: str) -> str:
    """A path inside a pod (a mount point, the working directory): absolute, of the script-path characters, no
    '..' part."""
    if (not isinstance(value, str) or not value.startswith("/") or not SCRIPT_PATH.fullmatch(value)
            or ".." in value.split("/")):
        raise _refuse(key, str(value), "an absolute path of letters, digits and _ . , : = @ % / + ~ - without '..', "
                                       "e.g. /shared")
    return value
