//! The HTTP surface of a worker and its front doors: REST (the endpoints at `/`,
//! `root.rs`, and the Open Inference Protocol, `v2/`), OpenAI's embeddings API
//! (`openai/`), the rerank, score and classify APIs (`rerank/`), TorchServe's inference API
//! (`torchserve/`) and KServe's v1 predict (`kserve/`), on shared plumbing: dispatch
//! (`dispatch.rs`, the hyper service), what a
//! handler answers (`answer.rs`) and reads of a request (`request.rs`). Each door parses its
//! wire format and writes its answer; the inference between (admission, deadlines, the pass,
//! the retire policy) is the core's (`infer/`), as for gRPC. Errors come from the table in
//! `error.rs`; bodies are decoded by `decode/`.

pub mod answer;
pub mod body_kind;
pub mod dispatch;
pub mod kserve;
pub mod openai;
pub mod request;
pub mod rerank;
pub mod root;
pub mod torchserve;
pub mod v2;
