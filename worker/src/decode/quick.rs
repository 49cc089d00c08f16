//! Float tensors read from JSON without serde, eight digits at a time: the common `POST /`
//! body, `{"inputs": <regular nested array of numbers>}` (for `numeric.rs`), and a named or
//! v2 input's array of numbers (for `elements.rs`). Anything else, and anything this reader
//! is unsure of (other fields, escapes, empty arrays, more than 19 significant digits, a
//! large exponent, a number out of the dtype's range, any error), it leaves to the full
//! parser, which then reads the text from the start: so what a request gets (its tensor, or
//! its error message) never depends on which reader read it.
//!
//! Each number becomes the very `f64` serde_json 1.0 makes of it (without its
//! `float_roundtrip` feature, as this crate builds it): the decimal digits as an integer
//! `significand` (exact: at most 19 significant digits), then one multiplication or division
//! by the power of ten (`Deserializer::f64_from_parts`), the sign applied last. Why: at 63 kB of
//! JSON for a 3×32×32 image the numbers are most of a request's parse, and serde's digit
//! loop is one dependent multiply-add per digit; this one reads eight digits with a few
//! independent operations (the SWAR step of Rust's own float parser,
//! `core::num::dec2flt::parse`, itself from fast_float).

use std::sync::OnceLock;

use vramfork::metadata::Dtype;

use super::sink::Sink;

/// Arrays nested deeper than this are left to the full parser (serde_json's own limit is
/// 128; a tensor has at most a handful of dimensions).
const MAX_DEPTH: usize = 32;

/// The shape of `body`'s `inputs`, its numbers (all of which `fits` must take) written to
/// `sink` (as float32, or float64 for that dtype), or `None`, leaving the body to the full
/// parser (`sink` may then hold some elements: clear it).
pub(super) fn read_body(
    body: &[u8],
    dtype: Dtype,
    fits: impl Fn(f64) -> bool,
    sink: &mut Sink,
) -> Option<Vec<i64>> {
    let mut i = ws(body, 0);
    for part in [&b"{"[..], b"\"inputs\"", b":"] {
        i = ws(body, token(body, i, part)?);
    }
    let (shape, _, end) = array(body, i, dtype, true, fits, sink)?;
    let i = ws(body, token(body, ws(body, end), b"}")?);
    (i == body.len()).then_some(shape)
}

/// One named input's JSON text (`elements.rs`): a nested array of numbers, regular when
/// `regular` (its shape is returned), otherwise nested in any way (v2 `data`, the shape
/// given by the request); the numbers `fits` takes written to `sink`, and their count. `None`
/// leaves the text to the full parser (clear `sink`).
pub(super) fn read_input(
    text: &[u8],
    dtype: Dtype,
    regular: bool,
    fits: impl Fn(f64) -> bool,
    sink: &mut Sink,
) -> Option<(Vec<i64>, usize)> {
    let (shape, n, end) = array(text, ws(text, 0), dtype, regular, fits, sink)?;
    (ws(text, end) == text.len()).then_some((shape, n))
}

/// The array at `b[i]`: its shape (when `regular`; otherwise empty), its element count, and
/// the index after it.
fn array(
    b: &[u8],
    mut i: usize,
    dtype: Dtype,
    regular: bool,
    fits: impl Fn(f64) -> bool,
    sink: &mut Sink,
) -> Option<(Vec<i64>, usize, usize)> {
    let wide = match dtype {
        Dtype::Float64 => true,
        Dtype::Float32 | Dtype::Float16 | Dtype::BFloat16 => false,
        _ => return None,
    };
    if b.get(i) != Some(&b'[') {
        return None;
    }
    // The length of the arrays at each depth (once one there has ended), the element count
    // of each array now open, the depth of the numbers, and how many were read.
    let mut dims: Vec<Option<usize>> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let mut leaf: Option<usize> = None;
    let mut count = 0usize;
    loop {
        // A value starts at `i`.
        let depth = open.len();
        if b[i] == b'[' {
            if (regular && leaf.is_some_and(|l| l <= depth)) || depth >= MAX_DEPTH {
                return None;
            }
            if dims.len() == depth {
                dims.push(None);
            }
            open.push(0);
            i = ws(b, i + 1);
            if matches!(b.get(i), Some(b']') | None) {
                return None;
            }
            continue;
        }
        if regular && *leaf.get_or_insert(depth) != depth {
            return None;
        }
        let f = number(b, &mut i)?;
        if !fits(f) || sink.is_full() {
            return None;
        }
        if wide {
            sink.push(f);
        } else {
            sink.push(f as f32);
        }
        count += 1;
        // After a value: a comma and the next value, or closing brackets.
        loop {
            i = ws(b, i);
            match b.get(i)? {
                b',' => {
                    *open.last_mut()? += 1;
                    i = ws(b, i + 1);
                    if i >= b.len() {
                        return None;
                    }
                    break;
                }
                b']' => {
                    let n = open.pop()? + 1;
                    if regular {
                        match dims[open.len()] {
                            Some(want) if want != n => return None,
                            Some(_) => {}
                            None => dims[open.len()] = Some(n),
                        }
                    }
                    i += 1;
                    if open.is_empty() {
                        let shape = if regular {
                            dims.iter()
                                .map(|d| d.map(|n| n as i64))
                                .collect::<Option<_>>()?
                        } else {
                            Vec::new()
                        };
                        return Some((shape, count, i));
                    }
                }
                _ => return None,
            }
        }
    }
}

/// The first index from `i` that is not JSON whitespace.
fn ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The index after `t`, when the body has it at `i`.
fn token(b: &[u8], i: usize, t: &[u8]) -> Option<usize> {
    (b.get(i..i + t.len())? == t).then_some(i + t.len())
}

/// A JSON number at `*i` (moved past it), as serde_json makes it; `None` for anything this
/// reader leaves to the full parser, invalid numbers included.
fn number(b: &[u8], i: &mut usize) -> Option<f64> {
    let positive = b.get(*i) != Some(&b'-');
    if !positive {
        *i += 1;
    }
    let mut significand = 0u64;
    // Digits from the first that is not a zero.
    let mut significant = match b.get(*i)? {
        b'0' => {
            *i += 1;
            // JSON allows one leading zero only.
            if b.get(*i).is_some_and(u8::is_ascii_digit) {
                return None;
            }
            0
        }
        b'1'..=b'9' => digits(b, i, &mut significand),
        _ => return None,
    };
    let mut exponent = 0i32;
    if b.get(*i) == Some(&b'.') {
        *i += 1;
        let zeros = if significant == 0 {
            b[*i..].iter().take_while(|c| **c == b'0').count()
        } else {
            0
        };
        let n = digits(b, i, &mut significand);
        if n == 0 {
            return None;
        }
        significant += n - zeros;
        exponent = -i32::try_from(n).ok()?;
    }
    // At most 19 significant digits: the significand is exact, as serde's is until it
    // would overflow u64 (which takes a 20th).
    if significant > 19 {
        return None;
    }
    if matches!(b.get(*i), Some(b'e' | b'E')) {
        *i += 1;
        let negative = match b.get(*i) {
            Some(b'-') => {
                *i += 1;
                true
            }
            Some(b'+') => {
                *i += 1;
                false
            }
            _ => false,
        };
        let mut e = 0u64;
        let n = digits(b, i, &mut e);
        if n == 0 || n > 4 {
            return None;
        }
        exponent += if negative { -(e as i32) } else { e as i32 };
    }
    let pow = *pow10().get(exponent.unsigned_abs() as usize)?;
    let f = significand as f64;
    let f = if exponent >= 0 { f * pow } else { f / pow };
    if f.is_infinite() {
        return None;
    }
    Some(if positive { f } else { -f })
}

/// Reads the digits at `*i` into `value` (wrapping: callers refuse more than 19 digits),
/// eight at a time while eight are there; returns how many there were.
fn digits(b: &[u8], i: &mut usize, value: &mut u64) -> usize {
    let start = *i;
    while let Some(chunk) = b.get(*i..*i + 8) {
        let v = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        if !eight_digits(v) {
            break;
        }
        *value = value
            .wrapping_mul(100_000_000)
            .wrapping_add(eight_digits_value(v));
        *i += 8;
    }
    while let Some(d) = b.get(*i).map(|c| c.wrapping_sub(b'0')).filter(|d| *d <= 9) {
        *value = value.wrapping_mul(10).wrapping_add(u64::from(d));
        *i += 1;
    }
    *i - start
}

/// Whether the eight bytes of `v` (little-endian) are all ASCII digits.
fn eight_digits(v: u64) -> bool {
    let a = v.wrapping_add(0x4646_4646_4646_4646);
    let b = v.wrapping_sub(0x3030_3030_3030_3030);
    (a | b) & 0x8080_8080_8080_8080 == 0
}

/// The value of eight ASCII digits read little-endian (the first digit most significant).
fn eight_digits_value(mut v: u64) -> u64 {
    const MASK: u64 = 0x0000_00FF_0000_00FF;
    const MUL1: u64 = 0x000F_4240_0000_0064;
    const MUL2: u64 = 0x0000_2710_0000_0001;
    v -= 0x3030_3030_3030_3030;
    v = (v * 10) + (v >> 8);
    let v1 = (v & MASK).wrapping_mul(MUL1);
    let v2 = ((v >> 16) & MASK).wrapping_mul(MUL2);
    u64::from((v1.wrapping_add(v2) >> 32) as u32)
}

/// 1e0 … 1e308, each the nearest `f64` (as serde_json's table of literals).
fn pow10() -> &'static [f64; 309] {
    static POW10: OnceLock<[f64; 309]> = OnceLock::new();
    POW10.get_or_init(|| std::array::from_fn(|e| format!("1e{e}").parse().expect("a power of ten")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What serde_json makes of `s` (as `numeric.rs` receives it: u64, i64 or f64), as f64.
    fn serde(s: &str) -> Option<f64> {
        let v: serde_json::Value = serde_json::from_str(s).ok()?;
        v.as_f64()
    }

    fn quick(s: &str) -> Option<f64> {
        let mut i = 0;
        let f = number(s.as_bytes(), &mut i)?;
        (i == s.len()).then_some(f)
    }

    #[test]
    fn numbers_are_serdes_bit_for_bit_or_left_to_it() {
        let cases = [
            "0",
            "-0",
            "0.0",
            "-0.0",
            "1",
            "-1",
            "7",
            "12345678",
            "123456789",
            "-1.5255959033966064",
            "0.30372199416160583",
            "1.2345678901234567e-05",
            "1e-7",
            "2.5E+3",
            "9999999999999999999",
            "0.1",
            "0.2",
            "0.3",
            "3.4028235e38",
            "1e308",
            "1e-308",
            "123456789.123456789",
            "0.000000000000000001",
            "17976931348623157e292",
            "-0.0030565576162189245",
            "0.000000000000000000001234567890123456789",
            "-0.000",
            "100000000000000000.5",
        ];
        for s in cases {
            let (q, r) = (quick(s), serde(s));
            assert_eq!(q.map(f64::to_bits), r.map(f64::to_bits), "{s}");
        }
        // Left to the full parser: invalid JSON, 20 significant digits or more, out of range, long
        // exponents. (The full parser refuses or reads them its own way.)
        for s in [
            "01",
            "-",
            "1.",
            ".5",
            "1e",
            "1e+",
            "+1",
            "--1",
            "1.2.3",
            "00.5",
            "12345678901234567890",
            "0.12345678901234567890",
            "1000000000000000000.5",
            "0.00012345678901234567890",
            "1e400",
            "1e-400",
            "4.9e-324",
            "1e00001",
            "-x",
        ] {
            assert_eq!(quick(s), None, "{s}");
        }
    }

    #[test]
    fn generated_numbers_match_serde_bit_for_bit() {
        // A fixed-seed walk over the forms requests carry: Python's float reprs of float32
        // values, short decimals, integers, exponents of both signs.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut compared = 0;
        for n in 0..20_000 {
            let r = next();
            let v = f64::from_bits(r);
            let f = f32::from_bits(next() as u32) as f64;
            let s = match n % 5 {
                0 if v.is_finite() => format!("{v:e}"),
                1 if f.is_finite() => format!("{f:?}"),
                2 => format!("{}", (r % 2_000_001) as i64 - 1_000_000),
                3 => format!("{}.{}", r % 1000, next() % 10_000_000_000_000_000),
                _ => format!("{}e{}", r % 100_000, (next() % 80) as i64 - 40),
            };
            if let Some(q) = quick(&s) {
                assert_eq!(Some(q.to_bits()), serde(&s).map(f64::to_bits), "{s}");
                compared += 1;
            }
        }
        // Left to the full parser: only exponents past 1e±308 once the digits are counted.
        assert!(compared > 19_000, "{compared} of 20000 read");
    }

    #[test]
    fn eight_digits_at_a_time() {
        let v = u64::from_le_bytes(*b"12345678");
        assert!(eight_digits(v));
        assert_eq!(eight_digits_value(v), 12_345_678);
        assert!(!eight_digits(u64::from_le_bytes(*b"1234567.")));
        assert!(!eight_digits(u64::from_le_bytes(*b"/2345678")));
        assert!(!eight_digits(u64::from_le_bytes(*b"1234567:")));
    }
}
