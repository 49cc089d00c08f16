//! Request bodies decoded into what the model is called with (`crate::args::Inputs`): the
//! `POST /` formats (`post.rs`), the one-pass numeric parser for one numeric input
//! (`numeric.rs`, which tries the quick reader of the common body, `quick.rs`, first) and the named-input element parser shared with v2 (`elements.rs`), both
//! checking a nested array's shape with `nesting.rs`. Every way a `POST /` body can be wrong
//! is a [`BodyError`] whose message names where; `error.rs` maps it to its status (400), as
//! it does the v2 parser's errors.

pub mod elements;
mod nesting;
pub mod numeric;
pub mod post;
mod quick;
mod sink;

use std::fmt;

/// Why a body is refused (both are 400s; the message says which).
#[derive(Debug, Clone, PartialEq)]
pub enum BodyError {
    /// Not JSON at all (syntax, truncated, trailing characters).
    NotJson(String),
    /// JSON, but not a request this model takes.
    Invalid(String),
    /// More documents in an input than its `max_documents` (413; counted while parsing,
    /// the documents past the limit never kept).
    TooLarge(String),
}

impl From<String> for BodyError {
    fn from(m: String) -> BodyError {
        BodyError::Invalid(m)
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::NotJson(e) => write!(f, "request body is not valid JSON: {e}"),
            BodyError::Invalid(m) | BodyError::TooLarge(m) => f.write_str(m),
        }
    }
}

/// The message for a body that is JSON but not an object.
pub const NOT_AN_OBJECT: &str = "request body must be a JSON object like {\"inputs\": [[...]]}";

/// Test helper: what two readers made of `what` is the same tensor (size, dtype, values) or
/// the same refusal; true when both read it.
#[cfg(test)]
fn same_outcome(
    a: Result<tch::Tensor, BodyError>,
    b: Result<tch::Tensor, BodyError>,
    what: &str,
) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => {
            assert_eq!((a.size(), a.kind()), (b.size(), b.kind()), "{what}");
            assert!(a.equal(&b), "{what}");
            true
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "{what}");
            false
        }
        (a, b) => panic!("{what}: {a:?} against {b:?}"),
    }
}
