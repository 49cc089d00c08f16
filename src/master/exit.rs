//! The exit statuses of `app`, in one table. A systemd unit lists 2, 3
//! and 5 in `RestartPreventExitStatus=` (they do not heal by restarting).

/// Clean stop (TERM, INT, QUIT; `app plan`).
pub const OK: i32 = 0;
/// Usage or configuration error before any worker starts: bad flag, bad environment value,
/// bad metadata, port in use, model does not fit; a plan that puts workers on GPUs with
/// PyTorch's caching allocator turned off (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`: no cap).
pub const CONFIG: i32 = 2;
/// The model could not be loaded by the first workers.
pub const MODEL_LOAD: i32 = 3;
/// Workers kept dying (or none was ready for `--boot-timeout`) and the service gave up.
pub const GAVE_UP: i32 = 4;
/// A worker the plan placed on a GPU came up without CUDA: the machine cannot serve on its
/// GPUs as planned (driver, container devices, libtorch build). Serving on the CPU instead
/// is never done silently: `--device cpu` says so. (A worker whose allocator cap cannot be
/// set fails its load — worker exit 3, a failed boot — and never runs uncapped: with no
/// worker ever ready that is [`MODEL_LOAD`].)
pub const NO_CUDA: i32 = 5;

#[cfg(test)]
mod tests {
    use crate::protocol::worker_exit;

    /// The statuses in docs/options.md's two tables (`app`'s, then the workers'), in order.
    fn documented() -> (Vec<i32>, Vec<i32>) {
        let page = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/options.md"),
        )
        .unwrap();
        let statuses = |from: &str| -> Vec<i32> {
            let table = &page[page.find(from).unwrap()..];
            table
                .lines()
                .skip(2)
                .take_while(|l| l.starts_with("| "))
                .map(|l| l[2..].split(' ').next().unwrap().parse().unwrap())
                .collect()
        };
        (
            statuses("| status | meaning |"),
            statuses("| worker status | meaning |"),
        )
    }

    /// docs/options.md lists exactly the statuses `app` and its workers exit with.
    #[test]
    fn the_exit_status_tables_are_exactly_the_codes() {
        let (app, worker) = documented();
        assert_eq!(
            app,
            [
                super::OK,
                super::CONFIG,
                super::MODEL_LOAD,
                super::GAVE_UP,
                super::NO_CUDA
            ]
        );
        assert_eq!(
            worker,
            [
                worker_exit::OK,
                worker_exit::CONFIG,
                worker_exit::MODEL_LOAD,
                worker_exit::CUDA_FATAL,
                worker_exit::TEMPLATE_UNFIT,
                worker_exit::NO_CUDA
            ]
        );
    }
}
