//! Priority lanes: the three levels a model request may ask for, how each client's way of
//! asking maps onto them, and their names in `/metrics`, the access log and spans.
//!
//! - Triton's schedule policy (v2 REST `parameters.priority`, gRPC's `priority` parameter):
//!   `priority_levels` 3 and `default_priority_level` 2, fixed: 1 is `high`, 2 `normal`, 3
//!   `low`, and 0 (or none) the default level, `normal`.
//! - vLLM's `priority` body field (the OpenAI-shaped doors: `/v1/embeddings`, rerank, score,
//!   classify): lower is earlier, 0 the default: below 0 is `high`, 0 `normal`, above 0 `low`.
//! - The [`HEADER`] on any HTTP door (`high`, `normal` or `low`); a body's field wins.
//!
//! The model thread serves the highest lane first at each pass boundary, oldest first within
//! a lane; a pass that has waited longer than its age limit is served as if `high`, so that
//! the lower lanes never starve.

/// The header that gives an HTTP request's lane (`POST /` has no body field for it).
pub const HEADER: &str = "x-request-priority";

/// Triton's `priority_levels`: the highest value `parameters.priority` takes.
pub const TRITON_LEVELS: u64 = 3;

/// How long a pass waits for the model before it is served as if `high`, when
/// `--max-queue-wait` is off (else half of it: [`age_limit`]).
pub const AGE_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A request's lane, highest first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lane {
    High,
    #[default]
    Normal,
    Low,
}

/// Every lane, highest first (the order of a per-lane count such as the heartbeat's).
pub const LANES: [Lane; 3] = [Lane::High, Lane::Normal, Lane::Low];

impl Lane {
    /// Its name: the `lane` label, the access log's and the header's word.
    pub fn name(self) -> &'static str {
        match self {
            Lane::High => "high",
            Lane::Normal => "normal",
            Lane::Low => "low",
        }
    }

    /// Its place in [`LANES`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The lane a [`HEADER`] value names (case and surrounding spaces ignored).
    pub fn of_header(value: &str) -> Result<Lane, String> {
        let v = value.trim();
        LANES
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(v))
            .ok_or_else(|| format!("header {HEADER} must be high, normal or low, not {value:?}"))
    }

    /// The lane of Triton's `priority` (0: the default level; 1 the highest, 3 the lowest).
    pub fn of_triton(priority: u64) -> Result<Lane, String> {
        match priority {
            0 | 2 => Ok(Lane::Normal),
            1 => Ok(Lane::High),
            3 => Ok(Lane::Low),
            p => Err(format!(
                "parameter priority must be a level from 1 (the highest) to {TRITON_LEVELS}, or 0 for the default level (2), not {p}"
            )),
        }
    }

    /// The lane of vLLM's `priority` (lower is earlier, 0 the default).
    pub fn of_vllm(priority: i64) -> Lane {
        match priority {
            p if p < 0 => Lane::High,
            0 => Lane::Normal,
            _ => Lane::Low,
        }
    }
}

/// vLLM's `priority` field as JSON: an integer, lower served earlier, 0 the default; `null`
/// is none. Anything else is refused with a message naming the field.
pub fn of_vllm_json(v: &serde_json::Value) -> Result<Option<Lane>, String> {
    match v {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => {
            Ok(Some(n.as_i64().map_or(Lane::Low, Lane::of_vllm)))
        }
        other => Err(vllm_refusal(&other.to_string())),
    }
}

/// The refusal of a `priority` field that is `shown`, not an integer.
pub fn vllm_refusal(shown: &str) -> String {
    format!("`priority` must be an integer (lower is served earlier; 0, the default, is the normal lane), not {shown}")
}

/// How long a pass waits for the model before it is served as if `high`: half of
/// `--max-queue-wait` (so that it runs before that refuses it), or [`AGE_LIMIT`] without one.
pub fn age_limit(max_queue_wait: Option<std::time::Duration>) -> std::time::Duration {
    max_queue_wait.map_or(AGE_LIMIT, |m| m / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_maps_onto_the_three_lanes() {
        assert_eq!(Lane::of_triton(0), Ok(Lane::Normal));
        assert_eq!(Lane::of_triton(1), Ok(Lane::High));
        assert_eq!(Lane::of_triton(2), Ok(Lane::Normal));
        assert_eq!(Lane::of_triton(3), Ok(Lane::Low));
        assert!(Lane::of_triton(4).unwrap_err().contains("priority"));
        assert_eq!(Lane::of_vllm(-5), Lane::High);
        assert_eq!(Lane::of_vllm(0), Lane::Normal);
        assert_eq!(Lane::of_vllm(7), Lane::Low);
        let j = |t: &str| of_vllm_json(&serde_json::from_str(t).unwrap());
        assert_eq!(j("-1"), Ok(Some(Lane::High)));
        assert_eq!(j("0"), Ok(Some(Lane::Normal)));
        assert_eq!(j("18446744073709551615"), Ok(Some(Lane::Low)));
        assert_eq!(j("null"), Ok(None));
        for bad in ["1.5", "\"high\"", "true", "[1]"] {
            assert!(j(bad).unwrap_err().contains("`priority`"), "{bad}");
        }
        assert_eq!(Lane::of_header(" HIGH "), Ok(Lane::High));
        assert_eq!(Lane::of_header("low"), Ok(Lane::Low));
        assert!(Lane::of_header("1").unwrap_err().contains(HEADER));
        assert!(Lane::High < Lane::Normal && Lane::Normal < Lane::Low);
        assert_eq!(LANES.map(Lane::index), [0, 1, 2]);
        let s = std::time::Duration::from_secs;
        assert_eq!(age_limit(Some(s(10))), s(5));
        assert_eq!(age_limit(None), AGE_LIMIT);
    }
}
