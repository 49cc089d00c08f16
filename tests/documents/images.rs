//! Images: decoded and transformed in the worker as torchvision does; bad, costly and
//! extreme images, and what one image costs a worker.

use super::*;

#[test]
fn images_get_the_answers_torchvision_gives() {
    let art = artefacts();
    let want = expected(&art);
    let files: Vec<&str> = want["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    // The pre-processed tensor itself (a model returning its input): Resize(40) then
    // CenterCrop(32) then Normalize; and a stretch to 24×36 without normalisation.
    let crop = DocApp::new(
        &art,
        image_metadata(
            "ident.pt",
            json!({"size": [32, 32], "resize": "center_crop", "shorter_side": 40,
                   "mean": want["mean"], "std": want["std"]}),
            0,
        ),
    );
    let stretch = DocApp::new(
        &art,
        image_metadata("ident.pt", json!({"size": [24, 36]}), 0),
    );
    let (c, st) = (crop.start(&[]), stretch.start(&[]));
    c.wait_workers(1);
    st.wait_workers(1);
    for f in &files {
        let bytes = std::fs::read(art.join(f)).unwrap();
        let ct = if f.ends_with(".jpg") {
            "image/jpeg"
        } else {
            "image/png"
        };
        let r = raw(
            c.port,
            "POST",
            "/",
            &format!("Content-Type: {ct}\r\n"),
            &bytes,
        );
        assert_close(&outputs(&r)[0], &want["small_crop"][f], PIXEL_TOL, f);
        let r = raw(
            st.port,
            "POST",
            "/",
            &format!("Content-Type: {ct}\r\n"),
            &bytes,
        );
        assert_close(&outputs(&r)[0], &want["stretch"][f], PIXEL_TOL / 4.0, f);
    }
    drop((c, st));
    // ResNet-18 on the ImageNet pipeline: a JPEG body, and every file at once through v2
    // binary data (one request, four images) and as base64 in JSON.
    let app = DocApp::new(&art, image_metadata("resnet.pt", imagenet(), 4));
    let (s, _) = app.serve(&[]);
    let logits_tol = 0.02;
    let cat = std::fs::read(art.join("cat.jpg")).unwrap();
    let r = raw(s.port, "POST", "/", "Content-Type: image/jpeg\r\n", &cat);
    assert_close(
        &outputs(&r),
        &json!([want["resnet"]["cat.jpg"]]),
        logits_tol,
        "cat.jpg",
    );
    let blobs: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(art.join(f)).unwrap())
        .collect();
    let data = bytes_elements(&blobs.iter().map(Vec::as_slice).collect::<Vec<_>>());
    let header = format!(
        r#"{{"inputs":[{{"name":"image","datatype":"BYTES","shape":[{}],"parameters":{{"binary_data_size":{}}}}}]}}"#,
        files.len(),
        data.len()
    );
    let (extra, body) = binary(&header, &data);
    let r = raw(
        s.port,
        "POST",
        "/v2/models/image%20app/infer",
        &extra,
        &body,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let all: Vec<Value> = files.iter().map(|f| want["resnet"][f].clone()).collect();
    assert_close(
        &r.json()["outputs"][0]["data"],
        &json!(all),
        logits_tol,
        "v2 binary",
    );
    use base64::Engine;
    let b64: Vec<String> = blobs
        .iter()
        .map(|b| base64::engine::general_purpose::STANDARD.encode(b))
        .collect();
    let r = post_json(&s, &json!({"inputs": b64}));
    assert_close(&outputs(&r), &json!(all), logits_tol, "base64 JSON");
    // NVIDIA's own client, the files as binary BYTES elements.
    let url = format!("127.0.0.1:{}", s.port);
    let paths: Vec<String> = files
        .iter()
        .map(|f| art.join(f).display().to_string())
        .collect();
    let mut args = vec![url.as_str(), "image app", "image", "--files"];
    args.extend(paths.iter().map(String::as_str));
    let got = python_json("triton_documents.py", &args, b"");
    assert_close(&got["output"], &json!(all), logits_tol, "tritonclient");
}

#[test]
fn bad_images_are_a_400_and_the_worker_is_unchanged() {
    let art = artefacts();
    let app = DocApp::new(
        &art,
        image_metadata(
            "ident.pt",
            json!({"size": [8, 8], "max_pixels": 1000000}),
            0,
        ),
    );
    let (s, pid) = app.serve(&["--max-body-mb", "4"]);
    let jpeg = std::fs::read(art.join("cat.jpg")).unwrap();
    let wide = std::fs::read(art.join("wide.png")).unwrap();
    // A PNG header claiming 30,000 × 30,000 pixels (and nothing else): refused from the
    // header, never decoded.
    let mut bomb = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    bomb.extend(30_000u32.to_be_bytes());
    bomb.extend(30_000u32.to_be_bytes());
    bomb.extend([8, 2, 0, 0, 0]);
    bomb.extend(crc32(&bomb[12..]).to_be_bytes());
    // The start of its image data (a decoder reads the header up to it).
    let idat_at = bomb.len() + 4;
    bomb.extend(2u32.to_be_bytes());
    bomb.extend(b"IDAT\x78\x9c");
    bomb.extend(crc32(&bomb[idat_at..]).to_be_bytes());
    let gif = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;".to_vec();
    for (body, want) in [
        (
            bomb,
            "30000×30000 (900000000 pixels); this input takes at most 1000000",
        ),
        (jpeg[..jpeg.len() / 3].to_vec(), "the JPEG is cut short"),
        (wide[..wide.len() / 2].to_vec(), "cannot decode the image"),
        (b"plain words".to_vec(), "not a JPEG or PNG image"),
        (gif, "GIF images are not supported"),
        (jpeg.clone(), "is 500×375 (187500 pixels)"),
    ] {
        let r = raw(s.port, "POST", "/", "Content-Type: image/jpeg\r\n", &body);
        let e = String::from_utf8_lossy(&r.body).to_string();
        if want.starts_with("is 500") {
            // Within the limit: decoded and answered.
            assert_eq!(r.status, 200, "{e}");
            continue;
        }
        assert_eq!(r.status, 400, "{e}");
        assert!(
            e.contains("input image: element 0: ") && e.contains(want),
            "{e}"
        );
        assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    }
    // Base64 that is not.
    let r = post_json(&s, &json!({"inputs": ["%%%"]}));
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("element 0 is not base64"));
    // MIME base64, wrapped at 76 columns (`base64` without -w0): the line ends are not data.
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&jpeg);
    let wrapped: Vec<String> = b64
        .as_bytes()
        .chunks(76)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    let r = post_json(&s, &json!({ "inputs": [wrapped.join("\n")] }));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // The body's Content-Type (`http/body_kind.rs`): an image sent as octet-stream or with
    // curl -d's form type is still the image; a GIF, a multipart upload, or bytes that are
    // not JSON are refused naming what the body was sent as and what this model takes.
    for ct in [
        "application/octet-stream",
        "application/x-www-form-urlencoded",
    ] {
        let r = raw(
            s.port,
            "POST",
            "/",
            &format!("Content-Type: {ct}\r\n"),
            &jpeg,
        );
        assert_eq!(r.status, 200, "{ct}: {}", String::from_utf8_lossy(&r.body));
    }
    for (ct, body, want) in [
        (
            "image/gif",
            b"GIF89a".to_vec(),
            "GIF images are not supported (JPEG and PNG are)",
        ),
        (
            "multipart/form-data; boundary=x",
            b"--x".to_vec(),
            "send the document itself as the body",
        ),
        (
            "application/octet-stream",
            b"plain words".to_vec(),
            "sent as application/octet-stream",
        ),
    ] {
        let r = raw(
            s.port,
            "POST",
            "/",
            &format!("Content-Type: {ct}\r\n"),
            &body,
        );
        let e = String::from_utf8_lossy(&r.body).to_string();
        assert_eq!(r.status, 400, "{ct}: {e}");
        assert!(
            e.contains(want) && e.contains("image/jpeg or image/png"),
            "{ct}: {e}"
        );
    }
    // The worker is the one that started, and answers.
    let r = raw(s.port, "POST", "/", "Content-Type: image/jpeg\r\n", &jpeg);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// 64 solid-colour 40-megapixel PNGs (127 kB each) in one request (it held a
/// worker for 14–16 s, and a request queued behind it for as long). By default refused
/// from the headers for `max_request_pixels` (413), before anything is decoded; with the
/// bound raised, stopped between images at `--request-timeout` (504) and at the client's
/// deadline (503), the same worker serving the next request.
#[test]
fn costly_image_requests_are_bounded_and_stopped_at_their_deadlines() {
    use base64::Engine;
    let art = artefacts();
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.png");
    python_json(
        "solid_png.py",
        &[big.to_str().unwrap(), "8000", "5000"],
        b"",
    );
    let b64 = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&big).unwrap());
    let body = json!({ "inputs": vec![b64; 64] });
    let gray = std::fs::read(art.join("gray.png")).unwrap();

    let app = DocApp::new(&art, image_metadata("ident.pt", json!({"size": [8, 8]}), 0));
    let (s, pid) = app.serve(&[]);
    let e = refusal(&post_json(&s, &body), 413, pid);
    assert!(
        e.contains("input image: its 64 images have 2560000000 pixels together")
            && e.contains("at most 256000000 (`max_request_pixels`)"),
        "{e}"
    );
    drop(s);

    let app = DocApp::new(
        &art,
        image_metadata(
            "ident.pt",
            json!({"size": [8, 8], "max_request_pixels": 4_000_000_000u64}),
            0,
        ),
    );
    let (s, pid) = app.serve(&["--request-timeout", "1"]);
    let e = refusal(&post_json(&s, &body), 504, pid);
    assert!(
        e.contains(
            "pre-processing the request's documents ran past the request timeout of 1000 ms"
        ),
        "{e}"
    );
    // The worker serves on: its one pre-processing slot is free again once the image being
    // decoded at the deadline is done (the other 63 never are).
    let r = raw(s.port, "POST", "/", "Content-Type: image/png\r\n", &gray);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: application/json\r\nX-Request-Timeout: 0.5\r\n",
        &serde_json::to_vec(&body).unwrap(),
    );
    let e = refusal(&r, 503, pid);
    assert!(e.contains("X-Request-Timeout 500 ms"), "{e}");
    let r = raw(s.port, "POST", "/", "Content-Type: image/png\r\n", &gray);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    let exits = s.events_named("worker_exited");
    assert!(exits.is_empty(), "no worker went: {}", s.log_text());
}

#[test]
fn extreme_strips_are_refused_and_motion_photos_decoded() {
    let art = artefacts();
    let app = DocApp::new(
        &art,
        image_metadata(
            "ident.pt",
            json!({"size": [224, 224], "resize": "center_crop", "shorter_side": 256,
                   "dtype": "uint8"}),
            0,
        ),
    );
    let (s, pid) = app.serve(&[]);
    // A PNG header claiming 1,000,000 × 40 (40 megapixels: within max_pixels), which
    // resized to a shorter side of 256 would be 6,400,000 × 256 (20 GB as floats).
    let mut strip = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    strip.extend(1_000_000u32.to_be_bytes());
    strip.extend(40u32.to_be_bytes());
    strip.extend([8, 2, 0, 0, 0]);
    strip.extend(crc32(&strip[12..]).to_be_bytes());
    let idat_at = strip.len() + 4;
    strip.extend(2u32.to_be_bytes());
    strip.extend(b"IDAT\x78\x9c");
    strip.extend(crc32(&strip[idat_at..]).to_be_bytes());
    let r = raw(s.port, "POST", "/", "Content-Type: image/png\r\n", &strip);
    let e = refusal(&r, 400, pid);
    assert!(
        e.contains("input image: element 0: the image is 1000000×40")
            && e.contains("6400000×256 (1638400000 pixels) before its centre is cut"),
        "{e}"
    );
    // A motion photo: Pillow's JPEG, then a video whose bytes hold FF DA (a scan's start)
    // and no end-of-image marker after it. The image is what Pillow sees.
    let jpeg = std::fs::read(art.join("cat.jpg")).unwrap();
    let mut motion = jpeg.clone();
    motion.extend(b"\0\0\0\x18ftypmp42\0\0\0\0isommp42\xff\xda\x00\x0c\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00");
    motion.extend((0..4096u32).map(|i| (i * 7919 % 251) as u8));
    let cat = outputs(&raw(
        s.port,
        "POST",
        "/",
        "Content-Type: image/jpeg\r\n",
        &jpeg,
    ));
    let r = raw(s.port, "POST", "/", "Content-Type: image/jpeg\r\n", &motion);
    assert_eq!(outputs(&r), cat);
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
}

/// What one image at the default `max_pixels` (40 MP) costs a worker at its peak, above
/// its resting memory (the README's figures). Ignored by default: it holds hundreds of MB
/// and decodes for a minute in a debug build. Run it with
/// `cargo nextest run --test documents --run-ignored only --no-capture image_memory_peak`.
#[test]
#[ignore]
fn image_memory_peak() {
    let art = artefacts();
    let big = art.join("big");
    if !big.join("big_rgba.png").is_file() {
        let made = python_json("make_documents.py", &["--big", big.to_str().unwrap()], b"");
        assert_eq!(made["ok"], true, "{made}");
    }
    let app = DocApp::new(&art, image_metadata("ident.pt", imagenet(), 0));
    for (f, ct) in [
        ("big.jpg", "image/jpeg"),
        ("big_progressive.jpg", "image/jpeg"),
        ("big_rgba.png", "image/png"),
    ] {
        let bytes = std::fs::read(big.join(f)).unwrap();
        // A fresh worker each time: the peak only grows.
        let (s, pid) = app.serve(&["--max-body-mb", "128"]);
        let before = peak_rss(pid);
        let r = raw(
            s.port,
            "POST",
            "/",
            &format!("Content-Type: {ct}\r\n"),
            &bytes,
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let grew = peak_rss(pid).saturating_sub(before);
        println!(
            "{f} ({} MB body): the worker's peak grew by {} MB",
            bytes.len() >> 20,
            grew >> 20
        );
        // 3 bytes a pixel decoded, 3 in the tensor, the decoder's own and the body.
        assert!(
            grew < (40_000_000 * 10) + bytes.len() as u64 * 2,
            "{f}: {grew}"
        );
    }
}
