//! What `forward()` is called with: the model's arguments ([`Arg`], [`Inputs`]) and the
//! dtype helpers every decoder and the runner share (the tensor kind a declared dtype is
//! stored as, the values an integer dtype holds). A leaf: it knows tch and the metadata's
//! types, nothing of HTTP or the model thread.

use tch::{Kind, Tensor};
use vramfork::metadata::Dtype;

/// One argument of the model's `forward`.
#[derive(Debug)]
pub enum Arg {
    Tensor(Tensor),
    /// A `BYTES` input: a TorchScript `List[str]`.
    Strings(Vec<String>),
    /// A document input's raw elements (images, as v2 binary data or a raw `POST /` body),
    /// before pre-processing turns them into a tensor (`documents/`).
    Blobs(Vec<Vec<u8>>),
    /// A tokenized text input (`[rows, length]`) padded to its request's longest document
    /// with `pad`: the batcher pads the requests of one pass to the longest among them.
    Padded {
        tensor: Tensor,
        pad: i64,
    },
}

/// What the model is called with: its arguments in the declared order.
#[derive(Debug)]
pub struct Inputs {
    pub args: Vec<Arg>,
}

/// The tensor kind of a declared dtype.
pub fn kind_of(d: Dtype) -> Kind {
    match d {
        Dtype::Float32 => Kind::Float,
        Dtype::Float64 => Kind::Double,
        Dtype::Float16 => Kind::Half,
        Dtype::BFloat16 => Kind::BFloat16,
        Dtype::Int64 => Kind::Int64,
        Dtype::Int32 => Kind::Int,
        Dtype::Int16 => Kind::Int16,
        Dtype::Int8 => Kind::Int8,
        Dtype::UInt8 => Kind::Uint8,
        Dtype::Bool => Kind::Bool,
    }
}

/// The values an integer dtype holds.
pub fn int_range(d: Dtype) -> (i64, i64) {
    match d {
        Dtype::Int8 => (i8::MIN.into(), i8::MAX.into()),
        Dtype::UInt8 => (0, u8::MAX.into()),
        Dtype::Int16 => (i16::MIN.into(), i16::MAX.into()),
        Dtype::Int32 => (i32::MIN.into(), i32::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    }
}
