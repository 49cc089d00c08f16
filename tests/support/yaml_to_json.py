"""Prints the YAML documents of the files named on the command line as one JSON list
(PyYAML, which kubernetes-validate brings)."""
import json
import sys

import yaml

docs = []
for path in sys.argv[1:]:
    with open(path) as f:
        docs.extend(d for d in yaml.safe_load_all(f) if d is not None)
json.dump(docs, sys.stdout)
