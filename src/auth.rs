//! Token auth (`--api-key-file`, `--metrics-api-key-file`): the keys a file holds, and the
//! check of a request's `Authorization: Bearer <key>` against them. Opt-in: without a key
//! file nothing is checked.
//!
//! The file: one key per line; blank lines and lines starting with `#` are skipped, spaces
//! around a key are trimmed. A key is 16 to 4096 visible ASCII characters (no spaces): a
//! shorter one is too easy to guess to be a secret. Keys never appear in a message or a log
//! line.
//!
//! The check costs the same whatever the number of keys and whatever the token shares with
//! one: only the keys' SHA-256 digests are kept, the token's digest is computed (one pass
//! over at most [`MAX_KEY_LEN`] bytes) and looked up in a hash set. The lookup's time can
//! depend on the token's *digest*, which says nothing a client can use about any key
//! (finding a token whose digest is near a key's is a preimage search); the last step
//! compares the two digests in constant time. (It compared the token with every key, byte
//! by byte: +0.83 ms a request with 10,000 keys of 64 characters, +4.3 ms with 1,000 of
//! 4,096, unauthenticated requests included.)

use std::collections::HashSet;
use std::path::Path;

use sha2::{Digest, Sha256};

/// The shortest key accepted.
pub const MIN_KEY_LEN: usize = 16;
/// The longest key accepted (and the longest `Authorization` value compared).
pub const MAX_KEY_LEN: usize = 4096;

/// The largest key file read (4,096 keys of the longest length).
pub const MAX_KEY_FILE_BYTES: u64 = 16 << 20;

/// The valid keys, as their SHA-256 digests.
#[derive(Clone)]
pub struct ApiKeys {
    digests: HashSet<[u8; 32]>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.digests.len())
    }
}

/// Why a request was refused (the `reason` label of `vramfork_auth_failures_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header that is not `Bearer <token>`.
    Malformed,
    /// A bearer token that is none of the keys.
    Invalid,
}

impl AuthFailure {
    pub fn reason(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::Invalid => "invalid",
        }
    }

    /// The answer's `WWW-Authenticate` value (RFC 6750 section 3).
    pub fn challenge(self) -> &'static str {
        match self {
            AuthFailure::Missing => "Bearer realm=\"vramfork\"",
            AuthFailure::Malformed => "Bearer realm=\"vramfork\", error=\"invalid_request\"",
            AuthFailure::Invalid => "Bearer realm=\"vramfork\", error=\"invalid_token\"",
        }
    }

    /// The error message (never the token).
    pub fn message(self) -> &'static str {
        match self {
            AuthFailure::Missing => {
                "this server requires an API key: send `Authorization: Bearer <key>`"
            }
            AuthFailure::Malformed => "the Authorization header must be `Bearer <key>`",
            AuthFailure::Invalid => "the API key is not valid",
        }
    }
}

impl ApiKeys {
    /// Reads and checks a key file (a regular file: never a FIFO or a device, see
    /// `crate::files`); the message names the file and the line, never a key.
    pub fn load(path: &Path) -> Result<ApiKeys, String> {
        ApiKeys::parse(&ApiKeys::read(path)?)
            .map_err(|e| format!("API key file {}: {e}", path.display()))
    }

    /// A key file's text, unchecked (for [`ApiKeys::parse`]).
    pub fn read(path: &Path) -> Result<String, String> {
        let bytes = crate::files::read_regular(path, MAX_KEY_FILE_BYTES)
            .map_err(|e| format!("cannot read the API key file {}: {e}", path.display()))?;
        String::from_utf8(bytes)
            .map_err(|_| format!("API key file {}: not UTF-8 text", path.display()))
    }

    pub fn parse(text: &str) -> Result<ApiKeys, String> {
        let mut digests = HashSet::new();
        for (i, line) in text.lines().enumerate() {
            let key = line.trim();
            if key.is_empty() || key.starts_with('#') {
                continue;
            }
            if !key.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "line {}: a key is visible ASCII characters without spaces",
                    i + 1
                ));
            }
            if !(MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()) {
                return Err(format!(
                    "line {}: a key has {MIN_KEY_LEN} to {MAX_KEY_LEN} characters, this one {}",
                    i + 1,
                    key.len()
                ));
            }
            digests.insert(digest(key.as_bytes()));
        }
        if digests.is_empty() {
            return Err("no key in it (one key per line; # starts a comment)".into());
        }
        Ok(ApiKeys { digests })
    }

    /// How many different keys.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Checks an `Authorization` header's value (`None`: no header).
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), AuthFailure> {
        let value = authorization.ok_or(AuthFailure::Missing)?;
        let token = bearer(value).ok_or(AuthFailure::Malformed)?;
        let d = digest(token);
        if self.digests.get(&d).is_some_and(|k| same(k, &d)) {
            Ok(())
        } else {
            Err(AuthFailure::Invalid)
        }
    }
}

/// The token of `Bearer <token>` (the scheme case-insensitive, RFC 7235 section 2.1).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    if value.len() < 7 || !value[..7].eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = value[7..].trim_ascii();
    (!token.is_empty() && token.len() <= MAX_KEY_LEN).then_some(token)
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Whether `a` equals `b`, in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "k1-0123456789abcdef";
    const K2: &str = "k2-fedcba9876543210";

    fn keys() -> ApiKeys {
        ApiKeys::parse(&format!("# service keys\n\n  {K1}  \n{K2}\n")).unwrap()
    }

    #[test]
    fn the_file_holds_one_key_per_line() {
        assert_eq!(keys().len(), 2);
        for (text, want) in [
            ("", "no key"),
            ("# only a comment\n", "no key"),
            (
                "short\n",
                "line 1: a key has 16 to 4096 characters, this one 5",
            ),
            (
                "# c\nwith a space in it!!\n",
                "line 2: a key is visible ASCII",
            ),
        ] {
            let e = ApiKeys::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn only_a_bearer_token_that_is_a_key_passes() {
        let k = keys();
        let h = |s: &str| Some(s.as_bytes().to_vec());
        let check = |v: Option<Vec<u8>>| k.check(v.as_deref());
        assert_eq!(check(h(&format!("Bearer {K1}"))), Ok(()));
        assert_eq!(check(h(&format!("bearer  {K2} "))), Ok(()));
        assert_eq!(check(None), Err(AuthFailure::Missing));
        assert_eq!(check(h(K1)), Err(AuthFailure::Malformed));
        assert_eq!(check(h("Basic dXNlcjpwYXNz")), Err(AuthFailure::Malformed));
        assert_eq!(check(h("Bearer ")), Err(AuthFailure::Malformed));
        assert_eq!(
            check(h(&format!("Bearer {K1}x"))),
            Err(AuthFailure::Invalid)
        );
        assert_eq!(
            check(h(&format!("Bearer {}", &K1[..15]))),
            Err(AuthFailure::Invalid)
        );
        assert_eq!(
            check(h("Bearer k1-0123456789abcdeF")),
            Err(AuthFailure::Invalid)
        );
    }

    #[test]
    fn a_file_that_repeats_a_key_counts_it_once() {
        let k = ApiKeys::parse(&format!("{K1}\n{K1}\n{K2}\n")).unwrap();
        assert_eq!(k.len(), 2);
    }

    #[test]
    fn keys_never_show_in_debug_output() {
        let s = format!("{:?}", keys());
        assert!(!s.contains(K1) && !s.contains(K2), "{s}");
    }

    #[test]
    fn same_compares_whole_slices() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
        assert!(same(b"", b""));
    }
}
