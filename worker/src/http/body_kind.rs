//! What a `POST /` body is: JSON (`{"inputs": …}`), or one document as it is — an image
//! for a model whose one input is an image, a text for one whose one input is text —
//! decided from its `Content-Type` and, where that says nothing useful, its first bytes.
//! Every refusal names what the body was sent as and what this model takes (a GIF, a
//! multipart upload or an image sent as `application/octet-stream` were told "request body
//! is not valid JSON").
//!
//! | Content-Type | one image input | one text input | otherwise |
//! |---|---|---|---|
//! | `image/jpeg`, `image/jpg`, `image/pjpeg`, `image/png` | the image | 400 | 400 |
//! | any other `image/…` (GIF, WebP…) | 400: JPEG and PNG only | 400 | 400 |
//! | `text/plain` | JSON | the text (400 when it is a JSON request: `{"inputs": …}`) | JSON (browsers send JSON as `text/plain`) |
//! | `multipart/form-data` | 400: send the file as the body | 400 | 400 |
//! | none, `application/json`, `application/x-www-form-urlencoded` (`curl -d`), `application/octet-stream`, anything else | the image when the body starts like a JPEG or PNG, else JSON | JSON | JSON |
//!
//! A body read as JSON that is not JSON is a 400 that says what it was sent as and lists
//! what this model takes.

use vramfork::documents::Document;

use crate::decode::BodyError;
use crate::error::ApiError;

/// What a `POST /` body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    Json,
    Image,
    Text,
}

/// The body's kind, from its `Content-Type` (`None`: none sent), the model's one document
/// input (`None`: it has not exactly one input, or that input takes no documents) and the
/// body itself.
pub fn classify(
    content_type: Option<&str>,
    one: Option<&Document>,
    body: &[u8],
) -> Result<BodyKind, ApiError> {
    let essence = content_type.map(essence);
    let image_model = matches!(one, Some(Document::Image(_)));
    let text_model = matches!(one, Some(Document::Text(_)));
    let refuse = |why: String| Err(ApiError::BadRequest(format!("{why}; {}", takes(one))));
    match essence.as_deref() {
        Some("image/jpeg" | "image/jpg" | "image/pjpeg" | "image/png") if image_model => {
            Ok(BodyKind::Image)
        }
        Some(e @ ("image/jpeg" | "image/jpg" | "image/pjpeg" | "image/png")) => refuse(format!(
            "a {e} body is one image, for a model whose one input is an image input; this model's declared inputs are not"
        )),
        Some(e) if e.starts_with("image/") => refuse(format!(
            "{} images are not supported (JPEG and PNG are): the body was sent as {e}",
            e["image/".len()..].to_ascii_uppercase()
        )),
        Some("multipart/form-data") => refuse(
            "a multipart/form-data body (an HTML form, curl -F) is not read: send the document itself as the body (curl --data-binary @FILE -H 'Content-Type: image/jpeg'), or JSON"
                .into(),
        ),
        Some("text/plain") if text_model => {
            if looks_like_a_json_request(body) {
                return refuse(
                    "this text/plain body is a JSON request ({\"inputs\": …}), not a text to classify: send it with Content-Type: application/json (a browser's fetch() sends a string body as text/plain)"
                        .into(),
                );
            }
            Ok(BodyKind::Text)
        }
        _ if image_model && starts_like_an_image(body) => Ok(BodyKind::Image),
        _ => Ok(BodyKind::Json),
    }
}

/// A JSON body's parse error with what the body was sent as and what this model takes.
pub fn explained(e: ApiError, content_type: Option<&str>, one: Option<&Document>) -> ApiError {
    match e {
        ApiError::Body(BodyError::NotJson(m)) => {
            let sent = content_type.map_or("without a Content-Type".to_string(), |c| {
                format!("as {}", essence(c))
            });
            ApiError::Body(BodyError::NotJson(format!(
                "{m} (sent {sent}; {})",
                takes(one)
            )))
        }
        e => e,
    }
}

/// What this model's `POST /` takes, for a refusal.
fn takes(one: Option<&Document>) -> String {
    let json = "JSON {\"inputs\": …} (Content-Type: application/json)";
    match one {
        Some(Document::Image(_)) => format!(
            "this model takes {json}, or one JPEG or PNG image as the body (Content-Type: image/jpeg or image/png)"
        ),
        Some(Document::Text(_)) => format!(
            "this model takes {json}, or one text as the body (Content-Type: text/plain)"
        ),
        None => format!("this model takes {json}"),
    }
}

/// A media type's essence: lower case, without parameters.
fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// JPEG (FF D8 FF) or PNG (89 'P' 'N' 'G' CR LF 1A LF) magic.
fn starts_like_an_image(body: &[u8]) -> bool {
    body.starts_with(&[0xFF, 0xD8, 0xFF]) || body.starts_with(b"\x89PNG\r\n\x1a\n")
}

/// A JSON object with an `inputs` field: what a model request in JSON is.
fn looks_like_a_json_request(body: &[u8]) -> bool {
    body.trim_ascii_start().first() == Some(&b'{')
        && serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body)
            .is_ok_and(|o| o.contains_key("inputs"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramfork::documents::{Channels, ImageSpec, Resize};

    fn image() -> Document {
        Document::Image(ImageSpec {
            size: [8, 8],
            resize: Resize::Stretch,
            mean: [0.0; 3],
            std: [1.0; 3],
            channels: Channels::Rgb,
            dtype: vramfork::metadata::Dtype::Float32,
            max_pixels: 100,
            max_request_pixels: 100,
            max_documents: 4,
        })
    }

    #[test]
    fn each_content_type_is_what_the_table_says() {
        let jpeg = b"\xFF\xD8\xFF\xE0rest".as_slice();
        let json = br#"{"inputs": [[1]]}"#.as_slice();
        let img = image();
        let ok = |ct: Option<&str>, one: Option<&Document>, body: &[u8]| {
            classify(ct, one, body).unwrap()
        };
        let err = |ct: Option<&str>, one: Option<&Document>, body: &[u8]| {
            classify(ct, one, body).unwrap_err().to_string()
        };
        assert_eq!(ok(Some("image/jpg"), Some(&img), jpeg), BodyKind::Image);
        assert_eq!(
            ok(Some("IMAGE/PNG; q=1"), Some(&img), jpeg),
            BodyKind::Image
        );
        for ct in [
            None,
            Some("application/octet-stream"),
            Some("application/x-www-form-urlencoded"),
        ] {
            assert_eq!(ok(ct, Some(&img), jpeg), BodyKind::Image, "{ct:?}");
            assert_eq!(ok(ct, Some(&img), json), BodyKind::Json, "{ct:?}");
            assert_eq!(ok(ct, None, jpeg), BodyKind::Json, "{ct:?}");
        }
        assert_eq!(ok(Some("text/plain"), None, json), BodyKind::Json);
        let e = err(Some("image/gif"), Some(&img), b"GIF89a");
        assert!(
            e.contains("GIF images are not supported (JPEG and PNG are)"),
            "{e}"
        );
        assert!(e.contains("image/jpeg or image/png"), "{e}");
        let e = err(Some("image/png"), None, jpeg);
        assert!(e.contains("this model takes JSON"), "{e}");
        let e = err(Some("multipart/form-data; boundary=x"), Some(&img), b"--x");
        assert!(
            e.contains("multipart/form-data") && e.contains("--data-binary"),
            "{e}"
        );
    }

    #[test]
    fn a_json_parse_error_says_how_the_body_was_sent() {
        let e = explained(
            ApiError::Body(BodyError::NotJson("expected value at line 1".into())),
            Some("application/x-www-form-urlencoded"),
            Some(&image()),
        )
        .to_string();
        assert!(
            e.contains("sent as application/x-www-form-urlencoded") && e.contains("image/jpeg"),
            "{e}"
        );
    }
}
