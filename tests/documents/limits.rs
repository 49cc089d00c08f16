//! What one request of documents may cost: too many documents or tensor bytes are a 413.

use super::*;

#[test]
fn too_many_documents_or_tensor_bytes_are_a_413_and_the_worker_keeps_serving() {
    let art = artefacts();
    let want = expected(&art);
    // Default max_documents (64): 100,000 empty strings are refused before tokenizing.
    let app = bert_text(
        &art,
        json!({"file": "tokenizer.json", "max_length": want["max_length"]}),
    );
    let (s, pid) = app.serve(&[]);
    let empties = vec![""; 100_000];
    let e = refusal(&post_json(&s, &json!({"inputs": empties})), 413, pid);
    assert!(
        e.contains("input text: 100000 documents in one request")
            && e.contains("at most 64 (`max_documents`)"),
        "{e}"
    );
    // Two million one-letter documents (a 9.5 MB body) cost about the body: the parser
    // keeps no more than max_documents and counts the rest (keeping them all raised the
    // peak by about 12 times the body: 582 MB for 48 MB, release build).
    let many = serde_json::to_vec(&json!({"inputs": vec!["a"; 2_000_000]})).unwrap();
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before = peak_rss(pid);
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: application/json\r\n",
        &many,
    );
    let e = refusal(&r, 413, pid);
    assert!(
        e.contains("input text: 2000000 documents in one request"),
        "{e}"
    );
    let grew = peak_rss(pid).saturating_sub(before);
    assert!(
        grew <= 3 * many.len() as u64,
        "the peak grew by {} MB for a {} MB body",
        grew >> 20,
        many.len() >> 20
    );
    let r = post_json(&s, &json!({"inputs": vec!["GPU"; 64]}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    drop(s);
    // Documents that could become more than 1 GiB of tensors: 2,100 of up to 65,536 tokens
    // (512 KiB of int64 each), within a max_documents of 4096.
    let app = DocApp::new(
        &art,
        text_metadata(
            "ident.pt",
            json!({"file": "tokenizer.json", "max_length": 65536, "feeds": ["input_ids"],
                   "max_documents": 4096}),
            0,
        ),
    );
    let (s, pid) = app.serve(&[]);
    let e = refusal(
        &post_json(&s, &json!({"inputs": vec!["GPU"; 2100]})),
        413,
        pid,
    );
    assert!(
        e.contains("input text: 2100 documents of up to 524288 bytes of tensors each")
            && e.contains("1073741824 bytes of tensors"),
        "{e}"
    );
    let r = post_json(&s, &json!({"inputs": ["GPU"]}));
    assert_eq!(outputs(&r), json!([want["ids"][2]]));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    drop(s);
    // Images, through v2 binary data: three for a max_documents of 2.
    let app = DocApp::new(
        &art,
        image_metadata("ident.pt", json!({"size": [8, 8], "max_documents": 2}), 0),
    );
    let (s, pid) = app.serve(&[]);
    let png = std::fs::read(art.join("gray.png")).unwrap();
    let data = bytes_elements(&[&png, &png, &png]);
    let header = format!(
        r#"{{"inputs":[{{"name":"image","datatype":"BYTES","shape":[3],"parameters":{{"binary_data_size":{}}}}}]}}"#,
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
    let e = refusal(&r, 413, pid);
    assert!(
        e.contains("input image: 3 documents in one request")
            && e.contains("at most 2 (`max_documents`)"),
        "{e}"
    );
    let r = raw(s.port, "POST", "/", "Content-Type: image/png\r\n", &png);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
}
