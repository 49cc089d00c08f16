//! What a `.pt2`'s flat outputs are, read from its output's pytree spec (`torch.export`'s
//! `out_spec`: a program's `models/<name>.json` signature, an AOTInductor package's call
//! spec), and the value a pass answers with them: one tensor, a tuple of tensors, or a dict
//! of tensors named by its keys, exactly as a TorchScript model's `Dict[str, Tensor]`
//! reaches every door (`POST /`'s object of named outputs, v2's output names, TorchServe's
//! `image_segmenter` reading `out`).
//!
//! A spec is `[1, {"type": …, "context": …, "children_spec": [...]}]`; a leaf has the type
//! `null`; a dict's context is a JSON string of its keys' list. A spec that nests (a dict of
//! tuples, a tuple of dicts…), or a dict whose keys are not all strings, keeps its tensors
//! numbered in the spec's order ([`Outputs::Flat`]), with the reason for the log.

use serde_json::Value;
use tch::{IValue, Tensor};

/// The pytree types whose context is the list of the dict's keys.
const DICTS: [&str; 3] = [
    "builtins.dict",
    "collections.OrderedDict",
    "torch.fx.immutable_collections.immutable_dict",
];
/// The pytree types of a tuple or list of outputs.
const SEQUENCES: [&str; 4] = [
    "builtins.tuple",
    "builtins.list",
    "collections.namedtuple",
    "torch.fx.immutable_collections.immutable_list",
];

/// The shape of a model's outputs, by its output spec.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Outputs {
    /// One tensor.
    Leaf,
    /// Tensors numbered in order (a tuple or list, or a spec that is not a dict of tensors).
    #[default]
    Flat,
    /// A dict of tensors: its keys, in the order of its tensors.
    Named(Vec<String>),
}

/// A spec that is served as [`Outputs::Flat`] although it is not a tuple of tensors: why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Numbered(pub String);

impl Outputs {
    /// Reads an output spec (the serialized treespec's text). `Err` is not a refusal: the
    /// outputs are then numbered ([`Outputs::Flat`]), and the message says why.
    pub fn read(spec: &str) -> Result<Outputs, Numbered> {
        let doc: Value = serde_json::from_str(spec)
            .map_err(|e| Numbered(format!("its output spec is not JSON ({e})")))?;
        let node = &doc[1];
        if !node.is_object() {
            return Err(Numbered(format!("its output spec has no node ({spec})")));
        }
        let kind = match &node["type"] {
            Value::Null => return Ok(Outputs::Leaf),
            Value::String(t) => t.as_str(),
            other => return Err(Numbered(format!("its output spec's type is {other}"))),
        };
        let children = node["children_spec"].as_array().map_or(&[][..], |c| c);
        if let Some(nested) = children.iter().find(|c| !c["type"].is_null()) {
            return Err(Numbered(format!(
                "its output is a {} holding a {}, not tensors alone: only a dict of tensors has named outputs",
                short(kind),
                short(nested["type"].as_str().unwrap_or("?"))
            )));
        }
        if SEQUENCES.contains(&kind) {
            return Ok(Outputs::Flat);
        }
        if !DICTS.contains(&kind) {
            return Err(Numbered(format!(
                "its output is a {kind}, whose keys the server does not read"
            )));
        }
        let keys = node["context"]
            .as_str()
            .and_then(|c| serde_json::from_str::<Vec<Value>>(c).ok())
            .ok_or_else(|| Numbered(format!("its output's {} spec lists no keys", short(kind))))?;
        let keys: Vec<String> = keys
            .iter()
            .map(|k| k.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                Numbered(format!(
                    "its output is a dict with keys that are not all strings ({}): a dict's keys name its outputs",
                    node["context"].as_str().unwrap_or_default()
                ))
            })?;
        if keys.len() != children.len() {
            return Err(Numbered(format!(
                "its output's dict spec has {} keys for {} values",
                keys.len(),
                children.len()
            )));
        }
        Ok(Outputs::Named(keys))
    }

    /// A pass's flat tensors as the model's answer: the one tensor of a leaf, the dict of a
    /// dict (its keys as strings, in order), else a tuple. Tensors that do not match the
    /// spec (in number) are a tuple.
    pub fn assemble(&self, tensors: Vec<Tensor>) -> IValue {
        match self {
            Outputs::Leaf if tensors.len() == 1 => {
                IValue::Tensor(tensors.into_iter().next().expect("one output"))
            }
            Outputs::Named(keys) if keys.len() == tensors.len() => IValue::GenericDict(
                keys.iter()
                    .zip(tensors)
                    .map(|(k, t)| (IValue::String(k.clone()), IValue::Tensor(t)))
                    .collect(),
            ),
            _ => IValue::Tuple(tensors.into_iter().map(IValue::Tensor).collect()),
        }
    }

    /// Reads `spec`, logging why the outputs are numbered when it is not served as written.
    pub fn read_logged(spec: &str) -> Outputs {
        Outputs::read(spec).unwrap_or_else(|Numbered(why)| {
            tracing::warn!(
                event = "outputs_numbered",
                "the model's outputs are numbered (output__0, …) in its output spec's order: {why}"
            );
            Outputs::Flat
        })
    }
}

/// A pytree type's last name (`collections.OrderedDict` → `OrderedDict`).
fn short(kind: &str) -> &str {
    kind.rsplit('.').next().unwrap_or(kind)
}

/// The first pytree type in `spec` (the node and its children, depth first) that is not in
/// `known` (`None`: all are).
pub fn unknown_type<'a>(spec: &'a Value, known: &[&str]) -> Option<&'a str> {
    let own = spec["type"].as_str().filter(|t| !known.contains(t));
    own.or_else(|| {
        spec["children_spec"]
            .as_array()?
            .iter()
            .find_map(|c| unknown_type(c, known))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LEAF: &str = r#"{"type": null, "context": null, "children_spec": []}"#;

    /// A serialized spec of `node` (protocol 1), as torch writes it.
    fn spec(node: Value) -> String {
        json!([1, node]).to_string()
    }

    fn node(kind: &str, context: &str, children: usize) -> Value {
        let leaf: Value = serde_json::from_str(LEAF).unwrap();
        json!({"type": kind, "context": context, "children_spec": vec![leaf; children]})
    }

    #[test]
    fn a_dict_of_tensors_is_named_by_its_keys() {
        // What torch 2.11 writes for torchvision's FCN (an OrderedDict) and a plain dict.
        let fcn = r#"[1, {"type": "collections.OrderedDict", "context": "[\"out\", \"aux\"]", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}]"#;
        let named = Outputs::Named(vec!["out".into(), "aux".into()]);
        assert_eq!(Outputs::read(fcn), Ok(named.clone()));
        let plain = spec(node("builtins.dict", r#"["out", "aux"]"#, 2));
        assert_eq!(Outputs::read(&plain), Ok(named));
    }

    #[test]
    fn a_leaf_is_one_tensor_and_a_tuple_numbered() {
        assert_eq!(Outputs::read(&format!("[1, {LEAF}]")), Ok(Outputs::Leaf));
        let tuple = spec(node("builtins.tuple", "null", 2));
        assert_eq!(Outputs::read(&tuple), Ok(Outputs::Flat));
        let list = spec(node("builtins.list", "null", 3));
        assert_eq!(Outputs::read(&list), Ok(Outputs::Flat));
    }

    /// What is not a dict of tensors keeps its tensors numbered, saying why; nothing panics.
    #[test]
    fn a_nested_spec_or_other_keys_are_numbered_with_the_reason() {
        let mut nested = node("builtins.dict", r#"["a", "b"]"#, 1);
        nested["children_spec"]
            .as_array_mut()
            .unwrap()
            .push(node("builtins.tuple", "null", 2));
        let Err(Numbered(why)) = Outputs::read(&spec(nested)) else {
            panic!("a dict of tuples named");
        };
        assert!(why.contains("a dict holding a tuple"), "{why}");
        let ints = spec(node("builtins.dict", "[0, 1]", 2));
        let Err(Numbered(why)) = Outputs::read(&ints) else {
            panic!("int keys named");
        };
        assert!(
            why.contains("keys that are not all strings ([0, 1])"),
            "{why}"
        );
        for bad in [
            "not json".to_string(),
            "[1]".into(),
            spec(node("builtins.dict", "not a list", 1)),
            spec(node("builtins.dict", r#"["a"]"#, 2)),
            spec(node("collections.defaultdict", "{}", 1)),
        ] {
            assert!(Outputs::read(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flat_tensors_are_assembled_as_the_spec_says() {
        let t = |v: f32| Tensor::from_slice(&[v]);
        let named = Outputs::Named(vec!["out".into(), "aux".into()]);
        let IValue::GenericDict(pairs) = named.assemble(vec![t(1.0), t(2.0)]) else {
            panic!("not a dict");
        };
        let keys: Vec<&IValue> = pairs.iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [&IValue::String("out".into()), &IValue::String("aux".into())]
        );
        assert!(matches!(
            Outputs::Leaf.assemble(vec![t(1.0)]),
            IValue::Tensor(_)
        ));
        // A count the spec does not have is a tuple, never a panic.
        assert!(matches!(named.assemble(vec![t(1.0)]), IValue::Tuple(v) if v.len() == 1));
        assert!(matches!(Outputs::Leaf.assemble(vec![]), IValue::Tuple(v) if v.is_empty()));
    }

    #[test]
    fn an_unknown_type_anywhere_in_a_spec_is_found() {
        let known = ["builtins.tuple", "builtins.dict"];
        let mut outer = node("builtins.tuple", "null", 1);
        outer["children_spec"].as_array_mut().unwrap().push(node(
            "collections.OrderedDict",
            r#"["a"]"#,
            1,
        ));
        assert_eq!(
            unknown_type(&outer, &known),
            Some("collections.OrderedDict")
        );
        assert_eq!(unknown_type(&node("builtins.dict", "[]", 0), &known), None);
    }
}
