//! What `forward()` is called with: the model's arguments ([`Arg`], [`Inputs`]) and the
//! dtype helpers every decoder and the runner share (the tensor kind a declared dtype is
//! stored as, the values an integer dtype holds). A leaf: it knows tch and the metadata's
//! types, nothing of HTTP or the model thread.

use tch::{Device, Kind, TchError, Tensor};
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

/// A CPU tensor of `shape` and `kind` holding a copy of `bytes` (little-endian elements,
/// row-major), which must be exactly its size. tch's `from_data_size` makes the tensor with
/// `zeros` before copying (`at_tensor_of_data` in torch-sys's `torch_api.cpp`): a pass over
/// the memory and a dispatcher call more for every binary input.
pub fn tensor_from_bytes(bytes: &[u8], shape: &[i64], kind: Kind) -> Result<Tensor, TchError> {
    let t = Tensor::f_empty(shape, (kind, Device::Cpu))?;
    let size = t.numel() * kind.elt_size_in_bytes();
    if size != bytes.len() {
        return Err(TchError::Shape(format!(
            "{} bytes for shape {shape:?} of {kind:?}, which takes {size}",
            bytes.len()
        )));
    }
    if size > 0 {
        // SAFETY: `t` is a tensor this function just made: contiguous, on the CPU, shared
        // with nothing, `size` bytes long from its data pointer; `bytes` is `size` bytes
        // long and cannot overlap it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), t.data_ptr().cast(), size) };
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_from_bytes_holds_them_and_must_be_their_size() {
        let values = [1.5f32, -2.0, 3.25, 0.0, 7.0, -0.5];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = tensor_from_bytes(&bytes, &[2, 3], Kind::Float).unwrap();
        assert_eq!(t.size(), [2, 3]);
        let back = Vec::<f32>::try_from(t.reshape([-1])).unwrap();
        assert_eq!(back, values);
        let e = tensor_from_bytes(&bytes, &[2, 2], Kind::Float).unwrap_err();
        assert!(e.to_string().contains("24 bytes for shape [2, 2]"), "{e}");
        let e = tensor_from_bytes(&bytes, &[7], Kind::Uint8).unwrap_err();
        assert!(e.to_string().contains("takes 7"), "{e}");
        let empty = tensor_from_bytes(&[], &[0, 3], Kind::Int64).unwrap();
        assert_eq!(empty.size(), [0, 3]);
    }
}
