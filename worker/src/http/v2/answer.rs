//! A v2 REST answer's `outputs`, written from the model thread's typed outputs: each an output
//! object (`name`, `datatype`, `shape`), its data a flat row-major JSON array or, when asked,
//! raw bytes in the binary tail (Triton's binary tensor data extension: little-endian
//! elements; for `BYTES`, each string as a 4-byte little-endian length and its UTF-8 bytes).
//! Floats are written in their shortest exact form (FP16 and BF16 as the FP32 they widen to),
//! NaN and ±Inf as `null`; integers as integers; `BOOL` as `true`/`false`.

use vramfork::metadata::{Datatype, Dtype};

use crate::infer::OutTensor;

/// Which outputs' data go binary: those asked for by name, each as the request says (in its
/// order); the others as `binary_data_output` says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Binary {
    pub named: Vec<bool>,
    pub default: bool,
}

impl Binary {
    /// Whether the `i`-th output of the answer goes binary.
    pub fn of(&self, i: usize) -> bool {
        self.named.get(i).copied().unwrap_or(self.default)
    }
}

/// Writes the JSON array of output objects to `json`; returns whether any output goes binary
/// (the answer then carries a binary tail, even an empty one: [`write_tail`]).
pub fn write_outputs(outs: &[OutTensor], binary: &Binary, json: &mut Vec<u8>) -> bool {
    let mut any = false;
    json.push(b'[');
    for (i, o) in outs.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        write_head(o, json);
        if binary.of(i) {
            any = true;
            json.extend_from_slice(b",\"parameters\":{\"binary_data_size\":");
            int(o.data.len() as i64, json);
            json.extend_from_slice(b"}}");
        } else {
            json.extend_from_slice(b",\"data\":");
            write_data(o, json);
            json.push(b'}');
        }
    }
    json.push(b']');
    any
}

/// Appends the data of the outputs that go binary, in order, to `body` (after its JSON).
pub fn write_tail(outs: &[OutTensor], binary: &Binary, body: &mut Vec<u8>) {
    for (i, o) in outs.iter().enumerate() {
        if binary.of(i) {
            body.extend_from_slice(&o.data);
        }
    }
}

/// `{"name":…,"datatype":…,"shape":[…]` (the object left open for its data).
fn write_head(o: &OutTensor, json: &mut Vec<u8>) {
    json.extend_from_slice(b"{\"name\":");
    serde_json::to_writer(&mut *json, &o.name).expect("writing to a Vec cannot fail");
    json.extend_from_slice(b",\"datatype\":\"");
    json.extend_from_slice(o.datatype.v2_name().as_bytes());
    json.extend_from_slice(b"\",\"shape\":[");
    for (i, d) in o.shape.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        int(*d, json);
    }
    json.push(b']');
}

/// The output's data as a flat JSON array.
fn write_data(o: &OutTensor, json: &mut Vec<u8>) {
    let d = &o.data[..];
    match o.datatype {
        Datatype::Bytes => {
            json.push(b'[');
            let mut rest = d;
            let mut first = true;
            while rest.len() >= 4 {
                let n = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let one = &rest[4..(4 + n).min(rest.len())];
                rest = &rest[4 + one.len()..];
                if !first {
                    json.push(b',');
                }
                first = false;
                serde_json::to_writer(&mut *json, &String::from_utf8_lossy(one))
                    .expect("writing to a Vec cannot fail");
            }
            json.push(b']');
        }
        Datatype::Tensor(t) => match t {
            Dtype::Float32 => list::<4>(d, json, |b, o| float(f32::from_le_bytes(b), o)),
            Dtype::Float64 => list::<8>(d, json, |b, o| float(f64::from_le_bytes(b), o)),
            Dtype::Float16 => list::<2>(d, json, |b, o| {
                float(half::f16::from_le_bytes(b).to_f32(), o)
            }),
            Dtype::BFloat16 => list::<2>(d, json, |b, o| {
                float(half::bf16::from_le_bytes(b).to_f32(), o)
            }),
            Dtype::Int64 => list::<8>(d, json, |b, o| int(i64::from_le_bytes(b), o)),
            Dtype::Int32 => list::<4>(d, json, |b, o| int(i32::from_le_bytes(b).into(), o)),
            Dtype::Int16 => list::<2>(d, json, |b, o| int(i16::from_le_bytes(b).into(), o)),
            Dtype::Int8 => list::<1>(d, json, |b, o| int(i8::from_le_bytes(b).into(), o)),
            Dtype::UInt8 => list::<1>(d, json, |b, o| int(b[0].into(), o)),
            Dtype::Bool => list::<1>(d, json, |b, o| {
                o.extend_from_slice(if b[0] != 0 { b"true" } else { b"false" })
            }),
        },
    }
}

/// `[e, e, …]` of the little-endian elements of `N` bytes in `data`.
fn list<const N: usize>(data: &[u8], json: &mut Vec<u8>, each: impl Fn([u8; N], &mut Vec<u8>)) {
    json.reserve(data.len() / N * 8 + 2);
    json.push(b'[');
    for (i, b) in data.chunks_exact(N).enumerate() {
        if i > 0 {
            json.push(b',');
        }
        each(b.try_into().expect("chunks of N bytes"), json);
    }
    json.push(b']');
}

fn int(i: i64, json: &mut Vec<u8>) {
    json.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
}

/// A float in its shortest exact form; NaN and ±Inf (JSON has no such numbers) as `null`.
fn float<F: ryu::Float + Finite>(f: F, json: &mut Vec<u8>) {
    if f.finite() {
        json.extend_from_slice(ryu::Buffer::new().format_finite(f).as_bytes());
    } else {
        json.extend_from_slice(b"null");
    }
}

trait Finite {
    fn finite(self) -> bool;
}

impl Finite for f32 {
    fn finite(self) -> bool {
        self.is_finite()
    }
}

impl Finite for f64 {
    fn finite(self) -> bool {
        self.is_finite()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(datatype: Datatype, shape: &[i64], data: Vec<u8>) -> OutTensor {
        OutTensor {
            name: "y".into(),
            datatype,
            shape: shape.to_vec(),
            data,
        }
    }

    fn json_of(o: &OutTensor) -> String {
        let mut json = Vec::new();
        assert!(!write_outputs(
            std::slice::from_ref(o),
            &Binary::default(),
            &mut json
        ));
        String::from_utf8(json).unwrap()
    }

    #[test]
    fn each_datatype_is_written_as_its_json_numbers() {
        let f32s: Vec<u8> = [1.5f32, -0.1, f32::NAN, f32::INFINITY]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        assert_eq!(
            json_of(&out(Datatype::Tensor(Dtype::Float32), &[2, 2], f32s)),
            r#"[{"name":"y","datatype":"FP32","shape":[2,2],"data":[1.5,-0.1,null,null]}]"#
        );
        let f16s: Vec<u8> = [half::f16::from_f32(0.5), half::f16::from_f32(-2.0)]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        assert!(json_of(&out(Datatype::Tensor(Dtype::Float16), &[2], f16s))
            .ends_with(r#""data":[0.5,-2.0]}]"#));
        let i16s: Vec<u8> = [-3i16, 700].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert!(json_of(&out(Datatype::Tensor(Dtype::Int16), &[2], i16s))
            .ends_with(r#""data":[-3,700]}]"#));
        assert!(
            json_of(&out(Datatype::Tensor(Dtype::UInt8), &[2], vec![0, 255]))
                .ends_with(r#""data":[0,255]}]"#)
        );
        assert!(
            json_of(&out(Datatype::Tensor(Dtype::Bool), &[2], vec![1, 0]))
                .ends_with(r#""data":[true,false]}]"#)
        );
        let mut s = Vec::new();
        for one in ["a\"b", ""] {
            s.extend_from_slice(&(one.len() as u32).to_le_bytes());
            s.extend_from_slice(one.as_bytes());
        }
        assert_eq!(
            json_of(&out(Datatype::Bytes, &[2], s)),
            r#"[{"name":"y","datatype":"BYTES","shape":[2],"data":["a\"b",""]}]"#
        );
    }

    #[test]
    fn binary_outputs_go_to_the_tail_with_their_size() {
        let a = out(Datatype::Tensor(Dtype::Int8), &[2], vec![1, 2]);
        let mut b = out(Datatype::Tensor(Dtype::Int8), &[1], vec![3]);
        b.name = "z".into();
        let mut json = Vec::new();
        let binary = Binary {
            named: vec![false, true],
            default: false,
        };
        let outs = [a, b];
        assert!(write_outputs(&outs, &binary, &mut json));
        let mut tail = Vec::new();
        write_tail(&outs, &binary, &mut tail);
        assert_eq!(
            String::from_utf8(json).unwrap(),
            r#"[{"name":"y","datatype":"INT8","shape":[2],"data":[1,2]},{"name":"z","datatype":"INT8","shape":[1],"parameters":{"binary_data_size":1}}]"#
        );
        assert_eq!(tail, vec![3]);
    }
}
