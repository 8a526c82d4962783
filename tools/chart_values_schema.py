"""Write the `config` part of the Helm chart's values.schema.json from the proxy's
config model (proxy/config/model.py), so `helm lint` refuses what the proxy would refuse
(unknown keys, wrong types, out-of-range Kafka properties). The chart's own keys
are written by hand in the same file; this replaces only `properties.config` and
`$defs`.

    python tools/chart_values_schema.py          # rewrite the file
    python tools/chart_values_schema.py --check  # exit 1 if it is not up to date
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.config.model import Config, ListenerPolicies  # noqa: E402

SCHEMA = ROOT / "helm" / "kafka-admission-proxy" / "values.schema.json"


def config_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the schema of values.config, its $defs)."""
    schema = Config.model_json_schema(by_alias=True, mode="validation")
    defs = schema.pop("$defs")
    # The chart sets `mode` from its own mode (standalone -> cluster, sidecar -> sidecar).
    del schema["properties"]["mode"]
    schema["description"] = "The proxy's config file (deploy/config.example.yaml); `mode` comes from the chart's mode"
    # Per-listener policies are written flat in the file: listener.name.<listener>.<property>.
    policies = defs["Policies"]
    del policies["properties"]["listener.name"]
    props = "|".join(re.escape(f.alias or name) for name, f in ListenerPolicies.model_fields.items())
    policies["patternProperties"] = {
        rf"^listener\.name\.[A-Za-z0-9_.-]+\.({props})$": {"type": "integer", "minimum": 1, "maximum": 2147483647}
    }
    return schema, defs


def updated(current: dict[str, Any]) -> dict[str, Any]:
    schema, defs = config_schema()
    new = dict(current)
    new["properties"] = {**current["properties"], "config": schema}
    new["$defs"] = defs
    return new


def main(argv: list[str]) -> int:
    current = json.loads(SCHEMA.read_text())
    text = json.dumps(updated(current), indent=2) + "\n"
    if "--check" in argv:
        if SCHEMA.read_text() != text:
            print(
                f"{SCHEMA.relative_to(ROOT)} is not generated from proxy/config/model.py: run "
                "python tools/chart_values_schema.py",
                file=sys.stderr,
            )
            return 1
        return 0
    SCHEMA.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
