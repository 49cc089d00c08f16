//! `forward-loop`: the model's own forward-pass throughput, the ceiling that `scripts/bench`
//! compares served throughput with. Same settings as a worker: torch intra-op threads as
//! given (one inter-op thread), TorchScript's simple executor (profiling mode off), eval
//! mode, `no_grad`, each input tensor built from a flat buffer per pass (as a request would).
//!
//! Usage: `forward-loop MODEL SHAPE THREADS SECONDS [DATA]`; SHAPE is one input's dimensions
//! (`1,4`: float32), optionally with a dtype (`1,128:i64`), and several inputs are separated
//! by `;` (`1,128:i64;1,128:i64` for a BERT encoder's `input_ids` and `attention_mask`).
//! DATA, when given, is a file of the inputs' values — raw little-endian, each input's
//! elements in turn, as a v2 binary request carries them — so the loop runs on the very
//! values a benchmark's requests send (a model's speed can depend on them: ResNet-50 with
//! random weights ran its passes about 4 % slower on a random-normal image than on the
//! synthetic values used without DATA). Without DATA: small floats, or token ids below 1000
//! and a mask of ones.
//! Prints one JSON line: passes, seconds, passes per second and per-pass latency
//! percentiles (ms).

use std::time::{Duration, Instant};

fn main() {
    if let Err(e) = run() {
        eprintln!("forward-loop: {e}");
        std::process::exit(2);
    }
}

/// Per input: (dims, f32 values, i64 values), one of the two filled per the input's dtype.
type Data = Vec<(Vec<i64>, Vec<f32>, Vec<i64>)>;

/// The inputs' values from DATA: raw little-endian, each input's elements in turn.
fn read_data(path: &str, inputs: &[(Vec<i64>, bool)]) -> Result<Data, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let want: usize = inputs
        .iter()
        .map(|(dims, int)| dims.iter().product::<i64>() as usize * if *int { 8 } else { 4 })
        .sum();
    if bytes.len() != want {
        return Err(format!(
            "{path}: {} bytes, but SHAPE needs {want}",
            bytes.len()
        ));
    }
    let mut at = 0;
    Ok(inputs
        .iter()
        .map(|(dims, int)| {
            let n = dims.iter().product::<i64>() as usize;
            let (mut f, mut l) = (Vec::new(), Vec::new());
            if *int {
                l = bytes[at..at + 8 * n]
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect();
                at += 8 * n;
            } else {
                f = bytes[at..at + 4 * n]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect();
                at += 4 * n;
            }
            (dims.clone(), f, l)
        })
        .collect())
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model, shape, threads, seconds, data_file) = match args.as_slice() {
        [m, sh, t, s] => (m, sh, t, s, None),
        [m, sh, t, s, d] => (m, sh, t, s, Some(d)),
        _ => return Err("usage: forward-loop MODEL SHAPE THREADS SECONDS [DATA]".into()),
    };
    let inputs: Vec<(Vec<i64>, bool)> = shape
        .split(';')
        .map(|one| {
            let (dims, dtype) = one.split_once(':').unwrap_or((one, "f32"));
            let int = match dtype {
                "f32" => false,
                "i64" => true,
                other => return Err(format!("dtype {other}: f32 or i64")),
            };
            let dims = dims
                .split(',')
                .map(|s| {
                    s.trim()
                        .parse::<i64>()
                        .map_err(|e| format!("shape {s}: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((dims, int))
        })
        .collect::<Result<_, String>>()?;
    let threads: i32 = threads.parse().map_err(|e| format!("threads: {e}"))?;
    let seconds: f64 = seconds.parse().map_err(|e| format!("seconds: {e}"))?;
    if !(0.0..=600.0).contains(&seconds) {
        return Err("seconds must be within 0..600".into());
    }

    tch::set_num_threads(threads.max(1));
    tch::set_num_interop_threads(1);
    tch::jit::set_profiling_mode(false);
    let mut module = tch::CModule::load(model).map_err(|e| format!("load {model}: {e}"))?;
    module.f_set_eval().map_err(|e| e.to_string())?;

    let data = match data_file {
        Some(f) => read_data(f, &inputs)?,
        // Values as a request would carry them: small floats, or token ids below 1000 (any
        // vocabulary has those) and a mask of ones for the second integer input.
        None => inputs
            .iter()
            .enumerate()
            .map(|(k, (dims, _))| {
                let n: i64 = dims.iter().product();
                let f = (0..n).map(|i| (i % 7) as f32 * 0.25).collect();
                let l = (0..n)
                    .map(|i| if k == 0 { (i * 37) % 1000 } else { 1 })
                    .collect();
                (dims.clone(), f, l)
            })
            .collect(),
    };
    let pass = |module: &tch::CModule| -> Result<(), String> {
        let args: Vec<tch::IValue> = data
            .iter()
            .zip(&inputs)
            .map(|((dims, f, l), (_, int))| {
                let t = if *int {
                    tch::Tensor::from_slice(l)
                } else {
                    tch::Tensor::from_slice(f)
                };
                tch::IValue::Tensor(t.reshape(dims.as_slice()))
            })
            .collect();
        let out = tch::no_grad(|| module.forward_is(&args)).map_err(|e| e.to_string())?;
        drop(out);
        Ok(())
    };
    // Warm-up: the first passes are slower (allocator, executor).
    for _ in 0..20 {
        pass(&module)?;
    }
    let budget = Duration::from_secs_f64(seconds);
    let mut lat = Vec::with_capacity(1 << 16);
    let start = Instant::now();
    // Bounded in time and in count.
    while start.elapsed() < budget && lat.len() < 10_000_000 {
        let t = Instant::now();
        pass(&module)?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize];
    println!(
        "{}",
        serde_json::json!({
            "passes": lat.len(), "seconds": secs, "per_s": lat.len() as f64 / secs,
            "p50_ms": pct(0.5), "p99_ms": pct(0.99), "threads": threads,
        })
    );
    Ok(())
}
