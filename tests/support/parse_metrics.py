"""Parses /metrics scrapes with the Prometheus project's own Python parsers (PyPI package
prometheus-client): stdin is a JSON list of {"format": "prometheus"|"openmetrics",
"text": "..."}; stdout is a JSON list, one entry per scrape, mapping each family name to
{"type": ..., "samples": [[sample name, {labels}, value], ...]}. A text either parser
rejects ends the script with status 1 and the parser's message."""
import json
import sys

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_prometheus

out = []
for i, scrape in enumerate(json.load(sys.stdin)):
    parse = parse_openmetrics if scrape["format"] == "openmetrics" else parse_prometheus
    try:
        families = {}
        for f in parse(scrape["text"]):
            if f.name in families:
                raise ValueError(f"family {f.name} appears twice")
            families[f.name] = {
                "type": f.type,
                "samples": [[s.name, s.labels, s.value] for s in f.samples],
            }
    except Exception as e:  # the parser's own message, whatever it raised
        print(f"scrape {i} ({scrape['format']}) rejected: {e!r}", file=sys.stderr)
        sys.exit(1)
    out.append(families)
json.dump(out, sys.stdout)
