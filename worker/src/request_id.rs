//! Request ids (`X-Request-Id`): the one a client sends, when it is a usable id, or one this
//! worker makes; put on every answer (errors and refusals included), used as the v2 `id`
//! when the body gives none, and carried into the model thread's log lines, so a request a
//! pipeline reports can be found.
//!
//! Usable: 1 to [`MAX_LEN`] bytes, each a visible ASCII character (`!`..`~`), as nginx and
//! Envoy pass them on; anything else (spaces, control bytes, non-ASCII, too long) is
//! replaced by a made one rather than refused — a request is never failed for its id.
//! Made: 32 hex digits from this process's start time, its pid and a counter, mixed, so
//! ids of different workers and restarts do not repeat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

/// The header, both ways.
pub static HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The longest id taken from a request, in bytes.
pub const MAX_LEN: usize = 128;

/// A request's id, kept in the request's extensions for the handlers.
#[derive(Debug, Clone)]
pub struct RequestId(pub HeaderValue);

impl RequestId {
    /// The client's id if usable, else a new one.
    pub fn of(headers: &HeaderMap) -> RequestId {
        RequestId(
            headers
                .get(&HEADER)
                .filter(|v| usable(v.as_bytes()))
                .cloned()
                .unwrap_or_else(made),
        )
    }

    pub fn as_str(&self) -> &str {
        // Usable and made ids are visible ASCII only.
        self.0.to_str().unwrap_or_default()
    }
}

fn usable(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_LEN && id.iter().all(|b| (b'!'..=b'~').contains(b))
}

/// A new id: 32 hex digits (this process's seed, then [`unique`]).
fn made() -> HeaderValue {
    let id = format!("{:016x}{:016x}", seed(), unique());
    HeaderValue::from_str(&id).expect("hex digits are a valid header value")
}

/// This process's seed: its start time and pid, mixed.
fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        mix(nanos ^ (u64::from(std::process::id()) << 32))
    })
}

/// 64 bits no other call in this process gets (nor, but by chance, another worker's or
/// restart's): the process's seed and a counter, mixed. Made request ids and W3C trace and
/// span ids (`crate::observe::trace_context`) draw from it.
pub fn unique() -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    mix(seed() ^ COUNT.fetch_add(1, Ordering::Relaxed))
}

/// SplitMix64's finaliser: spreads nearby inputs over all 64 bits.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(v: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(&HEADER, HeaderValue::from_bytes(v).unwrap());
        h
    }

    #[test]
    fn usable_ids_are_kept_others_replaced() {
        assert_eq!(
            RequestId::of(&with(b"job-42/frame_7")).as_str(),
            "job-42/frame_7"
        );
        let long = vec![b'a'; MAX_LEN];
        assert_eq!(RequestId::of(&with(&long)).as_str().len(), MAX_LEN);
        for bad in [
            &b"has space"[..],
            &[b'a'; MAX_LEN + 1],
            b"tab\there",
            &[0xC3, 0xA9],
        ] {
            let id = RequestId::of(&with(bad));
            assert_ne!(id.0.as_bytes(), bad);
            assert_eq!(id.as_str().len(), 32, "{:?}", id);
        }
    }

    #[test]
    fn made_ids_are_hex_and_do_not_repeat() {
        let ids: std::collections::HashSet<String> = (0..1000)
            .map(|_| RequestId::of(&HeaderMap::new()).as_str().to_string())
            .collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids
            .iter()
            .all(|i| i.len() == 32 && i.bytes().all(|b| b.is_ascii_hexdigit())));
    }
}
