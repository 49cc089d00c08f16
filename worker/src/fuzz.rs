//! A mutation fuzzer over the request decoders (test only): `POST /` bodies (one input, named
//! inputs, documents), v2 JSON and binary bodies, gRPC `ModelInferRequest` messages and
//! `grpc-timeout` values, mutated from valid seeds (bytes flipped, inserted, cut, repeated,
//! JSON tokens spliced in, nesting deepened) and fed to every decoder. Each must answer
//! `Ok` or a refusal; a panic fails the test with the decoder's name, the seed and the input.
//! The test run takes a few thousand inputs; `scripts/fuzz-decoders` runs it for a bounded
//! time (`VRAMFORK_FUZZ_SECONDS`) from a seed of its choosing (`VRAMFORK_FUZZ_SEED`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use hyper::header::{HeaderMap, HeaderValue};
use prost::Message;
use vramfork::metadata::{Datatype, Dtype, InputSpec, TensorSpec};

use crate::grpc::{infer, pb, wire};
use crate::http::v2::request as v2;

/// A small, fast generator (xorshift64*): the fuzzer needs no better.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const TOKENS: [&[u8]; 16] = [
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b":",
    b"\"",
    b"-",
    b"1e999",
    b"-0.0e-400",
    b"NaN",
    b"null",
    b"\\u0000",
    b"\xff\xfe",
    b"18446744073709551616",
    b"[[[[[[[[[[[[[[[[",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(b.len() + 1);
        match rng.below(7) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 => b.insert(at, rng.next() as u8),
            2 if at < b.len() => {
                let end = (at + 1 + rng.below(16)).min(b.len());
                b.drain(at..end);
            }
            3 if at < b.len() => {
                let end = (at + 1 + rng.below(32)).min(b.len());
                let piece = b[at..end].to_vec();
                for _ in 0..1 + rng.below(64) {
                    b.splice(at..at, piece.iter().copied());
                }
            }
            4 => b.truncate(at),
            _ => {
                let t = TOKENS[rng.below(TOKENS.len())];
                b.splice(at..at, t.iter().copied());
            }
        }
    }
    b
}

fn spec(name: &str, datatype: Datatype, shape: &[i64]) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        datatype,
        shape: Some(shape.to_vec()),
        document: None,
    }
}

/// A v2 binary body: its JSON header, then the raw bytes of one FP32 input.
fn v2_binary() -> Vec<u8> {
    let head = br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}]}"#;
    let mut b = head.to_vec();
    for x in [1.0f32, 2.0, 3.0, 4.0] {
        b.extend_from_slice(&x.to_le_bytes());
    }
    b
}

fn grpc_request() -> Vec<u8> {
    let mut r = pb::ModelInferRequest {
        model_name: "m".into(),
        id: "fuzz".into(),
        ..Default::default()
    };
    r.inputs.push(pb::model_infer_request::InferInputTensor {
        name: "input__0".into(),
        datatype: "FP32".into(),
        shape: vec![1, 4],
        ..Default::default()
    });
    r.raw_input_contents.push(
        [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
    );
    r.encode_to_vec()
}

/// Every decoder on `input`; the name of the one that panicked.
fn decode_all(input: &[u8], header_len: usize) -> Result<(), &'static str> {
    let f32_any = InputSpec {
        shape: Some(vec![-1, 4]),
        dtype: Dtype::Float32,
    };
    let i64_spec = InputSpec {
        shape: None,
        dtype: Dtype::Int64,
    };
    let named = [
        spec("a", Datatype::Tensor(Dtype::Float32), &[-1, 2]),
        spec("b", Datatype::Tensor(Dtype::Int64), &[-1]),
    ];
    let text = [spec("text", Datatype::Bytes, &[-1])];
    let v2_specs = [spec("input__0", Datatype::Tensor(Dtype::Float32), &[-1, 4])];
    let run =
        |name: &'static str, f: &dyn Fn()| catch_unwind(AssertUnwindSafe(f)).map_err(|_| name);
    run("decode::parse_body", &|| {
        let _ = crate::decode::numeric::parse_body(input, None);
        let _ = crate::decode::numeric::parse_body(input, Some(&f32_any));
        let _ = crate::decode::numeric::parse_body(input, Some(&i64_spec));
    })?;
    run("decode::parse_request", &|| {
        let _ = crate::decode::post::parse_request(input, Some(&named));
        let _ = crate::decode::post::parse_request(input, Some(&text));
    })?;
    run("v2::request::parse", &|| {
        let _ = v2::parse(input, None, Some(&v2_specs));
        let _ = v2::parse(
            input,
            Some(header_len.min(input.len() + 8)),
            Some(&v2_specs),
        );
        let _ = v2::parse(input, None, None);
    })?;
    run("grpc ModelInferRequest", &|| {
        if let Ok(r) = pb::ModelInferRequest::decode(input) {
            let _ = infer::parse(r.clone(), Some(&v2_specs), None);
            let _ = infer::parse(r, None, None);
        }
    })?;
    run("grpc::wire::timeout", &|| {
        if let Ok(v) = HeaderValue::from_bytes(&input[..input.len().min(12)]) {
            let mut h = HeaderMap::new();
            h.insert("grpc-timeout", v);
            let _ = wire::timeout(&h);
        }
    })?;
    Ok(())
}

/// Runs the fuzzer from `seed` until `enough` says so; the inputs tried.
fn fuzz(seed: u64, enough: impl Fn(u64) -> bool) -> u64 {
    let seeds: Vec<Vec<u8>> = vec![
        br#"{"inputs": [[1.0, 2.0, 3.0, 4.0], [5, 6, 7, 8e-3]]}"#.to_vec(),
        br#"{"inputs": {"a": [[1.5, 2.5]], "b": [3]}}"#.to_vec(),
        br#"{"inputs": ["a document", "another \u00e9"]}"#.to_vec(),
        br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}],"outputs":[{"name":"output__0"}]}"#.to_vec(),
        v2_binary(),
        grpc_request(),
        b"250m".to_vec(),
    ];
    let header_len = v2_binary().len() - 16;
    let mut rng = Rng(seed.max(1));
    let mut n = 0;
    // Panics are caught and reported below; keep their messages off the output.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    while !enough(n) {
        let pick = rng.below(seeds.len());
        let input = mutate(&mut rng, &seeds[pick]);
        if let Err(decoder) = decode_all(&input, header_len) {
            std::panic::set_hook(hook);
            panic!(
                "{decoder} panicked (seed {seed}, input {n}): {:?}",
                String::from_utf8_lossy(&input)
            );
        }
        n += 1;
    }
    std::panic::set_hook(hook);
    n
}

#[test]
fn the_request_decoders_refuse_mutated_inputs_without_panicking() {
    let seed = std::env::var("VRAMFORK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(53);
    let n = match std::env::var("VRAMFORK_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        Some(s) => {
            let until = Instant::now() + Duration::from_secs(s);
            fuzz(seed, |_| Instant::now() >= until)
        }
        None => fuzz(seed, |n| n >= 3_000),
    };
    eprintln!("fuzzed the request decoders with {n} inputs from seed {seed}");
}
