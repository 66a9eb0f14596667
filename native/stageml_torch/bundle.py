"""Residual bundles (`stageml stage`): manifest.json, residual.json (the IR's JSON form of
residual.ir), constants.safetensors, and parameters the manifest marks `external`, supplied by
the caller."""

import json
import os

from . import errors
from .graph import Program
from .safetensors_io import read_safetensors

BUNDLE_FORMAT = "stageml.bundle"
BUNDLE_VERSION = 1


def read_manifest(path):
    """The bundle's manifest.json, checked for format and version."""
    try:
        with open(os.path.join(path, "manifest.json")) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise errors.WorkerError(errors.BAD_BUNDLE, "bundle '%s': manifest.json is missing or not JSON (%s)" % (path, e)) from e
    if m.get("format") != BUNDLE_FORMAT or m.get("version") != BUNDLE_VERSION:
        raise errors.WorkerError(errors.BAD_BUNDLE, "bundle '%s': not a %s v%d manifest" % (path, BUNDLE_FORMAT, BUNDLE_VERSION))
    return m


def load_bundle(path, device="cpu", external=None):
    """The bundle at `path` as a `Program` on `device`; `external` maps the names of external
    parameters to tensors (their dtype must be the residual's)."""
    m = read_manifest(path)
    gpath = os.path.join(path, "residual.json")
    try:
        with open(gpath) as f:
            graph = json.load(f)
    except (OSError, ValueError) as e:
        raise errors.WorkerError(errors.BAD_BUNDLE, "bundle '%s': residual.json is missing or not JSON (write it with graphToJson)" % path) from e
    cpath = os.path.join(path, m["constants"])
    params = read_safetensors(cpath) if os.path.exists(cpath) else {}
    for p in m["params"]:
        if p["source"] == "external":
            if external is None or p["name"] not in external:
                raise errors.WorkerError(errors.MISSING_WEIGHT, "bundle '%s': external parameter '%s' (%s) was not supplied" % (path, p["name"], p["type"]))
            params[p["name"]] = external[p["name"]]
    return Program(graph, params, device)
