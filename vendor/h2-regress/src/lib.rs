//! Nothing here: this package holds the regression tests of our changes to the vendored
//! `h2` (`tests/goaway_window_update.rs`, `tests/control_frame_budget.rs`, and
//! `tests/patches.rs`, which checks `vendor/h2` against `vendor/patches/`; `vendor/README.md`).
//! Inside this workspace they run against `vendor/h2` (the root `Cargo.toml`'s
//! `[patch.crates-io]`); copied out of it, against crates.io's `h2`, where the first two fail
//! until an h2 release makes the same changes.
