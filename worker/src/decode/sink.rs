//! The tensor a JSON input's elements are written into as they are parsed (by `numeric.rs`,
//! `elements.rs` and `quick.rs`): one allocation for as many elements as the text could
//! hold, written in place, then viewed as the elements written.

use tch::{Device, Kind, Tensor};
use vramfork::metadata::Dtype;

use crate::args::kind_of;

/// The tensor being filled: its storage type follows the dtype (16-bit floats are kept as
/// float32 and converted once at the end).
pub(super) struct Sink {
    tensor: Tensor,
    /// The tensor's first element (asked of libtorch once: an FFI call per element cost
    /// about a tenth of a 63 kB body's parse).
    data: *mut u8,
    kind: Kind,
    cap: usize,
    len: usize,
}

impl Sink {
    pub(super) fn new(dtype: Dtype, cap: usize) -> Sink {
        let kind = storage_kind(dtype);
        let tensor = Tensor::empty([cap as i64], (kind, Device::Cpu));
        let data = tensor.data_ptr().cast();
        Sink {
            tensor,
            data,
            kind,
            cap,
            len: 0,
        }
    }

    /// Appends one element (already converted to the storage type's value).
    pub(super) fn push<T: tch::kind::Element>(&mut self, v: T) {
        debug_assert_eq!(T::KIND, self.kind);
        // Each element needs at least two bytes of body, so `cap` always suffices; the
        // check keeps a bug from writing out of bounds.
        assert!(self.len < self.cap, "input buffer too small");
        // SAFETY: `data` is the first element of the tensor, a contiguous CPU tensor of `cap`
        // elements of type T (its kind is T::KIND, checked above), owned by `self` and
        // alive for this write (its storage never moves); `len < cap` keeps the write
        // inside it.
        unsafe { self.data.cast::<T>().add(self.len).write(v) };
        self.len += 1;
    }

    /// Whether the buffer has no room for another element.
    pub(super) fn is_full(&self) -> bool {
        self.len >= self.cap
    }

    /// Forgets the elements written (the buffer is kept).
    pub(super) fn clear(&mut self) {
        self.len = 0;
    }

    /// The elements written, as a tensor of `shape` and `dtype` (a view: no copy, unless a
    /// 16-bit float dtype needs the conversion).
    pub(super) fn finish(self, shape: &[i64], dtype: Dtype) -> Result<Tensor, tch::TchError> {
        let t = self
            .tensor
            .f_narrow(0, 0, self.len as i64)?
            .f_reshape(shape)?;
        let want = kind_of(dtype);
        if want == self.kind {
            Ok(t)
        } else {
            t.f_to_kind(want)
        }
    }
}

fn storage_kind(d: Dtype) -> Kind {
    match d {
        Dtype::Float32 | Dtype::Float16 | Dtype::BFloat16 => Kind::Float,
        other => kind_of(other),
    }
}
