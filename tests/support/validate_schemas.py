"""Validates manifests strictly against schemas pinned in tests/schemas/ (see its README):
what `kubernetes-validate --strict` does for Kubernetes' own kinds, for the kinds it does not
know. Prints one JSON object; exits 1 only on a usage error.

usage:
  validate_schemas.py crd CRD_FILE MANIFEST...
      Every document of the manifests whose apiVersion and kind the CustomResourceDefinition
      (YAML, or YAML gzipped as .gz) defines is validated against that version's
      openAPIV3Schema made strict: an object that lists its properties takes no others
      (unless the schema says x-kubernetes-preserve-unknown-fields), as the API server
      prunes or, with fieldValidation=Strict, refuses them. metadata needs a name.
  validate_schemas.py keda-prometheus GO_FILE MANIFEST...
      The metadata of every `prometheus` trigger of the KEDA ScaledObjects in the manifests,
      against the parameters KEDA's Prometheus scaler declares in its source (GO_FILE,
      pkg/scalers/prometheus_scaler.go: the `keda:"name=..., order=triggerMetadata"` tags):
      no unknown key, every required one present.
  validate_schemas.py adapter-config GO_FILE MANIFEST...
      The `config.yaml` of every ConfigMap in the manifests, against prometheus-adapter's
      configuration types (GO_FILE, pkg/config/config.go: the structs and their yaml tags):
      no unknown key at any level, the right kind of value for each.
  validate_schemas.py blob FILE...
      Each file's git blob id (SHA-1 of "blob <size>\\0" + its content; a .gz file's is its
      decompressed content's), to compare with the upstream blob it was pinned from.

Output: {"documents": [{"file", "kind", "name", "errors": [...]}], "blobs": {file: id}}."""
import gzip
import hashlib
import json
import re
import sys

import jsonschema
import yaml

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read(path):
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def documents(paths):
    for p in paths:
        for d in yaml.load_all(read(p).decode(), Loader=Loader):
            if d:
                yield p, d


def report(p, d, errors):
    return {"file": p, "kind": d.get("kind"), "name": (d.get("metadata") or {}).get("name"),
            "errors": errors}


def strict(node):
    """The schema with additionalProperties: false on every object that lists its
    properties, int-or-string and nullable spelt out for JSON Schema."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()}
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if (out.get("type") == "object" and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}


def crd(crd_path, paths):
    c = yaml.load(read(crd_path).decode(), Loader=Loader)
    group, kind = c["spec"]["group"], c["spec"]["names"]["kind"]
    schemas = {}
    for v in c["spec"]["versions"]:
        s = strict(v["schema"]["openAPIV3Schema"])
        s["properties"]["metadata"] = METADATA
        s["required"] = sorted(set(s.get("required", [])) | {"apiVersion", "kind", "metadata", "spec"})
        schemas[f"{group}/{v['name']}"] = s
    out = []
    for p, d in documents(paths):
        if d.get("kind") != kind:
            continue
        schema = schemas.get(d.get("apiVersion"))
        if schema is None:
            out.append(report(p, d, [f"apiVersion {d.get('apiVersion')} is not one of {sorted(schemas)}"]))
            continue
        v = jsonschema.Draft7Validator(schema)
        errors = ["/".join(map(str, e.absolute_path)) + ": " + e.message
                  for e in sorted(v.iter_errors(d), key=lambda e: list(map(str, e.absolute_path)))]
        out.append(report(p, d, errors))
    return out


def keda_params(go):
    """(every key the scaler reads from triggerMetadata, the required ones)."""
    known, required = set(), set()
    for tag in re.findall(r'keda:"([^"]*)"', go):
        parts = dict((kv.split("=", 1) + [""])[:2] for kv in (x.strip() for x in tag.split(",")) if kv)
        if "name" not in parts or "triggerMetadata" not in parts.get("order", "").split(";"):
            continue
        known.add(parts["name"])
        if "optional" not in parts and "default" not in parts:
            required.add(parts["name"])
    return known, required


def keda_prometheus(go_path, paths):
    known, required = keda_params(read(go_path).decode())
    out = []
    for p, d in documents(paths):
        if d.get("kind") != "ScaledObject":
            continue
        errors = []
        for i, t in enumerate(d.get("spec", {}).get("triggers", [])):
            if t.get("type") != "prometheus":
                continue
            meta = t.get("metadata", {})
            errors += [f"triggers/{i}/metadata: unknown parameter {k!r} (the scaler reads {sorted(known)})"
                       for k in sorted(set(meta) - known)]
            errors += [f"triggers/{i}/metadata: missing {k!r}" for k in sorted(required - set(meta))]
        out.append(report(p, d, errors))
    return out


GO_SCALARS = {"string": str, "bool": bool, "int": int, "int32": int, "int64": int,
              "float64": (int, float), "pmodel.Duration": str}


def go_structs(go):
    """struct name -> {yaml key: Go type}."""
    structs = {}
    for name, body in re.findall(r"type (\w+) struct \{\n(.*?)\n\}", go, re.S):
        fields = {}
        for line in body.splitlines():
            m = re.match(r'\s*\w+\s+(\S+)\s+`.*yaml:"([^",]+)', line)
            if m:
                fields[m.group(2)] = m.group(1)
        structs[name] = fields
    return structs


def check_go(value, gotype, structs, path, errors):
    gotype = gotype.lstrip("*")
    if gotype.startswith("[]"):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list")
            return
        for i, x in enumerate(value):
            check_go(x, gotype[2:], structs, f"{path}/{i}", errors)
    elif gotype.startswith("map[string]"):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map")
            return
        for k, x in value.items():
            check_go(x, gotype[len("map[string]"):], structs, f"{path}/{k}", errors)
    elif gotype in structs:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a {gotype}")
            return
        fields = structs[gotype]
        for k, x in value.items():
            if k not in fields:
                errors.append(f"{path}: unknown key {k!r} (a {gotype} has {sorted(fields)})")
            else:
                check_go(x, fields[k], structs, f"{path}/{k}", errors)
    elif gotype in GO_SCALARS:
        if not isinstance(value, GO_SCALARS[gotype]) or isinstance(value, bool) != (gotype == "bool"):
            errors.append(f"{path}: expected a {gotype}, not {value!r}")
    else:
        errors.append(f"{path}: no rule for the Go type {gotype}")


def adapter_config(go_path, paths):
    structs = go_structs(read(go_path).decode())
    out = []
    for p, d in documents(paths):
        if d.get("kind") != "ConfigMap":
            continue
        errors = []
        text = (d.get("data") or {}).get("config.yaml")
        if text is None:
            errors.append("data: no config.yaml")
        else:
            check_go(yaml.load(text, Loader=Loader), "MetricsDiscoveryConfig", structs, "config.yaml", errors)
        out.append(report(p, d, errors))
    return out


def blob(path):
    data = read(path)
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(1)
    what, first, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if what == "crd":
        print(json.dumps({"documents": crd(first, rest)}))
    elif what == "keda-prometheus":
        print(json.dumps({"documents": keda_prometheus(first, rest)}))
    elif what == "adapter-config":
        print(json.dumps({"documents": adapter_config(first, rest)}))
    elif what == "blob":
        print(json.dumps({"blobs": {p: blob(p) for p in [first] + rest}}))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
