"""A CustomResourceDefinition's schema as a jsonschema validator, applied as the API server
applies it with strict field validation (kubectl's default): a field the schema does not
name is an error, not pruned. The CRDs are test data in tests/deploy/crds (SOURCE.md there
gives each file's source, version and checksum); kubernetes-validate has no schema for CRDs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).parent / "crds"


def strict(schema: Any) -> Any:
    """Every object that lists its properties refuses others, unless it preserves unknown fields."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def crd_validator(folder: Path, api_version: str, kind_name: str) -> jsonschema.Draft7Validator:
    """The openAPIV3Schema of the CRD in folder that serves kind_name at api_version (group/version)."""
    group, _, version = api_version.rpartition("/")
    for path in sorted(folder.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind_name:
            [served] = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
            return jsonschema.Draft7Validator(strict(served["schema"]["openAPIV3Schema"]))
    raise AssertionError(f"no CRD for {api_version} {kind_name} in {folder}")
