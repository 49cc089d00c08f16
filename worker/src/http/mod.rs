//! The HTTP surface of a worker: dispatch (`dispatch.rs`, the hyper service), what a handler
//! answers (`answer.rs`) and reads of a request (`request.rs`), the one inference pipeline
//! both protocols share with its 503/504/507 and retire policy (`pipeline.rs`), the
//! endpoints at `/` (`root.rs`) and the Open Inference Protocol (`v2/`) and OpenAI's embeddings API (`openai/`). Errors come from the
//! table in `error.rs`; bodies are decoded by `decode/`.

pub mod answer;
pub mod body_kind;
pub mod deadline;
pub mod dispatch;
pub mod openai;
pub mod pipeline;
pub mod request;
pub mod root;
pub mod v2;
