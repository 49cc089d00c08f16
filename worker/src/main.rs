//! `app-worker`: one model, one inherited listening socket, HTTP until retired. Started by
//! the master (the contract is `vramfork::protocol`): by exec, as the template that forks
//! workers (`template.rs`), or forked from that template. The start-up itself is `boot.rs`.

mod app;
mod args;
mod boot;
mod closes;
mod config;
mod conn;
mod control;
mod cuda;
mod decode;
mod documents;
mod error;
mod exported;
#[cfg(test)]
mod fuzz;
mod grpc;
mod head;
mod heap;
mod heartbeat;
mod http;
mod hw;
mod infer;
mod lifecycle;
mod listen_queue;
mod listener;
mod memory;
mod metrics;
mod model;
mod model_archive;
mod observe;
mod outgoing;
mod parent_watch;
mod process;
mod report;
mod request_id;
mod runner;
mod server;
mod shim;
mod siblings;
mod state;
mod template;
mod timeouts;
mod watchdog;

use vramfork::protocol::ENV_TEMPLATE;

/// Request-sized buffers go back to the system when freed (`heap.rs`).
#[global_allocator]
static ALLOCATOR: heap::RequestMemory = heap::RequestMemory;

fn main() {
    let process_ms = process::ms_since_exec();
    process::ignore_usr_signals();
    let code = if std::env::var_os(ENV_TEMPLATE).is_some_and(|v| v == "1") {
        match template::run(process_ms) {
            template::Ended::Exit(code) => code,
            // A process forked from the template, the template's state left behind.
            template::Ended::Worker(child) => match child.into_worker() {
                Ok((cfg, metadata, model)) => boot::status(boot::boot(
                    cfg,
                    metadata,
                    process::ms_since_exec(),
                    Some(model),
                )),
                Err(code) => code,
            },
        }
    } else {
        boot::exec(process_ms)
    };
    process::exit_now(code);
}
