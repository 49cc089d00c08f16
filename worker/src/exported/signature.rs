//! An ExportedProgram's inputs as its archive records them (`models/<name>.json`: the
//! graph signature's user inputs, each tensor's dtype and sizes, and the range of each
//! dynamic size, `range_constraints`), and the checks made with them: the metadata's
//! declared inputs and `max_batch_size` at boot, each request's tensors before a pass. The
//! Native Runtime itself checks neither a dtype nor a size against the export's bounds.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;
use tch::{Kind, Tensor};
use vramfork::metadata::Dtype;
use vramfork::metadata::{Datatype, TensorSpec};

/// One size of an input as the export recorded it.
#[derive(Debug, Clone, PartialEq)]
pub enum Dim {
    /// Fixed at export (no `torch.export.Dim` for it).
    Fixed(i64),
    /// A `torch.export.Dim`: any size in `min..=max` (`max` `None`: unbounded).
    Dynamic {
        symbol: String,
        min: i64,
        max: Option<i64>,
    },
    /// Derived from other sizes (`2*s0`): not checked here.
    Derived(String),
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Dynamic { min, max, .. } => match max {
                Some(max) => write!(f, "{min}..{max}"),
                None => write!(f, "{min}.."),
            },
            Dim::Derived(e) => f.write_str(e),
        }
    }
}

/// One tensor input of the program.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub name: String,
    /// `None`: a dtype the server does not take (complex, float8…), `scalar` its number.
    pub dtype: Option<Dtype>,
    pub scalar: i64,
    pub dims: Vec<Dim>,
}

/// The program's inputs and the device its weights were saved on.
#[derive(Debug, Clone, PartialEq)]
pub struct Signature {
    pub inputs: Vec<Input>,
    /// `cpu` or `cuda` (the first input's device, else `cpu`).
    pub device: String,
    /// The first input's device index as exported (`cuda:1` → 1), when recorded.
    pub device_index: Option<i64>,
}

/// torch.export's serialized dtypes (`torch/_export/serde/schema.py`, `ScalarType`).
fn dtype_of(scalar: i64) -> Option<Dtype> {
    Some(match scalar {
        1 => Dtype::UInt8,
        2 => Dtype::Int8,
        3 => Dtype::Int16,
        4 => Dtype::Int32,
        5 => Dtype::Int64,
        6 => Dtype::Float16,
        7 => Dtype::Float32,
        8 => Dtype::Float64,
        12 => Dtype::Bool,
        13 => Dtype::BFloat16,
        _ => return None,
    })
}

fn kind_of(d: Dtype) -> Kind {
    crate::args::kind_of(d)
}

impl Signature {
    /// Reads a program's JSON (`models/<name>.json` of a `torch.export.save` archive).
    pub fn parse(json: &[u8]) -> Result<Signature, String> {
        let doc: Value =
            serde_json::from_slice(json).map_err(|e| format!("its program is not JSON: {e}"))?;
        let gm = &doc["graph_module"];
        let specs = gm["signature"]["input_specs"]
            .as_array()
            .ok_or("its program has no graph signature (graph_module.signature.input_specs)")?;
        let values = &gm["graph"]["tensor_values"];
        let ranges = &doc["range_constraints"];
        let mut inputs = Vec::new();
        for spec in specs {
            let Some(user) = spec.get("user_input") else {
                continue; // parameters, buffers, constants: the program's own
            };
            let Some(name) = user["arg"]["as_tensor"]["name"].as_str() else {
                return Err(format!(
                    "the program takes an input that is not a tensor ({}); vramfork passes tensors only",
                    user["arg"]
                ));
            };
            inputs.push(input(name, &values[name], ranges)?);
        }
        let first = inputs.first().map(|i| &values[i.name.as_str()]["device"]);
        let device = first
            .and_then(|d| d["type"].as_str())
            .unwrap_or("cpu")
            .to_string();
        let device_index = first.and_then(|d| d["index"].as_i64());
        Ok(Signature {
            inputs,
            device,
            device_index,
        })
    }

    /// A request's tensors against the program's inputs: their number, each dtype, rank,
    /// fixed size and each dynamic size's bounds (and one symbol's sizes agreeing). The
    /// error names the input, the dimension and the bound.
    pub fn check(&self, args: &[Tensor]) -> Result<(), String> {
        if args.len() != self.inputs.len() {
            return Err(format!(
                "the program takes {} input(s) ({}), the request has {}",
                self.inputs.len(),
                self.names(),
                args.len()
            ));
        }
        let mut seen: BTreeMap<&str, (i64, &str)> = BTreeMap::new();
        for (input, t) in self.inputs.iter().zip(args) {
            let name = &input.name;
            if let Some(d) = input.dtype {
                if t.kind() != kind_of(d) {
                    return Err(format!(
                        "input {name}: the program takes {d}, the request's is {:?}; declare the input's dtype in the metadata's inputs",
                        t.kind()
                    ));
                }
            }
            let size = t.size();
            if size.len() != input.dims.len() {
                return Err(format!(
                    "input {name}: the program takes {} dimension(s) [{}], the request's has {} {size:?}",
                    input.dims.len(),
                    input.shape_text(),
                    size.len()
                ));
            }
            for (i, (dim, &got)) in input.dims.iter().zip(&size).enumerate() {
                check_dim(name, i, dim, got)?;
                if let Dim::Dynamic { symbol, .. } = dim {
                    match seen.get(symbol.as_str()) {
                        Some(&(n, other)) if n != got => {
                            return Err(format!(
                                "input {name}: dimension {i} is {got}, but {other}'s is {n}: the export ties the two (one torch.export.Dim)"
                            ))
                        }
                        _ => {
                            seen.insert(symbol, (got, name));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The metadata's `max_batch_size` and declared inputs against the program, at boot
    /// (batching first: a batch fixed at export is the likelier mistake, with its own fix).
    pub fn check_declared(
        &self,
        declared: Option<&[TensorSpec]>,
        max_batch_size: u32,
    ) -> Result<(), String> {
        if max_batch_size > 0 {
            for input in &self.inputs {
                input.check_batch(max_batch_size)?;
            }
        }
        if let Some(specs) = declared {
            if specs.len() != self.inputs.len() {
                return Err(format!(
                    "the metadata declares {} input(s), the program takes {} ({}): declare each of them, in order",
                    specs.len(),
                    self.inputs.len(),
                    self.names()
                ));
            }
            for (spec, input) in specs.iter().zip(&self.inputs) {
                input.check_spec(spec)?;
            }
        }
        Ok(())
    }

    /// An AOTInductor package's batch range against `max_batch_size`, checked before
    /// [`Signature::check_declared`]: a package takes the range its compile proved, which can
    /// be narrower than the export's `Dim` (on the CPU torch picks a convolution backend by
    /// whether the batch is under 16 rows, and the compile keeps the example input's side:
    /// ResNet-18 exported with `Dim(max=64)` and 2 example rows takes 2..15), so exporting
    /// with a larger `Dim` cannot help; the refusal says what can.
    pub fn check_compiled_batch(&self, max_batch_size: u32) -> Result<(), String> {
        let rows = i64::from(max_batch_size);
        for input in &self.inputs {
            if let Some(Dim::Dynamic {
                min,
                max: Some(max),
                ..
            }) = input.dims.first()
            {
                if *max < rows {
                    return Err(format!(
                        "max_batch_size is {rows}, but the package takes {min}..{max} rows in input {}'s dimension 0: a compiled package takes the range its compile proved, which can be narrower than the export's Dim (a choice inside the model that depends on the batch keeps the example input's side of it: on the CPU, the convolution backend torch picks under 16 rows and from 16), so a larger Dim does not help. Set max_batch_size to at most {max}, or serve the torch.export program itself (the .pt2 torch.export.save writes, not compiled), whose range is its Dim's",
                        input.name
                    ));
                }
            }
        }
        Ok(())
    }

    fn names(&self) -> String {
        let names: Vec<&str> = self.inputs.iter().map(|i| i.name.as_str()).collect();
        names.join(", ")
    }
}

impl Input {
    fn shape_text(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(Dim::to_string).collect();
        dims.join(", ")
    }

    fn check_spec(&self, spec: &TensorSpec) -> Result<(), String> {
        let who = format!("input {} (the program's {})", spec.name, self.name);
        match (spec.datatype, self.dtype) {
            (Datatype::Bytes, _) => {
                return Err(format!(
                    "{who}: declared BYTES, but a torch.export program takes tensors"
                ))
            }
            (Datatype::Tensor(d), Some(p)) if d != p => {
                return Err(format!("{who}: declared {d}, the program takes {p}"))
            }
            _ => {}
        }
        let Some(shape) = &spec.shape else {
            return Ok(());
        };
        if shape.len() != self.dims.len() {
            return Err(format!(
                "{who}: declared {shape:?}, the program takes {} dimension(s) [{}]",
                self.dims.len(),
                self.shape_text()
            ));
        }
        for (i, (&want, dim)) in shape.iter().zip(&self.dims).enumerate() {
            match dim {
                Dim::Fixed(n) if want != *n => {
                    return Err(format!(
                        "{who}: declared {shape:?}, but the program takes [{}]: dimension {i} was fixed at {n} at export. Declare {:?}{}",
                        self.shape_text(),
                        self.declarable(),
                        if want == -1 {
                            ", or export with a torch.export.Dim for that dimension"
                        } else {
                            ""
                        }
                    ))
                }
                Dim::Dynamic { .. } if want >= 0 => check_dim(&who, i, dim, want)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// The program's shape as the metadata writes it: fixed sizes, `-1` for dynamic ones.
    fn declarable(&self) -> Vec<i64> {
        let size = |d: &Dim| match d {
            Dim::Fixed(n) => *n,
            _ => -1,
        };
        self.dims.iter().map(size).collect()
    }

    /// Batching stacks requests along dimension 0: the export must take any size there up
    /// to `max_batch_size`.
    fn check_batch(&self, max_batch_size: u32) -> Result<(), String> {
        let rows = i64::from(max_batch_size);
        match self.dims.first() {
            Some(Dim::Dynamic { max: Some(max), .. }) if *max < rows => Err(format!(
                "max_batch_size is {rows}, but the export bounds input {}'s dimension 0 at {max}: lower max_batch_size, or export with torch.export.Dim(\"batch\", max={rows})",
                self.name
            )),
            Some(Dim::Dynamic { .. }) => Ok(()),
            Some(d) => Err(format!(
                "max_batch_size is {rows}, but input {}'s dimension 0 is fixed at {d} in the export: batching needs it dynamic; export with dynamic_shapes={{\"{}\": {{0: torch.export.Dim(\"batch\", max={rows})}}}}",
                self.name, self.name
            )),
            None => Err(format!(
                "max_batch_size is {rows}, but input {} is a scalar (no dimension 0 to batch along)",
                self.name
            )),
        }
    }
}

/// One size against its dimension: a fixed size equal, a dynamic one within its bounds.
fn check_dim(name: &str, i: usize, dim: &Dim, got: i64) -> Result<(), String> {
    match dim {
        Dim::Fixed(n) if got != *n => Err(format!(
            "input {name}: dimension {i} is {got}, the program takes {n} there (fixed at export)"
        )),
        Dim::Dynamic { min, .. } if got < *min => Err(format!(
            "input {name}: dimension {i} is {got}, below the export's bound of {min} (torch.export.Dim min={min})"
        )),
        Dim::Dynamic { max: Some(max), .. } if got > *max => Err(format!(
            "input {name}: dimension {i} is {got}, above the export's bound of {max} (torch.export.Dim max={max})"
        )),
        _ => Ok(()),
    }
}

fn input(name: &str, value: &Value, ranges: &Value) -> Result<Input, String> {
    let scalar = value["dtype"]
        .as_i64()
        .ok_or_else(|| format!("its program records no dtype for input {name}"))?;
    let sizes = value["sizes"]
        .as_array()
        .ok_or_else(|| format!("its program records no sizes for input {name}"))?;
    let dims = sizes
        .iter()
        .map(|s| dim(s, ranges))
        .collect::<Result<_, _>>()?;
    Ok(Input {
        name: name.to_string(),
        dtype: dtype_of(scalar),
        scalar,
        dims,
    })
}

/// `{"as_int": 4}`, or `{"as_expr": {"expr_str": "Symbol('s77', positive=True, …)"}}`.
fn dim(size: &Value, ranges: &Value) -> Result<Dim, String> {
    if let Some(n) = size["as_int"].as_i64() {
        return Ok(Dim::Fixed(n));
    }
    let expr = size["as_expr"]["expr_str"]
        .as_str()
        .ok_or_else(|| format!("a size the server cannot read: {size}"))?;
    let symbol = expr
        .strip_prefix("Symbol('")
        .and_then(|r| r.split('\'').next());
    let Some(symbol) = symbol else {
        return Ok(Dim::Derived(expr.to_string()));
    };
    let range = &ranges[symbol];
    Ok(Dim::Dynamic {
        symbol: symbol.to_string(),
        min: range["min_val"].as_i64().unwrap_or(0),
        max: range["max_val"].as_i64().filter(|&m| m < i64::MAX / 2),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What torch 2.11 writes for `x: [Dim("batch", max=64), 4]` float32.
    fn program() -> Signature {
        let doc = json!({
            "range_constraints": {"s77": {"min_val": 1, "max_val": 64}},
            "graph_module": {
                "signature": {"input_specs": [
                    {"parameter": {"arg": {"name": "p_w"}, "parameter_name": "w"}},
                    {"user_input": {"arg": {"as_tensor": {"name": "x"}}}}
                ]},
                "graph": {"tensor_values": {
                    "p_w": {"dtype": 7, "sizes": [{"as_int": 4}]},
                    "x": {"dtype": 7, "device": {"type": "cpu"}, "sizes": [
                        {"as_expr": {"expr_str": "Symbol('s77', positive=True, integer=True)",
                                     "hint": {"as_int": 2}}},
                        {"as_int": 4}
                    ]}
                }}
            }
        });
        Signature::parse(doc.to_string().as_bytes()).unwrap()
    }

    fn spec(shape: &[i64], dtype: Dtype) -> TensorSpec {
        TensorSpec {
            name: "x".into(),
            datatype: Datatype::Tensor(dtype),
            shape: Some(shape.to_vec()),
            document: None,
        }
    }

    #[test]
    fn the_device_and_its_index_are_read() {
        let text = |device: serde_json::Value| {
            json!({"graph_module": {
                "signature": {"input_specs": [{"user_input": {"arg": {"as_tensor": {"name": "x"}}}}]},
                "graph": {"tensor_values": {"x": {"dtype": 7, "device": device, "sizes": [{"as_int": 4}]}}}
            }})
            .to_string()
        };
        let s = Signature::parse(text(json!({"type": "cuda", "index": 1})).as_bytes()).unwrap();
        assert_eq!((s.device.as_str(), s.device_index), ("cuda", Some(1)));
        let s = Signature::parse(text(json!({"type": "cpu"})).as_bytes()).unwrap();
        assert_eq!((s.device.as_str(), s.device_index), ("cpu", None));
    }

    #[test]
    fn the_user_inputs_and_their_bounds_are_read() {
        let s = program();
        assert_eq!(s.device, "cpu");
        assert_eq!(s.inputs.len(), 1, "parameters are not inputs");
        let x = &s.inputs[0];
        assert_eq!(x.dtype, Some(Dtype::Float32));
        assert_eq!(
            x.dims,
            vec![
                Dim::Dynamic {
                    symbol: "s77".into(),
                    min: 1,
                    max: Some(64)
                },
                Dim::Fixed(4)
            ]
        );
    }

    #[test]
    fn a_request_out_of_the_exports_bounds_is_named() {
        let s = program();
        let t = |rows: i64, cols: i64| Tensor::zeros([rows, cols], (Kind::Float, tch::Device::Cpu));
        assert_eq!(s.check(&[t(3, 4)]), Ok(()));
        let e = s.check(&[t(65, 4)]).unwrap_err();
        assert!(
            e.contains("input x: dimension 0 is 65, above the export's bound of 64"),
            "{e}"
        );
        let e = s.check(&[t(2, 5)]).unwrap_err();
        assert!(e.contains("dimension 1 is 5, the program takes 4"), "{e}");
        let e = s.check(&[t(2, 4).to_kind(Kind::Int64)]).unwrap_err();
        assert!(e.contains("the program takes float32"), "{e}");
        let e = s.check(&[t(2, 4), t(2, 4)]).unwrap_err();
        assert!(e.contains("takes 1 input(s) (x), the request has 2"), "{e}");
    }

    #[test]
    fn declared_inputs_and_batching_must_fit_the_export() {
        let s = program();
        assert_eq!(
            s.check_declared(Some(&[spec(&[-1, 4], Dtype::Float32)]), 8),
            Ok(())
        );
        let e = s
            .check_declared(Some(&[spec(&[-1, 5], Dtype::Float32)]), 0)
            .unwrap_err();
        assert!(
            e.contains("declared [-1, 5], but the program takes [1..64, 4]: dimension 1 was fixed at 4 at export. Declare [-1, 4]"),
            "{e}"
        );
        let e = s
            .check_declared(Some(&[spec(&[-1, 4], Dtype::Int64)]), 0)
            .unwrap_err();
        assert!(
            e.contains("declared int64, the program takes float32"),
            "{e}"
        );
        let e = s.check_declared(None, 128).unwrap_err();
        assert!(
            e.contains("bounds input x's dimension 0 at 64") && e.contains("torch.export.Dim"),
            "{e}"
        );
        // A compiled package's narrower range: what sets it, and what helps.
        let mut compiled = s.clone();
        compiled.inputs[0].dims[0] = Dim::Dynamic {
            symbol: "s77".into(),
            min: 2,
            max: Some(15),
        };
        assert_eq!(compiled.check_compiled_batch(15), Ok(()));
        let e = compiled.check_compiled_batch(32).unwrap_err();
        assert!(
            e.contains("the package takes 2..15 rows") && e.contains("at most 15"),
            "{e}"
        );
        let mut fixed = s.clone();
        fixed.inputs[0].dims[0] = Dim::Fixed(2);
        let e = fixed.check_declared(None, 8).unwrap_err();
        assert!(
            e.contains("dimension 0 is fixed at 2 in the export")
                && e.contains("torch.export.Dim(\"batch\", max=8)"),
            "{e}"
        );
    }
}
